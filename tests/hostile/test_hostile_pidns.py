"""Processes under the same host name that cannot see each other's pids: containers sharing the
host's name (`--network host`) and its engine socket or a store's shared filesystem, each in its
own pid namespace. A pid judged from one namespace says nothing about a process of another: what
a live process there owns (a temp file, an export container, a lock) must never be taken for a
dead one's leftover. The processes below run in real pid namespaces (unshare, as root)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from efabuild.store.lock import EXCLUSIVE_FILE, FileLock
from efabuild.host.owner import Owner, owned_name

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                reason="a new pid namespace needs root and unshare")


def in_another_namespace(code: str, *args: str) -> str:
    """What `code` prints, run in a new pid namespace (its own /proc, the same host name)."""
    done = subprocess.run(["unshare", "--pid", "--kill-child", "--mount-proc", sys.executable, "-c", code, *args],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_live_process_is_never_judged_gone_from_another_pid_namespace():
    me = Owner.current()
    assert in_another_namespace("import sys; from efabuild.host.owner import Owner; "
                                "print(Owner.parse(sys.argv[1]).gone())", me.token) == "False"
    # and the other way: a live process in a namespace, judged from here
    code = "import time; from efabuild.host.owner import Owner; print(Owner.current().token, flush=True); time.sleep(60)"
    proc = subprocess.Popen(["unshare", "--pid", "--kill-child", "--mount-proc", sys.executable, "-c", code],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        theirs = Owner.parse(proc.stdout.readline().strip())
        assert theirs is not None and theirs != me and not theirs.gone()
    finally:
        proc.kill()
        proc.wait()


def test_a_lock_file_held_here_is_not_broken_from_another_pid_namespace(tmp_path):
    """EFABUILD_LOCK_MODE=exclusive-file (a shared filesystem without POSIX locks): a holder on
    "this host" is judged by its pid at once; from another namespace that pid is no one's."""
    lock = FileLock(tmp_path / "k.lock", mode=EXCLUSIVE_FILE, stale_after=600)
    lock.acquire()
    try:
        tried = in_another_namespace(
            "import sys; from efabuild.store.lock import FileLock, LockBusy\n"
            "lock = FileLock(sys.argv[1], mode='exclusive-file', stale_after=600)\n"
            "try:\n    lock.acquire(blocking=False)\n    print('taken')\nexcept LockBusy:\n    print('busy')\n",
            str(tmp_path / "k.lock"))
        assert tried == "busy"
        assert json.loads((tmp_path / "k.lock.excl").read_text())["pid"] == os.getpid()
    finally:
        lock.release()


def test_a_live_process_s_scratch_directory_is_no_leftover_from_another_pid_namespace(tmp_path):
    scratch = tmp_path / owned_name("efabuild", "build")
    scratch.mkdir()
    found = in_another_namespace("import sys; from efabuild.host.scratch import dead_scratch_dirs; "
                                 "print([str(p) for p in dead_scratch_dirs(sys.argv[1])])", str(tmp_path))
    assert found == "[]"


@pytest.mark.slow
def test_what_a_process_of_an_ended_pid_namespace_owned_is_gone_from_the_host():
    """A make killed in a container that shares the host's name leaves an export container or a
    scratch directory owned by `host-pidnsN`: from the host it is a leftover once no process is
    left in that namespace, and not before."""
    import time

    code = "import time; from efabuild.host.owner import Owner; print(Owner.current().token, flush=True); time.sleep(60)"
    proc = subprocess.Popen(["unshare", "--pid", "--kill-child", "--mount-proc", sys.executable, "-c", code],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        theirs = Owner.parse(proc.stdout.readline().strip())
        assert theirs is not None and "-pidns" in theirs.host and not theirs.gone()
    finally:
        proc.kill()  # --kill-child: the namespace's process dies with unshare
        proc.wait()
    deadline = time.monotonic() + 10
    while not theirs.gone() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert theirs.gone()
