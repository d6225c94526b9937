"""The squashfs 4.0 superblock: the 96 bytes at offset 0 that locate every table.

Pure: bytes in, checked values out. Every offset is checked against the file's size before
anything is read at it, so a forged superblock gives one line, not a huge read.
"""

from __future__ import annotations

import struct

import attrs

from efabuild.errors import InputError

MAGIC = 0x73717368
SIZE = 96
NONE = 0xFFFFFFFFFFFFFFFF  # a table that is absent
MAX_FRAGMENTS = 1 << 22  # 512 GiB of 128 KiB fragment blocks: more than any image holds
_FORMAT = struct.Struct("<IIIIIHHHHHHQQQQQQQQ")

UNCOMPRESSED_INODES = 0x0001
UNCOMPRESSED_DATA = 0x0002
UNCOMPRESSED_FRAGMENTS = 0x0008
NO_FRAGMENTS = 0x0010
ALWAYS_FRAGMENTS = 0x0020
EXPORTABLE = 0x0080
NO_XATTRS = 0x0200
COMPRESSOR_OPTIONS = 0x0400
UNCOMPRESSED_IDS = 0x0800


@attrs.frozen
class Superblock:
    inode_count: int
    mkfs_time: int
    block_size: int
    fragment_count: int
    compressor: int
    block_log: int
    flags: int
    id_count: int
    root_inode: int
    bytes_used: int
    id_table: int
    xattr_table: int
    inode_table: int
    directory_table: int
    fragment_table: int
    export_table: int

    def pack(self) -> bytes:
        return _FORMAT.pack(MAGIC, self.inode_count, self.mkfs_time, self.block_size, self.fragment_count,
                            self.compressor, self.block_log, self.flags, self.id_count, 4, 0, self.root_inode,
                            self.bytes_used, self.id_table, self.xattr_table, self.inode_table,
                            self.directory_table, self.fragment_table, self.export_table)

    def has(self, flag: int) -> bool:
        return bool(self.flags & flag)


def parse(raw: bytes, file_size: int, where: str) -> Superblock:
    """The superblock of a file of `file_size` bytes; InputError naming `where` if it is not one."""
    if len(raw) < SIZE:
        raise InputError(f"not a squashfs image: {len(raw)} bytes, shorter than a superblock", where)
    (magic, inodes, mtime, block_size, frags, comp, block_log, flags, ids, major, minor, root, used,
     id_table, xattr_table, inode_table, dir_table, frag_table, export_table) = _FORMAT.unpack(raw[:SIZE])
    if magic != MAGIC:
        raise InputError("not a squashfs image (bad magic)", where)
    if (major, minor) != (4, 0):
        raise InputError(f"squashfs {major}.{minor}, not 4.0", where)
    if not 4096 <= block_size <= 1 << 20 or block_size != 1 << block_log:
        raise InputError(f"the superblock's block size {block_size} is not a power of two in 4 KiB..1 MiB", where)
    if used > file_size:
        raise InputError(f"the superblock says {used} bytes, the file has {file_size} (truncated?)", where)
    starts = [("inode table", inode_table), ("directory table", dir_table), ("id table", id_table)]
    if frag_table != NONE:
        starts.append(("fragment table", frag_table))
    if export_table != NONE:
        starts.append(("export table", export_table))
    for name, start in starts:
        if not SIZE <= start < used:
            raise InputError(f"the superblock's {name} offset {start} lies outside the image's {used} bytes", where)
    if not inode_table < dir_table:
        raise InputError("the superblock's inode table does not come before its directory table", where)
    if not 1 <= ids <= 65536:
        raise InputError(f"the superblock names {ids} owner ids", where)
    # an inode takes at least 16 bytes, a fragment entry 16: counts the tables cannot hold are forged
    if inodes < 1 or inodes > (dir_table - inode_table) * 8192 // 32 + 1:
        raise InputError(f"the superblock's inode count {inodes} does not fit its inode table", where)
    if frags > min(file_size // 2 * 512, MAX_FRAGMENTS):
        raise InputError(f"the superblock's fragment count {frags} does not fit the image", where)
    return Superblock(inodes, mtime, block_size, frags, comp, block_log, flags, ids, root, used, id_table,
                      xattr_table, inode_table, dir_table, frag_table, export_table)
