"""The node's cache of verified chunks: one file per chunk id, this user's, bounded in bytes.

A chunk file is written whole under a temporary name and renamed (a killed mount leaves no half
chunk at an id's name; a full disk is an error of the write, never a short file), and re-checked
against its id whenever it is read (a bit flipped on disk is a miss, not a served byte). The
directory must be this user's, 0700, and is opened without following a link.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import time
from pathlib import Path

import blake3

from efabuild.errors import EfabuildError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class CacheFull(EfabuildError):
    """The disk under the node cache has no room for a chunk."""


class NodeCache:
    def __init__(self, directory: Path, limit: int) -> None:
        directory = Path(directory)
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.fd = os.open(directory, _DIR_FLAGS)
        except OSError as exc:
            raise EfabuildError(f"{directory}: cannot use it as the chunk cache ({exc.strerror or exc})") from None
        info = os.fstat(self.fd)
        if info.st_uid != os.geteuid() or info.st_mode & 0o077:
            os.close(self.fd)
            raise EfabuildError(f"{directory}: the chunk cache must be this user's directory, mode 0700 (it is "
                                f"uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o})")
        self.directory, self.limit = directory, limit
        self._lock = threading.Lock()
        self._sizes: dict[str, int] = {}
        for entry in os.scandir(self.fd):
            if _is_id(entry.name) and entry.is_file(follow_symlinks=False):
                self._sizes[entry.name] = entry.stat(follow_symlinks=False).st_size
            elif _is_leftover(entry):
                with contextlib.suppress(OSError):
                    os.unlink(entry.name, dir_fd=self.fd)

    @property
    def used(self) -> int:
        return sum(self._sizes.values())

    def get(self, cid: str, length: int) -> bytes | None:
        """The chunk's bytes when the cache holds them intact; a damaged entry is dropped."""
        try:
            fd = os.open(cid, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self.fd)
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            data = os.pread(fd, length + 1, 0) if stat.S_ISREG(info.st_mode) else b""
        finally:
            os.close(fd)
        if len(data) == length and blake3.blake3(data).hexdigest() == cid:
            os.utime(cid, dir_fd=self.fd)  # recently used: evicted last
            return data
        self._drop(cid)
        return None

    def put(self, cid: str, data: bytes) -> None:
        """Keep a verified chunk, evicting the least recently used ones beyond the limit."""
        tmp = f".{cid}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=self.fd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.rename(tmp, cid, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except OSError as exc:
            try:
                os.unlink(tmp, dir_fd=self.fd)
            except OSError:
                pass
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise CacheFull(f"{self.directory}: no space left for chunk {cid[:12]} "
                                f"({len(data)} bytes; the cache holds {self.used})") from None
            raise EfabuildError(f"{self.directory}: cannot keep chunk {cid[:12]}: {exc.strerror or exc}") from None
        with self._lock:
            self._sizes[cid] = len(data)
        self._evict()

    def _evict(self) -> None:
        with self._lock:
            if self.used <= self.limit:
                return
            ages = []
            for cid in list(self._sizes):
                try:
                    ages.append((os.stat(cid, dir_fd=self.fd, follow_symlinks=False).st_mtime_ns, cid))
                except OSError:
                    self._sizes.pop(cid, None)
            for _, cid in sorted(ages):
                if self.used <= self.limit:
                    break
                self._drop_locked(cid)

    def forget(self, cid: str) -> None:
        self._drop(cid)

    def _drop(self, cid: str) -> None:
        with self._lock:
            self._drop_locked(cid)

    def _drop_locked(self, cid: str) -> None:
        try:
            os.unlink(cid, dir_fd=self.fd)
        except OSError:
            pass
        self._sizes.pop(cid, None)

    def close(self) -> None:
        os.close(self.fd)


def _is_id(name: str) -> bool:
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


def _is_leftover(entry: os.DirEntry) -> bool:
    """A chunk's temporary file (`.<id>.<pid>.<thread>.tmp`) of a mount that was killed while it
    wrote: its process is gone, or the file is an hour old (a chunk is written in milliseconds)."""
    parts = entry.name.split(".")
    if not (len(parts) == 5 and parts[0] == "" and parts[4] == "tmp" and _is_id(parts[1]) and parts[2].isdigit()):
        return False
    try:
        if time.time() - entry.stat(follow_symlinks=False).st_mtime > 3600:
            return True
        os.kill(int(parts[2]), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive, another user's (not in this user's cache), or gone meanwhile
    return False
