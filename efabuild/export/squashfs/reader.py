"""An ancestor `.sqsh` read into a `tree.Node` tree: where each file's blocks lie, not their bytes.

Reads the superblock, the id, fragment and export tables, and the whole inode and directory
tables (compressed metadata, a few MiB for 20k files); no data block is read. Anything that does
not add up (an offset outside its region, a directory listing pointing at a missing inode, a
directory reached twice, a name with a slash) is a one-line InputError; what is valid squashfs
but not what an export writes (owners other than root, extended attributes, a codec not here) is
`Unsupported`, and the caller exports in full.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import BinaryIO

import attrs

from efabuild.errors import InputError
from efabuild.export.squashfs import superblock as sb_mod
from efabuild.export.squashfs.codec import XZ, Codec, codec_for
from efabuild.export.squashfs.inodes import decode
from efabuild.export.squashfs.metadata import Region, read_block, read_table, table_index
from efabuild.export.squashfs.superblock import NONE, Superblock
from efabuild.export.squashfs.tree import DIR, FILE, KIND_NAMES, NO_FRAGMENT, Node, Unsupported

_DIR_HEADER = struct.Struct("<III")
_DIR_ENTRY = struct.Struct("<HhHH")
SIZE_MASK = 0xFFFFFF  # a block's stored size; bit 24 says it is stored uncompressed
UNCOMPRESSED_BLOCK = 1 << 24


@attrs.frozen
class Ancestor:
    path: Path
    sb: Superblock
    codec: Codec
    data_start: int  # after the superblock and the compressor options
    root: Node
    fragments: tuple[tuple[int, int], ...]  # (start, stored size word) by index
    file_size: int

    @property
    def data_end(self) -> int:
        """The end of its data and fragment blocks: the prefix a child copies."""
        return self.sb.inode_table


def read_ancestor(path: Path) -> Ancestor:
    where = str(path)
    try:
        with open(path, "rb") as f:
            return _read(f, path, os.fstat(f.fileno()).st_size)
    except InputError as exc:
        raise InputError(exc.problem, exc.where or where) from None
    except OSError as exc:
        raise InputError(f"cannot read it: {exc.strerror}", where) from None


def read_ahead(path: Path) -> Callable[[], Ancestor]:
    """read_ancestor(path) begun on a thread of its own, for a caller with other waits first (an
    engine's answers, a listing): called, it gives that Ancestor or raises what read_ancestor
    raised. The thread is a daemon: a caller that needs no ancestor after all does not wait."""
    read: Future = Future()

    def run() -> None:
        try:
            read.set_result(read_ancestor(path))
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            read.set_exception(exc)

    threading.Thread(target=run, name="read-ancestor", daemon=True).start()
    return read.result


def _read(f: BinaryIO, path: Path, file_size: int) -> Ancestor:
    sb = sb_mod.parse(f.read(sb_mod.SIZE), file_size, str(path))
    if sb.xattr_table != NONE:
        raise Unsupported("it has extended attributes")
    data_start, xz_dict = sb_mod.SIZE, None
    if sb.has(sb_mod.COMPRESSOR_OPTIONS):
        options, data_start = read_block(f.read(2 + 0x7FFF), 0, None, "compressor options")
        data_start += sb_mod.SIZE
        if sb.compressor == XZ and len(options) >= 4:
            xz_dict = struct.unpack_from("<I", options)[0]
    codec = codec_for(sb.compressor, block_size=sb.block_size, xz_dict=xz_dict)
    if isinstance(codec, str):
        raise Unsupported(f"compressor {codec}")
    tables_end = _tables_end(f, sb)
    ids = read_table(f, sb.id_table, sb.id_count, 4, sb.bytes_used, codec, "id table")
    if set(struct.unpack(f"<{sb.id_count}I", ids)) != {0}:
        raise Unsupported("it has owners other than root (made without -all-root)")
    fragments = _fragments(f, sb, codec, data_start)
    inodes = Region(f, sb.inode_table, sb.directory_table, codec, "inode table")
    dirs = Region(f, sb.directory_table, tables_end, codec, "directory table")
    root = _Tree(sb, inodes, dirs, data_start, fragments).read()
    return Ancestor(path, sb, codec, data_start, root, fragments, file_size)


def _tables_end(f: BinaryIO, sb: Superblock) -> int:
    """Where the directory table ends: at the first block of the next table."""
    firsts = [sb.bytes_used]
    for start, count, entry in ((sb.fragment_table, sb.fragment_count, 16), (sb.id_table, sb.id_count, 4),
                                (sb.export_table, sb.inode_count, 8)):
        if start != NONE and count:
            firsts.append(table_index(f, start, count, entry, sb.bytes_used, "table")[0])
    return min((first for first in firsts if first > sb.directory_table), default=sb.bytes_used)


def _fragments(f: BinaryIO, sb: Superblock, codec: Codec, data_start: int) -> tuple[tuple[int, int], ...]:
    if not sb.fragment_count:
        return ()
    raw = read_table(f, sb.fragment_table, sb.fragment_count, 16, sb.bytes_used, codec, "fragment table")
    out = []
    for index, (start, size, _unused) in enumerate(struct.iter_unpack("<QII", raw)):
        stored = size & SIZE_MASK
        if start < data_start or start + stored > sb.inode_table or stored > sb.block_size + 4096:
            raise InputError(f"fragment {index} lies outside the data region")
        out.append((start, size))
    return tuple(out)


class _Tree:
    """The directory walk from the root inode, each inode decoded once (hard links share it)."""

    def __init__(self, sb: Superblock, inodes: Region, dirs: Region, data_start: int,
                 fragments: tuple[tuple[int, int], ...]) -> None:
        self.sb, self.inodes, self.dirs = sb, inodes, dirs
        self.data_start, self.nfrag = data_start, len(fragments)
        self.nodes: dict[int, Node] = {}  # inode ref → its node

    def read(self) -> Node:
        root, listing = self._inode(self.sb.root_inode)
        if not root.is_dir or listing is None:
            raise InputError("the root inode is not a directory")
        pending = [(root, listing)]
        while pending:
            directory, listing = pending.pop()
            for name, ref, kind in self._listing(*listing):
                if ref in self.nodes and kind == DIR:
                    raise InputError(f"directory {name!r} is reached twice (a loop)")
                node, sub = (self.nodes[ref], None) if ref in self.nodes else self._inode(ref)
                if node.kind != kind:
                    raise InputError(f"entry {name!r} says {KIND_NAMES.get(kind, kind)}, "
                                     f"its inode is a {KIND_NAMES[node.kind]}")
                if name in directory.children:  # type: ignore[operator]
                    raise InputError(f"name {name!r} appears twice in one directory")
                directory.children[name] = node  # type: ignore[index]
                if sub is not None:
                    pending.append((node, sub))
        return root

    def _inode(self, ref: int) -> tuple[Node, tuple[int, int, int] | None]:
        pos = self.inodes.offset(ref >> 16, ref & 0xFFFF)
        got = decode(self.inodes, pos, block_size=self.sb.block_size, fragments=self.nfrag, id_count=self.sb.id_count)
        node = got.node
        if node.kind == FILE:
            self._check_blocks(node, got.number)
        self.nodes[ref] = node
        return node, got.listing

    def _check_blocks(self, node: Node, number: int) -> None:
        if node.blocks:  # most files of an image are smaller than a block: a fragment only
            stored = sum(size & SIZE_MASK for (size,) in struct.iter_unpack("<I", node.blocks))
            if not (self.data_start <= node.blocks_start and node.blocks_start + stored <= self.sb.inode_table):
                raise InputError(f"inode {number}'s blocks lie outside the data region")
        if node.fragment == NO_FRAGMENT and node.size and not node.blocks:
            raise InputError(f"inode {number} has data but no blocks")

    def _listing(self, block: int, offset: int, size: int) -> list[tuple[bytes, int, int]]:
        """(name, inode ref, basic type) of each entry of the listing at (block, offset)."""
        if size < 3:
            raise InputError(f"a directory listing of size {size}")
        if size == 3:
            return []
        pos = self.dirs.offset(block, offset)
        end = pos + size - 3
        out: list[tuple[bytes, int, int]] = []
        while pos < end:
            count, start, _number = self.dirs.unpack(_DIR_HEADER, pos)
            pos += _DIR_HEADER.size
            if count >= 256:
                raise InputError(f"a directory header of {count + 1} entries")
            for _ in range(count + 1):
                ioff, _delta, kind, nlen = self.dirs.unpack(_DIR_ENTRY, pos)
                name = self.dirs.take(pos + _DIR_ENTRY.size, nlen + 1)
                pos += _DIR_ENTRY.size + nlen + 1
                if b"/" in name or b"\0" in name or name in (b".", b".."):
                    raise InputError(f"a directory entry named {name!r}")
                out.append((name, (start << 16) | ioff, kind))
        if pos != end:
            raise InputError("a directory listing does not end where its inode says")
        return out
