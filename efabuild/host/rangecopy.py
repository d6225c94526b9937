"""Copy a byte range from one open file to another without passing it through Python.

Where the filesystem shares blocks between files (XFS made with reflink=1, btrfs), the
block-aligned part of the range is cloned (FICLONERANGE): no data is written, the two files share
the blocks until one of them is written to. Cloning needs the source and destination offsets to be
equally aligned to the block size; the unaligned edges, and everything on filesystems that cannot
clone (ext4, or two files on different filesystems), are copied in the kernel
(copy_file_range), else by pread and pwrite.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import threading

import attrs

FICLONERANGE = 0x4020940D  # _IOW(0x94, 13, struct file_clone_range) in linux/fs.h
_CANNOT_CLONE = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EPERM}
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}
_PIECE = 8 * 1024 * 1024  # pread/pwrite fallback: bounded memory


class ShortSource(OSError):
    """The source ended before the range did (a seed replaced by a shorter file)."""


@attrs.define
class RangeCopier:
    """Copies ranges into one destination file, cloning where its filesystem lets it.

    Remembers what the filesystem refused, so that ext4 is asked once, not per range."""

    dest_fd: int
    block: int = attrs.field(default=0)
    can_clone: bool = True
    kernel_copy: bool = True
    cloned: int = 0  # bytes shared with a source, not written
    copied: int = 0  # bytes written
    _lock: threading.Lock = attrs.field(factory=threading.Lock, repr=False)  # copies run on many threads

    def __attrs_post_init__(self) -> None:
        if self.block <= 0:
            self.block = os.fstatvfs(self.dest_fd).f_bsize or 4096

    def copy(self, src_fd: int, src_offset: int, dest_offset: int, length: int) -> None:
        """Make dest[dest_offset:+length] hold src[src_offset:+length]; ShortSource if src ends first."""
        block = self.block
        if self.can_clone and (src_offset - dest_offset) % block == 0:
            start = -(-dest_offset // block) * block
            end = (dest_offset + length) // block * block
            if end > start and self._clone(src_fd, src_offset + start - dest_offset, start, end - start):
                self._copy(src_fd, src_offset, dest_offset, start - dest_offset)
                self._copy(src_fd, src_offset + end - dest_offset, end, dest_offset + length - end)
                return
        self._copy(src_fd, src_offset, dest_offset, length)

    def _clone(self, src_fd: int, src_offset: int, dest_offset: int, length: int) -> bool:
        try:
            fcntl.ioctl(self.dest_fd, FICLONERANGE, struct.pack("qQQQ", src_fd, src_offset, length, dest_offset))
        except OSError as exc:
            if exc.errno not in _CANNOT_CLONE:
                raise
            if exc.errno != errno.EINVAL:  # EINVAL: this range (alignment, a source too short); others: never
                self.can_clone = False
            return False
        with self._lock:
            self.cloned += length
        return True

    def _copy(self, src_fd: int, src_offset: int, dest_offset: int, length: int) -> None:
        while length > 0:
            done = self._copy_some(src_fd, src_offset, dest_offset, length)
            if done == 0:
                raise ShortSource(errno.EIO, f"source ended {length} bytes before the range")
            src_offset, dest_offset, length = src_offset + done, dest_offset + done, length - done
            with self._lock:
                self.copied += done

    def _copy_some(self, src_fd: int, src_offset: int, dest_offset: int, length: int) -> int:
        if self.kernel_copy:
            try:
                return os.copy_file_range(src_fd, self.dest_fd, length, src_offset, dest_offset)
            except OSError as exc:
                if exc.errno not in _NO_KERNEL_COPY:
                    raise
                self.kernel_copy = False
        data = os.pread(src_fd, min(length, _PIECE), src_offset)
        return os.pwrite(self.dest_fd, data, dest_offset) if data else 0
