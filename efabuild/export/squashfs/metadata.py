"""Metadata blocks: the 8 KiB units the inode, directory, fragment, export and id tables are made of.

On disk each is a 16-bit header (bit 15: stored uncompressed; the rest: its length) and its bytes;
a reference to a place in a table is (the block's offset from the table's start, the offset in
the block's 8 KiB). Reading is bounded: at most `MAX_TABLE` decompressed bytes per table, each
block at most 8 KiB, every offset checked against the region it must lie in.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

from efabuild.errors import InputError
from efabuild.export.squashfs.codec import Codec

BLOCK = 8192
UNCOMPRESSED = 0x8000
MAX_TABLE = 512 << 20  # a training image's inode table is tens of MiB; more is forged


class Region:
    """The decoded blocks of one table, [start, end) of the file: refs resolve into `data`."""

    def __init__(self, f: BinaryIO, start: int, end: int, codec: Codec | None, what: str) -> None:
        self.what = what
        if end - start > MAX_TABLE:
            raise InputError(f"the {what} spans {end - start} bytes, more than {MAX_TABLE} bytes")
        f.seek(start)
        raw = f.read(end - start)
        if len(raw) != end - start:
            raise InputError(f"the {what} ends past the end of the file")
        parts: list[bytes] = []
        self.starts: dict[int, int] = {}  # block offset from `start` → offset in `data`
        pos = total = 0
        while pos < len(raw):
            self.starts[pos] = total
            block, pos = read_block(raw, pos, codec, what)
            if len(block) != BLOCK and pos < len(raw):
                raise InputError(f"the {what} has a short block before its last")
            total += len(block)
            if total > MAX_TABLE:
                raise InputError(f"the {what} expands past {MAX_TABLE} bytes")
            parts.append(block)
        self.data = b"".join(parts)

    def offset(self, block: int, offset: int) -> int:
        """The position in `data` of the reference (block, offset)."""
        base = self.starts.get(block)
        if base is None or offset >= BLOCK or base + offset > len(self.data):
            raise InputError(f"a reference into the {self.what} points at no block (block {block}, offset {offset})")
        return base + offset

    def take(self, pos: int, n: int) -> bytes:
        if n < 0 or pos + n > len(self.data):
            raise InputError(f"an entry runs past the end of the {self.what}")
        return self.data[pos : pos + n]

    def unpack(self, layout: struct.Struct, pos: int) -> tuple:
        """The fields of `layout` at `pos`: take() and unpack without the copy (20k inodes of an
        ancestor are read on every incremental export)."""
        if pos < 0 or pos + layout.size > len(self.data):
            raise InputError(f"an entry runs past the end of the {self.what}")
        return layout.unpack_from(self.data, pos)


def read_block(raw: bytes, pos: int, codec: Codec | None, what: str) -> tuple[bytes, int]:
    """The block whose header is at raw[pos], decompressed, and the position after it."""
    if pos + 2 > len(raw):
        raise InputError(f"the {what} ends inside a block header")
    (header,) = struct.unpack_from("<H", raw, pos)
    length = header & ~UNCOMPRESSED
    body = raw[pos + 2 : pos + 2 + length]
    if length == 0 or len(body) != length:
        raise InputError(f"the {what} has a block of {length} bytes past its end")
    if header & UNCOMPRESSED:
        return body, pos + 2 + length
    if codec is None:
        raise InputError(f"the {what} has a compressed block and no codec")
    return codec.decompress(body, BLOCK), pos + 2 + length


def read_table(f: BinaryIO, start: int, count: int, entry: int, end: int, codec: Codec | None,
               what: str) -> bytes:
    """The `count` fixed-size entries of an indexed table (fragment, export, id) whose index of
    block offsets sits at `start` and whose blocks lie before `end`."""
    out: list[bytes] = []
    for where in table_index(f, start, count, entry, end, what):
        if where >= start:
            raise InputError(f"the {what}'s index points past the table")
        f.seek(where)
        raw = f.read(2 + 0x7FFF)
        out.append(read_block(raw, 0, codec, what)[0])
    data = b"".join(out)
    if len(data) < count * entry:
        raise InputError(f"the {what} holds fewer than its {count} entries")
    return data[: count * entry]


def table_index(f: BinaryIO, start: int, count: int, entry: int, end: int, what: str) -> list[int]:
    """The offsets of the blocks of an indexed table of `count` entries."""
    if count * entry > MAX_TABLE:
        raise InputError(f"the {what} would hold {count} entries, more than {MAX_TABLE} bytes")
    blocks = -(-count * entry // BLOCK)
    f.seek(start)
    index = f.read(8 * blocks)
    if len(index) != 8 * blocks or start + 8 * blocks > end:
        raise InputError(f"the {what}'s index runs past the end of the image")
    return [where for (where,) in struct.iter_unpack("<Q", index)]


class Writer:
    """Appends bytes to a table being written; `ref()` is where the next byte will be."""

    def __init__(self, codec: Codec | None) -> None:
        self.codec = codec
        self.out = bytearray()  # the finished blocks, on-disk form
        self.pending = bytearray()
        self.starts: list[int] = []  # where each finished block begins in `out`
        self.written = 0  # bytes written, uncompressed

    def ref(self) -> tuple[int, int]:
        """(block offset from the table's start, offset in that block) of the next byte."""
        return len(self.out), len(self.pending)

    def block_of(self, position: int) -> int:
        """The block offset (from the table's start) of uncompressed byte `position` so far."""
        k = position // BLOCK
        return self.starts[k] if k < len(self.starts) else len(self.out)

    def write(self, data: bytes) -> None:
        self.written += len(data)
        self.pending += data
        while len(self.pending) >= BLOCK:
            self._emit(bytes(self.pending[:BLOCK]))
            del self.pending[:BLOCK]

    def _emit(self, block: bytes) -> None:
        self.starts.append(len(self.out))
        packed = self.codec.compress_metadata(block) if self.codec is not None else None
        if packed is None:
            self.out += struct.pack("<H", len(block) | UNCOMPRESSED) + block
        else:
            self.out += struct.pack("<H", len(packed)) + packed

    def finish(self) -> bytes:
        if self.pending:
            self._emit(bytes(self.pending))
            self.pending.clear()
        return bytes(self.out)


def write_table(entries: bytes, entry: int, at: int, codec: Codec | None) -> tuple[bytes, int]:
    """An indexed table placed at file offset `at`: its blocks, then their index; returns the
    bytes and the index's offset (what the superblock points at)."""
    blocks, index = bytearray(), bytearray()
    per = BLOCK // entry * entry
    for pos in range(0, len(entries), per):
        index += struct.pack("<Q", at + len(blocks))
        one = Writer(codec)
        one.write(entries[pos : pos + per])
        blocks += one.finish()
    return bytes(blocks + index), at + len(blocks)
