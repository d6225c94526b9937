"""The ancestor's hard links to the files Enroot writes, which its `.sqsh` no longer shows as links.

A full export writes `/etc/environment` & co. from the config at every path that was a hard link
to them in the image (Enroot rewrites the shared inode in place); in the ancestor's `.sqsh` those
paths are plain files with the same bytes, time and mode as the written one. When the child's
text or mode of a written file differs from the ancestor's, such a file would have to change too,
and nothing tells an alias from a copy: the child is then left to a full export. Only files of
that size, time and mode are read, so the check costs a few small reads.
"""

from __future__ import annotations

import struct

from efabuild.export.squashfs.reader import SIZE_MASK, UNCOMPRESSED_BLOCK, Ancestor
from efabuild.export.squashfs.tree import FILE, NO_FRAGMENT, Node, walk

MAX_TEXT = 1 << 20  # Enroot's written files are a few KiB


def read_file(parent: Ancestor, node: Node) -> bytes:
    """The bytes of a small file of the ancestor (its blocks and its fragment tail)."""
    bs = parent.sb.block_size
    out: list[bytes] = []
    with open(parent.path, "rb") as f:
        pos = node.blocks_start
        for (word,) in struct.iter_unpack("<I", node.blocks):
            stored = word & SIZE_MASK
            f.seek(pos)
            raw = f.read(stored)
            pos += stored
            out.append(bytes(bs) if not stored else raw if word & UNCOMPRESSED_BLOCK else parent.codec.decompress(raw, bs))
        if node.fragment != NO_FRAGMENT and node.fragment < len(parent.fragments):
            start, word = parent.fragments[node.fragment]
            f.seek(start)
            raw = f.read(word & SIZE_MASK)
            block = raw if word & UNCOMPRESSED_BLOCK else parent.codec.decompress(raw, bs)
            out.append(block[node.fragment_offset : node.fragment_offset + node.size % bs])
    return b"".join(out)[: node.size]


def stale_alias(parent: Ancestor, root: Node, before: dict[str, Node], after: dict[str, tuple[bytes, int]]) -> str:
    """Why the child needs a full export: a file that may be an alias of a written file whose
    text or mode changes; "" when there is none. `before`: the ancestor's written files by path;
    `after`: the child's (text, mode) by path."""
    suspects = []
    for path, old in sorted(before.items()):
        if path in after and old.size <= MAX_TEXT:
            text = read_file(parent, old)
            if (text, old.mode) != after[path]:
                suspects.append((path, old, text))
    if not suspects:
        return ""
    for where, node in walk(root):
        for path, old, text in suspects:
            if (node is not old and node.kind == FILE and (node.size, node.mtime, node.mode) == (len(text), old.mtime, old.mode)
                    and read_file(parent, node) == text):
                return (f"/{where.decode('utf-8', 'surrogateescape')} has the bytes, time and mode of /{path}: it may "
                        f"be a hard link to it in the image, which the child's new /{path} would change too")
    return ""
