"""Inodes in the inode table: decoded from an ancestor's, encoded for the child's.

Every inode type mksquashfs writes, basic and extended. The child's inodes are written anew
(only their blocks are the ancestor's), the basic form wherever it can hold the inode, as
mksquashfs chooses: an extended file for more than 4 GiB, a start past 4 GiB, sparse blocks or
hard links; an extended directory, with its name index, for a listing over 8 KiB or 64 KiB.
"""

from __future__ import annotations

import struct

import attrs

from efabuild.errors import InputError
from efabuild.export.squashfs.metadata import Region
from efabuild.export.squashfs.tree import DIR, FILE, NO_FRAGMENT, SYMLINK, Node, Unsupported

NO_XATTR = 0xFFFFFFFF
_HEADER = struct.Struct("<HHHHII")
_BASIC_DIR = struct.Struct("<IIHHI")
_EXT_DIR = struct.Struct("<IIIIHHI")
_BASIC_FILE = struct.Struct("<IIII")
_EXT_FILE = struct.Struct("<QQQIIII")
MAX_SYMLINK = 4096  # PATH_MAX: Linux refuses longer targets, mksquashfs never writes one


@attrs.frozen
class Decoded:
    node: Node
    number: int
    nlink: int
    listing: tuple[int, int, int] | None = None  # a directory's (block, offset, size incl. 3)


def decode(region: Region, pos: int, *, block_size: int, fragments: int, id_count: int) -> Decoded:
    """The inode at `pos` of the decoded inode table."""
    kind, mode, uid, gid, mtime, number = region.unpack(_HEADER, pos)
    pos += _HEADER.size
    if uid >= id_count or gid >= id_count:
        raise InputError(f"inode {number} names owner id {max(uid, gid)} of {id_count}")
    basic, extended = kind if kind <= 7 else kind - 7, kind > 7
    if not 1 <= basic <= 7 or kind > 14:
        raise InputError(f"inode {number} has unknown type {kind}")
    node = Node(basic, mode & 0o7777, mtime)
    xattr = NO_XATTR
    if basic == DIR:
        if extended:
            nlink, size, start, _parent, _count, offset, xattr = region.unpack(_EXT_DIR, pos)
        else:
            start, nlink, size, offset, _parent = region.unpack(_BASIC_DIR, pos)
        node.children = {}
        if xattr != NO_XATTR:
            raise Unsupported(f"inode {number} has extended attributes")
        return Decoded(node, number, nlink, (start, offset, size))
    if basic == FILE:
        return _decode_file(region, pos, node, number, extended, block_size, fragments)
    fields = 2 if basic <= 5 else 1  # symlinks and devices: nlink and a size or device; ipc: nlink
    values = struct.unpack("<" + "I" * fields, region.take(pos, 4 * fields))
    pos += 4 * fields
    nlink = values[0]
    if basic == SYMLINK:
        if values[1] > MAX_SYMLINK:
            raise InputError(f"inode {number}: a symlink target of {values[1]} bytes")
        node.target = region.take(pos, values[1])
        pos += values[1]
    elif fields == 2:
        node.rdev = values[1]
    if extended:
        (xattr,) = struct.unpack("<I", region.take(pos, 4))
    if xattr != NO_XATTR:
        raise Unsupported(f"inode {number} has extended attributes")
    return Decoded(node, number, nlink)


def _decode_file(region: Region, pos: int, node: Node, number: int, extended: bool, block_size: int,
                 fragments: int) -> Decoded:
    if extended:
        start, size, sparse, nlink, frag, frag_offset, xattr = region.unpack(_EXT_FILE, pos)
        pos += _EXT_FILE.size
        if xattr != NO_XATTR:
            raise Unsupported(f"inode {number} has extended attributes")
    else:
        start, frag, frag_offset, size = region.unpack(_BASIC_FILE, pos)
        pos += _BASIC_FILE.size
        sparse, nlink = 0, 1
    if frag != NO_FRAGMENT and (frag >= fragments or frag_offset >= block_size):
        raise InputError(f"inode {number} names fragment {frag} of {fragments}")
    count = size // block_size if frag != NO_FRAGMENT else -(-size // block_size)
    if count * 4 > len(region.data) - pos:  # a forged size: its block list cannot be there
        raise InputError(f"inode {number} says {size} bytes, more blocks than the inode table holds")
    node.size, node.blocks_start, node.sparse = size, start, sparse
    node.blocks = region.take(pos, count * 4)
    node.fragment, node.fragment_offset = frag, frag_offset
    return Decoded(node, number, nlink)


def encode(node: Node, number: int, nlink: int, parent: int = 0, listing: tuple[int, int, int] = (0, 0, 3),
           index: list[tuple[int, int, bytes]] = ()) -> bytes:  # type: ignore[assignment]
    """The inode of `node` as inode `number`, owned by id 0 (root, `-all-root`); a directory's
    `index`: (offset in its listing, directory table block, first name) of each indexed header."""
    kind = node.kind
    if kind == DIR:
        start, offset, size = listing
        if size <= 0xFFFF and not index:
            return _HEADER.pack(DIR, node.mode, 0, 0, node.mtime, number) + \
                _BASIC_DIR.pack(start, nlink, size, offset, parent)
        entries = b"".join(struct.pack("<III", pos, block, len(name) - 1) + name for pos, block, name in index)
        return _HEADER.pack(DIR + 7, node.mode, 0, 0, node.mtime, number) + \
            _EXT_DIR.pack(nlink, size, start, parent, len(index), offset, NO_XATTR) + entries
    if kind == FILE:
        if node.blocks_start < 1 << 32 and node.size < 1 << 32 and nlink == 1 and not node.sparse:
            body = _BASIC_FILE.pack(node.blocks_start, node.fragment, node.fragment_offset, node.size)
        else:
            kind += 7
            body = _EXT_FILE.pack(node.blocks_start, node.size, node.sparse, nlink, node.fragment,
                                  node.fragment_offset, NO_XATTR)
        return _HEADER.pack(kind, node.mode, 0, 0, node.mtime, number) + body + node.blocks
    head = _HEADER.pack(kind, node.mode, 0, 0, node.mtime, number)
    if kind == SYMLINK:
        return head + struct.pack("<II", nlink, len(node.target)) + node.target
    if kind <= 5:
        return head + struct.pack("<II", nlink, node.rdev)
    return head + struct.pack("<I", nlink)
