"""Per-key locks: POSIX record locks, and the O_EXCL lock file used where those are refused."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from efabuild.store.lock import EXCLUSIVE_FILE, POSIX, FileLock, LockBusy

REPO = Path(__file__).resolve().parents[2]
HOLDER = (
    "import sys, time\nfrom efabuild.store.lock import FileLock\n"
    "lock = FileLock(sys.argv[1], mode=sys.argv[2])\nlock.acquire()\n"
    "print('held', flush=True)\ntime.sleep(600)\n"
)


def hold_in_child(path: Path, mode: str) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), mode], stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert child.stdout.readline().strip() == "held"
    return child


@pytest.mark.parametrize("mode", [POSIX, EXCLUSIVE_FILE])
def test_a_lock_excludes_other_processes_and_dies_with_its_holder(tmp_path, mode):
    path = tmp_path / "locks" / "k.lock"
    child = hold_in_child(path, mode)
    try:
        with pytest.raises(LockBusy):
            FileLock(path, mode=mode).acquire(blocking=False)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    # SIGKILL: the kernel drops a POSIX lock; a dead pid on this host makes a lock file stale
    lock = FileLock(path, mode=mode)
    lock.acquire(blocking=False)
    assert lock.held
    lock.release()
    assert not lock.held


def test_lock_file_of_another_host_is_broken_only_when_its_heartbeat_stopped(tmp_path):
    path = tmp_path / "k.lock"
    excl = tmp_path / "k.lock.excl"
    excl.write_text(json.dumps({"host": "other-node-" + socket.gethostname(), "pid": 1, "since": 0}))
    lock = FileLock(path, mode=EXCLUSIVE_FILE, stale_after=600)
    with pytest.raises(LockBusy):  # fresh heartbeat: its holder on another node may be working
        lock.acquire(blocking=False)
    old = time.time() - 3600
    os.utime(excl, (old, old))  # no heartbeat for an hour
    lock.acquire(blocking=False)
    owner = json.loads(excl.read_text())
    assert owner["host"] == socket.gethostname() and owner["pid"] == os.getpid()
    lock.release()
    assert not excl.exists()


def test_auto_mode_uses_posix_locks_here(tmp_path):
    with FileLock(tmp_path / "k.lock"):
        assert (tmp_path / "k.lock").exists()
        assert not (tmp_path / "k.lock.excl").exists()


WAITER = (
    "import sys, time\nfrom efabuild.store.lock import FileLock\n"
    "lock = FileLock(sys.argv[1], on_wait=lambda path: print('waiting', flush=True))\nlock.acquire()\n"
    "print('held', flush=True)\ntime.sleep(600)\n"
)


def test_a_waiter_on_a_lock_file_gc_removed_takes_the_current_file(tmp_path):
    """Slip: a waiter keeps the lock it finally gets on a file gc unlinked meanwhile. It would then
    hold a lock nobody else sees, and the next publisher or fetcher of the key would take the new
    file's lock and write beside it."""
    path = tmp_path / "locks" / "k.lock"
    gc = FileLock(path)
    gc.acquire()
    waiter = subprocess.Popen([sys.executable, "-c", WAITER, str(path)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert waiter.stdout.readline().strip() == "waiting"
        gc.remove()  # gc deletes the key and its lock file while holding it
        gc.release()
        assert waiter.stdout.readline().strip() == "held"
        with pytest.raises(LockBusy):
            FileLock(path).acquire(blocking=False)
    finally:
        waiter.send_signal(signal.SIGKILL)
        waiter.wait()
