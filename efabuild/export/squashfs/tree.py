"""The filesystem an image holds, as the incremental writer sees it: inodes and names, no bytes.

Pure data. A regular file's content is where it lies in a `.sqsh` (its first block, the stored
size of each block, its fragment and the offset in it), whether it came from the ancestor or was
written from a layer; a hard link is one `Node` under several names.
"""

from __future__ import annotations

import stat

import attrs

NO_FRAGMENT = 0xFFFFFFFF

# squashfs' basic inode types (a directory entry always names the basic one)
DIR, FILE, SYMLINK, BLKDEV, CHRDEV, FIFO, SOCKET = 1, 2, 3, 4, 5, 6, 7
KIND_NAMES = {DIR: "directory", FILE: "file", SYMLINK: "symlink", BLKDEV: "block device",
              CHRDEV: "character device", FIFO: "fifo", SOCKET: "socket"}
S_IFMT = {DIR: stat.S_IFDIR, FILE: stat.S_IFREG, SYMLINK: stat.S_IFLNK, BLKDEV: stat.S_IFBLK,
          CHRDEV: stat.S_IFCHR, FIFO: stat.S_IFIFO, SOCKET: stat.S_IFSOCK}


@attrs.define(eq=False)
class Node:
    """One inode. `children` only for directories; the file fields only for regular files."""

    kind: int
    mode: int  # permission bits (07777)
    mtime: int
    children: dict[bytes, Node] | None = None
    size: int = 0
    blocks_start: int = 0
    blocks: bytes = b""  # the stored size of each block: little-endian u32s, as on disk
    fragment: int = NO_FRAGMENT
    fragment_offset: int = 0
    sparse: int = 0
    target: bytes = b""  # a symlink's
    rdev: int = 0  # a device's, in squashfs' encoding

    @classmethod
    def directory(cls, mode: int, mtime: int) -> Node:
        return cls(DIR, mode, mtime, children={})

    @property
    def is_dir(self) -> bool:
        return self.kind == DIR


def walk(root: Node) -> list[tuple[bytes, Node]]:
    """Every (path, node) below root, parents before children, names in byte order."""
    out: list[tuple[bytes, Node]] = []
    stack: list[tuple[bytes, Node]] = [(b"", root)]
    while stack:
        path, node = stack.pop()
        out.append((path, node))
        if node.children:
            for name in sorted(node.children, reverse=True):
                stack.append(((path + b"/" if path else b"") + name, node.children[name]))
    return out


def encode_dev(major: int, minor: int) -> int:
    """The kernel's new_encode_dev, which squashfs stores."""
    return (minor & 0xFF) | (major << 8) | ((minor & ~0xFF) << 12)


def decode_dev(dev: int) -> tuple[int, int]:
    return (dev & 0xFFF00) >> 8, (dev & 0xFF) | ((dev >> 12) & 0xFFF00)


class Unsupported(Exception):
    """An input the incremental writer does not handle (xattrs, owners, a codec): a full export does."""
