"""New file data, appended after the ancestor's blocks: full blocks, then tails packed in fragments.

As mksquashfs lays them out for the ancestor's flags: a block is stored uncompressed when the
image was made with -noD (or when compressing does not make it smaller), a file's tail goes to a
fragment block when the file is smaller than a block (or with -always-use-fragments), and never
with -no-fragments. A file's blocks are contiguous: fragments are flushed between files only.
The caller decides the order files are written in (apply.py: the merged tree's, by path).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import BinaryIO

from efabuild.export.squashfs import superblock as sb
from efabuild.export.squashfs.codec import Codec
from efabuild.export.squashfs.reader import UNCOMPRESSED_BLOCK
from efabuild.export.squashfs.tree import FILE, Node


class DataWriter:
    """Writes blocks at `pos` of `f` and records new fragment blocks in `fragments`."""

    def __init__(self, f: BinaryIO, pos: int, superblock: sb.Superblock, codec: Codec,
                 fragments: list[tuple[int, int]]) -> None:
        self.f, self.pos, self.codec = f, pos, codec
        self.block_size = superblock.block_size
        self.compress_data = not superblock.has(sb.UNCOMPRESSED_DATA)
        self.compress_fragments = not superblock.has(sb.UNCOMPRESSED_FRAGMENTS)
        self.use_fragments = not superblock.has(sb.NO_FRAGMENTS)
        self.always_fragments = superblock.has(sb.ALWAYS_FRAGMENTS)
        self.fragments = fragments
        self.pending = bytearray()  # the fragment block being filled
        self.files = 0
        f.seek(pos)

    def add_file(self, read: Callable[[int], bytes], size: int, mode: int, mtime: int) -> Node:
        """A regular file of `size` bytes read from `read(n)`, as a new inode."""
        return self.fill(Node(FILE, mode, mtime, size=size), read)

    def fill(self, node: Node, read: Callable[[int], bytes]) -> Node:
        """Write the `node.size` bytes `read(n)` gives as the data of the file inode `node`."""
        bs, size = self.block_size, node.size
        tail = size % bs
        to_fragment = bool(tail) and self.use_fragments and (self.always_fragments or size < bs)
        full = size // bs + (1 if tail and not to_fragment else 0)
        node.blocks_start = self.pos if full else 0
        sizes = []
        for _ in range(full):
            sizes.append(self._block(read(bs), self.compress_data))
        node.blocks = struct.pack(f"<{len(sizes)}I", *sizes)
        if to_fragment:
            data = read(tail)
            if len(self.pending) + len(data) > bs:
                self.flush()
            node.fragment, node.fragment_offset = len(self.fragments), len(self.pending)
            self.pending += data
        self.files += 1
        return node

    def add_bytes(self, data: bytes, mode: int, mtime: int) -> Node:
        view = memoryview(data)
        pos = [0]

        def read(n: int) -> bytes:
            piece = bytes(view[pos[0] : pos[0] + n])
            pos[0] += len(piece)
            return piece

        return self.add_file(read, len(data), mode, mtime)

    def _block(self, data: bytes, compress: bool) -> int:
        """Write one block; its size word (bit 24: stored uncompressed)."""
        packed = self.codec.compress(data) if compress else None
        if packed is None:
            self.f.write(data)
            self.pos += len(data)
            return len(data) | UNCOMPRESSED_BLOCK
        self.f.write(packed)
        self.pos += len(packed)
        return len(packed)

    def flush(self) -> None:
        """Write the pending fragment block, if any."""
        if not self.pending:
            return
        start = self.pos
        size = self._block(bytes(self.pending), self.compress_fragments)
        self.fragments.append((start, size))
        self.pending.clear()
