"""One read-only file through FUSE (mfusepy, ctypes over Debian's libfuse 3): the artifact's
`.sqsh`, each read served by a ChunkSource. A chunk no source can give is EIO with one log line;
nothing else is in the directory, and nothing can be written."""

from __future__ import annotations

import errno
import os
import stat
import time

import mfusepy

from efabuild.errors import EfabuildError
from efabuild.lazy.chunksource import ChunkSource


class SqshFile(mfusepy.Operations):
    use_ns = True

    def __init__(self, name: str, source: ChunkSource) -> None:
        self.name, self.source = name, source
        self.path = "/" + name
        self.now = time.time_ns()
        self.uid, self.gid = os.geteuid(), os.getegid()

    def getattr(self, path: str, fh: int | None = None) -> dict:
        base = {"st_uid": self.uid, "st_gid": self.gid, "st_atime": self.now, "st_mtime": self.now,
                "st_ctime": self.now}
        if path == "/":
            return {**base, "st_mode": stat.S_IFDIR | 0o555, "st_nlink": 2}
        if path == self.path:
            return {**base, "st_mode": stat.S_IFREG | 0o444, "st_nlink": 1, "st_size": self.source.index.size}
        raise mfusepy.FuseOSError(errno.ENOENT)

    def readdir(self, path: str, fh: int) -> list[str]:
        if path != "/":
            raise mfusepy.FuseOSError(errno.ENOTDIR)
        return [".", "..", self.name]

    def open(self, path: str, flags: int) -> int:
        if path != self.path:
            raise mfusepy.FuseOSError(errno.ENOENT)
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise mfusepy.FuseOSError(errno.EROFS)
        return 0

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        try:
            return self.source.read(offset, size)
        except EfabuildError:  # logged by the source, once per chunk and read
            raise mfusepy.FuseOSError(errno.EIO) from None
