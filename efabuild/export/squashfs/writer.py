"""The child's metadata: inode table, directory table, fragment, export and id tables, superblock.

Written anew from the tree after the data. Deterministic: inodes are numbered in one fixed walk
(each directory's entries in byte order, subdirectories before the directory itself, as
mksquashfs writes them, the root last), a hard-linked inode once, where the walk first meets it;
directory entries are sorted by name bytes, as mksquashfs sorts them.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

import attrs

from efabuild.export.squashfs import metadata, superblock as sb_mod
from efabuild.export.squashfs.codec import Codec
from efabuild.export.squashfs.inodes import encode
from efabuild.export.squashfs.superblock import NONE, Superblock
from efabuild.export.squashfs.tree import DIR, Node

_DIR_HEADER = struct.Struct("<III")
_DIR_ENTRY = struct.Struct("<HhHH")
_PAD = 4096  # mksquashfs pads the image to 4 KiB: a loop device reads whole blocks


def _order(root: Node) -> tuple[list[Node], dict[int, int], dict[int, int], dict[int, int]]:
    """The inodes in write order; by id: inode number, link count, parent's node id."""
    order: list[Node] = []
    numbers: dict[int, int] = {}
    links: dict[int, int] = {}
    parents: dict[int, int] = {}
    stack: list[tuple[Node, list[bytes]]] = [(root, sorted(root.children or {}, reverse=True))]
    while stack:
        directory, names = stack[-1]
        if not names:
            stack.pop()
            order.append(directory)
            numbers[id(directory)] = len(order)
            continue
        child = directory.children[names.pop()]  # type: ignore[index]
        if child.is_dir:
            parents[id(child)] = id(directory)
            links[id(directory)] = links.get(id(directory), 2) + 1
            stack.append((child, sorted(child.children or {}, reverse=True)))
        elif id(child) not in numbers:
            order.append(child)
            numbers[id(child)] = len(order)
            links[id(child)] = 1
        else:
            links[id(child)] += 1
    return order, numbers, links, parents


def _listing(directory: Node, refs: dict[int, int], numbers: dict[int, int]) -> tuple[bytes, list[tuple[int, bytes]]]:
    """The directory's entries and its name index, split as mksquashfs splits them: a new header
    for every 256 entries, a change of inode block or an inode number out of 16-bit reach, and
    where the listing passes 8 KiB since the last index point (which is then indexed)."""
    out = bytearray()
    index: list[tuple[int, bytes]] = []  # (offset of the header in the listing, its first name)
    header_at: int | None = None
    count, base, block, indexed = 256, 0, 0, 0
    for name in sorted(directory.children or {}):
        node = directory.children[name]  # type: ignore[index]
        ref, number = refs[id(node)], numbers[id(node)]
        passes = header_at is not None and len(out) + 8 + len(name) - indexed > metadata.BLOCK
        if count == 256 or ref >> 16 != block or passes or not -32768 <= number - base <= 32767:
            if header_at is not None:
                if passes:
                    index.append((len(out), name))
                    indexed = len(out)
                out[header_at : header_at + 12] = _DIR_HEADER.pack(count - 1, block, base)
            header_at, count, base, block = len(out), 0, number, ref >> 16
            out += bytes(12)
        out += _DIR_ENTRY.pack(ref & 0xFFFF, number - base, node.kind, len(name) - 1) + name
        count += 1
    if header_at is not None:
        out[header_at : header_at + 12] = _DIR_HEADER.pack(count - 1, block, base)
    return bytes(out), index


@attrs.frozen
class Tables:
    superblock: Superblock
    end: int  # bytes used


def write_tables(f: BinaryIO, at: int, root: Node, ancestor: Superblock, codec: Codec | None,
                 fragments: list[tuple[int, int]]) -> Tables:
    """Write the tables at `at` of `f` and the superblock at 0; returns it and the bytes used."""
    order, numbers, links, parents = _order(root)
    def coded(flag: int) -> Codec | None:  # -noI, -noF, -noId: those tables stay uncompressed
        return None if ancestor.has(flag) else codec

    inodes = metadata.Writer(coded(sb_mod.UNCOMPRESSED_INODES))
    dirs = metadata.Writer(coded(sb_mod.UNCOMPRESSED_INODES))
    refs: dict[int, int] = {}
    count = len(order)
    for node in order:
        if node.kind == DIR:
            listing, names = _listing(node, refs, numbers)
            block, offset = dirs.ref()
            listed_at = dirs.written
            dirs.write(listing)
            index = [(pos, dirs.block_of(listed_at + pos), name) for pos, name in names]
            parent = numbers[parents[id(node)]] if id(node) in parents else count + 1
            raw = encode(node, numbers[id(node)], links.get(id(node), 2), parent, (block, offset, len(listing) + 3),
                         index)
        else:
            raw = encode(node, numbers[id(node)], links[id(node)])
        block, offset = inodes.ref()
        refs[id(node)] = (block << 16) | offset
        inodes.write(raw)
    inode_table = inodes.finish()
    dir_table = dirs.finish()
    pos = at
    f.seek(pos)
    parts = [inode_table, dir_table]
    inode_start, dir_start = pos, pos + len(inode_table)
    pos = dir_start + len(dir_table)
    frag_entries = b"".join(struct.pack("<QII", start, size, 0) for start, size in fragments)
    frag_bytes, frag_start = metadata.write_table(frag_entries, 16, pos, coded(sb_mod.UNCOMPRESSED_FRAGMENTS))
    parts.append(frag_bytes)
    pos += len(frag_bytes)
    export_start = NONE
    if ancestor.export_table != NONE:
        export_entries = b"".join(struct.pack("<Q", refs[id(node)]) for node in order)
        export_bytes, export_start = metadata.write_table(export_entries, 8, pos, coded(sb_mod.UNCOMPRESSED_INODES))
        parts.append(export_bytes)
        pos += len(export_bytes)
    id_bytes, id_start = metadata.write_table(struct.pack("<I", 0), 4, pos, coded(sb_mod.UNCOMPRESSED_IDS))
    parts.append(id_bytes)
    pos += len(id_bytes)
    for part in parts:
        f.write(part)
    f.write(b"\0" * (-pos % _PAD))
    superblock = attrs.evolve(
        ancestor, inode_count=count, fragment_count=len(fragments), id_count=1, root_inode=refs[id(root)],
        bytes_used=pos, id_table=id_start, xattr_table=NONE, inode_table=inode_start,
        directory_table=dir_start, fragment_table=frag_start, export_table=export_start,
        flags=ancestor.flags | sb_mod.NO_XATTRS)
    f.seek(0)
    f.write(superblock.pack())
    return Tables(superblock, pos)
