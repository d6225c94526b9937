"""Child processes that die with efabuild: a kill -9 of it leaves none running.

Every program efabuild starts (the docker CLI, mksquashfs, sqfs2tar, unsquashfs, dot, enroot) is
started here with Linux's parent-death signal (prctl PR_SET_PDEATHSIG): the kernel sends it
SIGKILL when its parent goes, however the parent goes. Orphaned, `docker buildx build` would go on
building and mksquashfs on writing a temp file nobody will publish.

The kernel sends the signal when the *thread* that forked the child exits, not the process. make
runs builds and exports on worker threads, so no child is forked there: every child is forked by
one spawner thread that lives as long as the process, and the calling thread only waits for the
Popen object.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable
from typing import Any

_PR_SET_PDEATHSIG = 1
# loaded before any fork: the child then only calls into it, it never loads a library
_LIBC = ctypes.CDLL(None, use_errno=True)

_spawner_lock = threading.Lock()
_requests: queue.SimpleQueue | None = None


def popen(args: Any, **kwargs: Any) -> subprocess.Popen:
    """subprocess.Popen(args, **kwargs), the child killed when this process dies."""
    if "preexec_fn" in kwargs:
        raise TypeError("children.popen sets preexec_fn itself")
    from concurrent.futures import Future  # with the first program started: a no-op plan starts none

    kwargs["preexec_fn"] = _die_with(os.getpid())
    done: Future[subprocess.Popen] = Future()
    _spawner().put((args, kwargs, done))
    return done.result()


def run(args: Any, *, input: Any = None, timeout: float | None = None, check: bool = False,
        capture_output: bool = False, **kwargs: Any) -> subprocess.CompletedProcess:
    """subprocess.run() through popen(): same arguments, results and exceptions."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    with popen(args, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except BaseException:  # a timeout or Ctrl-C: the child never outlives the call
            process.kill()
            process.wait()
            raise
    if check and process.returncode:
        raise subprocess.CalledProcessError(process.returncode, process.args, stdout, stderr)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _die_with(parent: int) -> Callable[[], None]:
    def preexec() -> None:  # runs in the child between fork and exec: no allocation, no locks
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)
    return preexec


def _spawner() -> queue.SimpleQueue:
    global _requests
    with _spawner_lock:
        if _requests is None:
            _requests = queue.SimpleQueue()
            threading.Thread(target=_spawn_forever, args=(_requests,), name="efabuild-children",
                             daemon=True).start()
        return _requests


def _spawn_forever(requests: queue.SimpleQueue) -> None:
    while True:
        args, kwargs, done = requests.get()
        try:
            done.set_result(subprocess.Popen(args, **kwargs))
        except BaseException as exc:  # FileNotFoundError and the like belong to the caller
            done.set_exception(exc)


def _forget_spawner() -> None:
    """A forked copy of this process has no spawner thread: it starts its own."""
    global _requests, _spawner_lock
    _requests, _spawner_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_spawner)
