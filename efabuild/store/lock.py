"""Exclusive locks on a store directory that also hold across hosts on a shared filesystem.

Choice: POSIX record locks (`fcntl.lockf`) first. The kernel drops them when their holder dies
(even by SIGKILL), so a crashed publisher never leaves a stale lock, and Lustre (FSx) makes them
coherent across clients when mounted with `flock` (FSx's default). Where the filesystem refuses
POSIX locks (Lustre mounted `noflock`, some NFS set-ups: ENOLCK/ENOSYS/EOPNOTSUPP), fall back
to an O_EXCL lock file holding owner (host, pid) and a heartbeat mtime: O_EXCL creation is atomic
on every POSIX filesystem. Its weakness is staleness: a dead holder on another host is detected
only when the heartbeat stops for `stale_after` seconds; on the same host a dead pid is seen at once.
Lustre mounted `localflock` accepts POSIX locks but keeps them per node: there, set
EFABUILD_LOCK_MODE=exclusive-file so that hosts exclude each other.

POSIX locks belong to the process: two threads of one process do not exclude each other, and
closing any descriptor of the file releases the lock. Callers lock a given path once per process.

Lock files live in a directory every store user writes. A lock file is opened without following
links (below `root`, its directories too) and must be a regular file with one link; only a file
this process has just created is made writable to all. So a planted `locks/KEY.lock ->
/etc/passwd` is refused (one line), never opened, chmod-ed or created through.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import threading
import time
import stat
from collections.abc import Callable
from pathlib import Path

from efabuild import notices
from efabuild.display import shown
from efabuild.host import fsutil
from efabuild.host.pids import host_name, pid_alive

# errno values meaning "this filesystem does not do POSIX locks"
_NO_POSIX_LOCKS = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}
_BUSY = {errno.EAGAIN, errno.EACCES}

MODE_ENV = "EFABUILD_LOCK_MODE"
POSIX = "posix"
EXCLUSIVE_FILE = "exclusive-file"
AUTO = "auto"



def note_waiting(what: str) -> None:
    """A lock's on_wait for a store's locks: one line, once, while another process holds `what`."""
    notices.note(f"waiting for another process holding {what}")

class LockBusy(Exception):
    """A non-blocking acquire found the lock held."""


class UnsafeLock(fsutil.UnsafeEntry, LockBusy):
    """The lock file is not one efabuild made (a link, FIFO, device, directory, or a file with
    several links): it cannot be taken. Non-blocking callers may treat it as busy."""


class FileLock:
    """`with FileLock(path):` — blocks until held; `acquire(blocking=False)` raises LockBusy."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        mode: str = AUTO,
        stale_after: float = 600.0,
        heartbeat: float = 30.0,
        on_wait: Callable[[str], None] | None = None,
        root: str | os.PathLike[str] | None = None,
    ) -> None:
        self.path = Path(path)
        # directories between `root` (trusted) and the lock file are not followed when links
        self.root = Path(root) if root is not None else self.path.parent
        self.mode = mode if mode != AUTO else os.environ.get(MODE_ENV, AUTO)
        self.stale_after = stale_after
        self.heartbeat = min(heartbeat, stale_after / 3)
        self.on_wait = on_wait
        self._fd: int | None = None
        self._dir_fd: int | None = None
        self._excl_path: Path | None = None
        self._beat: threading.Event | None = None

    # ---- public
    def acquire(self, blocking: bool = True) -> None:
        try:
            self._dir_fd = fsutil.open_dir(self.root, fsutil.relative_parts(self.root, self.path.parent),
                                           create=True)
        except UnsafeLock:
            raise
        except fsutil.UnsafeEntry as exc:
            raise UnsafeLock(str(exc)) from None
        try:
            if self.mode in (AUTO, POSIX):
                try:
                    self._acquire_posix(blocking)
                    return
                except OSError as exc:
                    if exc.errno not in _NO_POSIX_LOCKS or self.mode == POSIX:
                        raise
            self._acquire_exclusive_file(blocking)
        except BaseException:
            self._close_dir()
            raise

    def acquire_unless(self, cancel: threading.Event, poll: float = 0.25) -> bool:
        """Wait for the lock while `cancel` is not set (a blocking wait cannot be interrupted
        from another thread); False when cancelled first."""
        waited = False
        while True:
            try:
                self.acquire(blocking=False)
                return True
            except UnsafeLock:
                raise  # never freed by waiting
            except LockBusy:
                if not waited and self.on_wait:
                    self.on_wait(str(self.path))
                waited = True
            if cancel.wait(poll):
                return False

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing drops the POSIX lock
        if self._excl_path is not None:
            assert self._beat is not None
            self._beat.set()
            path, self._excl_path = self._excl_path, None
            try:
                os.unlink(path.name, dir_fd=self._dir_fd)
            except FileNotFoundError:
                pass
        self._close_dir()

    def remove(self) -> None:
        """Unlink the lock file while holding it (gc, for a deleted object): waiters that then
        get it see that it is gone and retry on a fresh file."""
        if self._dir_fd is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path.name, dir_fd=self._dir_fd)

    def _close_dir(self) -> None:
        if self._dir_fd is not None:
            fd, self._dir_fd = self._dir_fd, None
            os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None or self._excl_path is not None

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # ---- POSIX record lock
    def _acquire_posix(self, blocking: bool) -> None:
        waited = False
        while True:
            fd = self._open_lock_file()
            if fd is None:
                continue  # removed between our looks: try again
            try:
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    if exc.errno not in _BUSY:
                        raise
                    if not blocking:
                        raise LockBusy(str(self.path)) from None
                    if not waited and self.on_wait:
                        self.on_wait(str(self.path))
                    waited = True
                    fcntl.lockf(fd, fcntl.LOCK_EX)
                # The file may have been removed (gc) while we waited: then we hold a lock on
                # an orphan inode that others no longer see. Retry on the current file.
                try:
                    same = os.path.samestat(os.fstat(fd), os.stat(self.path.name, dir_fd=self._dir_fd,
                                                                  follow_symlinks=False))
                except FileNotFoundError:
                    same = False
                if same:
                    self._fd = fd
                    return
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)

    def _open_lock_file(self) -> int | None:
        """A descriptor of the lock file, created if need be; None when it vanished meanwhile."""
        name, dir_fd = self.path.name, self._dir_fd
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666,
                         dir_fd=dir_fd)
        except FileExistsError:
            pass
        else:
            _open_to_all(fd)  # ours, just created: nobody else's file gets a new mode
            return fd
        try:
            # look before opening: a planted device is never opened, a FIFO never waited on
            self._check(os.stat(name, dir_fd=dir_fd, follow_symlinks=False))
        except FileNotFoundError:
            return None
        fd = fsutil.open_entry(dir_fd, name, self.path, os.O_RDWR, error=UnsafeLock, what="lock file")
        if fd is None:
            return None
        try:
            self._check(os.fstat(fd))
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _check(self, info: os.stat_result) -> None:
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeLock(f"{shown(self.path)}: {fsutil.kind_of(info.st_mode)}, not a lock file")
        if info.st_nlink != 1:
            raise UnsafeLock(f"{shown(self.path)}: a file with {info.st_nlink} links, not a lock file")

    # ---- O_EXCL lock file fallback
    def _acquire_exclusive_file(self, blocking: bool) -> None:
        import socket  # on this fallback only: the socket module costs a no-op plan 13 M instructions

        path = self.path.with_name(self.path.name + ".excl")
        name, dir_fd = path.name, self._dir_fd
        owner = json.dumps({"host": host_name(socket.gethostname()), "pid": os.getpid(), "since": time.time()})
        waited = False
        delay = 0.05
        while True:
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666,
                             dir_fd=dir_fd)
            except FileExistsError:
                if self._break_if_stale(path):
                    continue
                if not blocking:
                    raise LockBusy(str(path)) from None
                if not waited and self.on_wait:
                    self.on_wait(str(path))
                waited = True
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            try:
                os.write(fd, owner.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            self._excl_path = path
            self._beat = threading.Event()
            beat_dir = os.dup(dir_fd)  # the thread's own: release() closes ours
            threading.Thread(target=self._heartbeat, args=(name, beat_dir, self._beat), daemon=True).start()
            return

    def _heartbeat(self, name: str, dir_fd: int, stop: threading.Event) -> None:
        try:
            while not stop.wait(self.heartbeat):
                try:
                    os.utime(name, dir_fd=dir_fd, follow_symlinks=False)
                except OSError:
                    return
        finally:
            os.close(dir_fd)

    def _break_if_stale(self, path: Path) -> bool:
        import socket

        name, dir_fd = path.name, self._dir_fd
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode):
                raise UnsafeLock(f"{shown(path)}: {fsutil.kind_of(info.st_mode)}, not a lock file")
            owner = json.loads(fsutil.read_file(dir_fd, name, path, 4096) or b"{}")
        except FileNotFoundError:
            return True  # released meanwhile: try again
        except (ValueError, fsutil.UnsafeEntry) as exc:
            if isinstance(exc, UnsafeLock):
                raise
            owner = {}  # being written right now, or damaged: judge by age alone
        if not isinstance(owner, dict):
            owner = {}
        dead_here = owner.get("host") == host_name(socket.gethostname()) and not pid_alive(owner.get("pid"))
        if not dead_here and time.time() - info.st_mtime < self.stale_after:
            return False
        # Move it aside first: of several breakers only one rename succeeds.
        aside = f"{name}.stale.{host_name(socket.gethostname())}.{os.getpid()}"
        try:
            os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except FileNotFoundError:
            return True
        try:
            if os.stat(aside, dir_fd=dir_fd, follow_symlinks=False).st_ino != info.st_ino:
                # Another breaker was faster and a new holder took the lock: put it back.
                os.link(aside, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            pass
        with contextlib.suppress(FileNotFoundError):
            os.unlink(aside, dir_fd=dir_fd)
        return True


def _open_to_all(fd: int) -> None:
    """Lock files are empty and shared by every user of a store: whoever creates one lets all
    others open it too (the creating user's umask would not). Called only on a file this process
    has just created (O_CREAT | O_EXCL)."""
    try:
        os.fchmod(fd, 0o666)
    except OSError:
        pass  # a filesystem without modes: nothing to widen
