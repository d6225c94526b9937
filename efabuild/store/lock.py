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
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

# errno values meaning "this filesystem does not do POSIX locks"
_NO_POSIX_LOCKS = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}
_BUSY = {errno.EAGAIN, errno.EACCES}

MODE_ENV = "EFABUILD_LOCK_MODE"
POSIX = "posix"
EXCLUSIVE_FILE = "exclusive-file"
AUTO = "auto"


class LockBusy(Exception):
    """A non-blocking acquire found the lock held."""


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
    ) -> None:
        self.path = Path(path)
        self.mode = mode if mode != AUTO else os.environ.get(MODE_ENV, AUTO)
        self.stale_after = stale_after
        self.heartbeat = min(heartbeat, stale_after / 3)
        self.on_wait = on_wait
        self._fd: int | None = None
        self._excl_path: Path | None = None
        self._beat: threading.Event | None = None

    # ---- public
    def acquire(self, blocking: bool = True) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.mode in (AUTO, POSIX):
            try:
                self._acquire_posix(blocking)
                return
            except OSError as exc:
                if exc.errno not in _NO_POSIX_LOCKS or self.mode == POSIX:
                    raise
        self._acquire_exclusive_file(blocking)

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing drops the POSIX lock
        if self._excl_path is not None:
            assert self._beat is not None
            self._beat.set()
            path, self._excl_path = self._excl_path, None
            try:
                path.unlink()
            except FileNotFoundError:
                pass

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
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            _open_to_all(fd)
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
                    same = os.path.samestat(os.fstat(fd), os.stat(self.path))
                except FileNotFoundError:
                    same = False
                if same:
                    self._fd = fd
                    return
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)

    # ---- O_EXCL lock file fallback
    def _acquire_exclusive_file(self, blocking: bool) -> None:
        path = self.path.with_name(self.path.name + ".excl")
        owner = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()})
        waited = False
        delay = 0.05
        while True:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
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
            threading.Thread(target=self._heartbeat, args=(path, self._beat), daemon=True).start()
            return

    def _heartbeat(self, path: Path, stop: threading.Event) -> None:
        while not stop.wait(self.heartbeat):
            try:
                os.utime(path)
            except FileNotFoundError:
                return

    def _break_if_stale(self, path: Path) -> bool:
        try:
            stat = path.stat()
            owner = json.loads(path.read_text() or "{}")
        except FileNotFoundError:
            return True  # released meanwhile: try again
        except ValueError:
            owner = {}  # being written right now, or damaged: judge by age alone
        dead_here = owner.get("host") == socket.gethostname() and not pid_alive(owner.get("pid"))
        if not dead_here and time.time() - stat.st_mtime < self.stale_after:
            return False
        # Move it aside first: of several breakers only one rename succeeds.
        aside = path.with_name(f"{path.name}.stale.{socket.gethostname()}.{os.getpid()}")
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return True
        try:
            if aside.stat().st_ino != stat.st_ino:
                # Another breaker was faster and a new holder took the lock: put it back.
                os.link(aside, path)
        except OSError:
            pass
        aside.unlink(missing_ok=True)
        return True


def _open_to_all(fd: int) -> None:
    """Lock files are empty and shared by every user of a store: whoever creates one lets all
    others open it too (the creating user's umask would not)."""
    try:
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, 0o666)
    except OSError:
        pass  # a filesystem without modes: nothing to widen


def pid_alive(pid: object) -> bool:
    """Whether a process with this pid exists on this host (one we may not signal counts)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
