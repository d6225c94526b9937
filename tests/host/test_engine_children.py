"""Children that die with efabuild: real processes, real SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from efabuild.host import children

# starts `sleep` from a worker thread that then ends, as make's worker threads end, and waits
PARENT = """
import threading, time
from efabuild.host import children
started = []
worker = threading.Thread(target=lambda: started.append(children.popen(["sleep", "300"])))
worker.start()
worker.join()
print(started[0].pid, flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def _wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_child_outlives_the_thread_that_asked_for_it_and_dies_with_the_process():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    child = 0
    try:
        child = int(parent.stdout.readline())
        time.sleep(0.5)  # the worker thread has ended: its child must still run
        assert _alive(child), "the child died with the thread that started it"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert _wait_gone(child), "the child runs on after its parent was killed"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)


def test_run_gives_what_subprocess_run_gives():
    done = children.run(["sh", "-c", "cat; echo err >&2; exit 3"], input="in\n", capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (3, "in\n", "err\n")
    with pytest.raises(subprocess.CalledProcessError):
        children.run(["false"], check=True)
    with pytest.raises(FileNotFoundError):
        children.run(["efabuild-no-such-program"])


@pytest.mark.slow
def test_a_run_that_times_out_leaves_no_child(tmp_path):
    pidfile = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        children.run(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 300"], timeout=1, capture_output=True)
    assert not _alive(int(pidfile.read_text())), "the timed-out child still runs"
