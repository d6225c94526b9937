"""`efabuild ARGS` run inside the test process: the exit status, standard output and standard error
that `python -m efabuild ARGS` gives, without starting a Python each time (which was most of the
time of the tests that need neither the engine nor S3).

It calls `efabuild.cli.main` as `python -m efabuild` does, with what a process would have of its
own: the working directory, the environment (`env` replaces it, as subprocess does), sys.argv,
standard input, output and error (files, so a child process given sys.stderr writes into the
same place), and the SIGTERM handler are set for the call and put back after it. A
usage error (argparse's exit) gives its status; an exception main() lets through is printed as a
traceback with status 1, as the interpreter would, so a test asserting "no traceback" still sees
one. Tests where the process boundary itself is the subject (the console script's exit status,
what `lookup` imports, signals, concurrent processes) keep running real processes.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping, Sequence


def run_efabuild(args: Sequence[str | os.PathLike], *, cwd: str | os.PathLike | None = None,
                 env: Mapping[str, str] | None = None, input: str | bytes | None = None,  # noqa: A002
                 text: bool = True, check: bool = False, capture_output: bool = True,
                 timeout: float | None = None, stdin: int | None = None,
                 entry: Callable[[], int] | None = None) -> subprocess.CompletedProcess:
    """Like `subprocess.run([sys.executable, "-m", "efabuild", *args], capture_output=True, ...)`;
    `capture_output`, `timeout` and `stdin` are accepted for that likeness: output is always
    captured, standard input is `input` or empty (as `subprocess.DEVNULL` gives), and a call in
    this process cannot be timed out (the test run's own timeout applies). With `entry`, that
    console-script function is called instead of main(), with `args` as its sys.argv[1:]."""
    del capture_output, timeout, stdin
    from efabuild.cli import main

    argv = [os.fspath(arg) for arg in args]
    call = (lambda: main(argv)) if entry is None else entry
    data = input.encode() if isinstance(input, str) else (input or b"")
    with _own_process_state(cwd, env, [getattr(entry, "__name__", "efabuild"), *argv], data) as (out, err):
        code = _call(call)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        stdout, stderr = _read(out), _read(err)  # while the streams over them are still open
    if text:  # as subprocess's text mode reads them: UTF-8, universal newlines
        stdout, stderr = (_text(b) for b in (stdout, stderr))
    done = subprocess.CompletedProcess(["efabuild", *argv], code, stdout, stderr)
    if check:
        done.check_returncode()
    return done


@contextlib.contextmanager
def _own_process_state(cwd, env, argv: list[str], data: bytes):  # noqa: ANN001, ANN202
    """Set what a process has of its own for one call, and put the test's back afterwards.

    The standard streams are files, and descriptors 0, 1 and 2 point at them during the call, so
    a child process (enroot, mksquashfs) reads and writes where it would in a process of its own.
    """
    files = [tempfile.TemporaryFile(buffering=0) for _ in range(3)]
    files[0].write(data)
    files[0].seek(0)
    saved_fds = [os.dup(fd) for fd in (0, 1, 2)]
    saved = (sys.stdin, sys.stdout, sys.stderr), sys.argv, os.getcwd(), dict(os.environ)
    saved_sigterm = signal.getsignal(signal.SIGTERM)
    try:
        if cwd is not None:
            os.chdir(cwd)
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        sys.argv = argv
        for fd, file in enumerate(files):
            os.dup2(file.fileno(), fd)
        sys.stdin = io.TextIOWrapper(files[0], encoding="utf-8")
        sys.stdout, sys.stderr = (io.TextIOWrapper(file, encoding="utf-8", errors="backslashreplace",
                                                   write_through=True) for file in files[1:])
        yield files[1], files[2]
    finally:
        for fd, saved_fd in enumerate(saved_fds):
            os.dup2(saved_fd, fd)
            os.close(saved_fd)
        (sys.stdin, sys.stdout, sys.stderr), sys.argv = saved[0], saved[1]
        os.chdir(saved[2])
        if env is not None:
            os.environ.clear()
            os.environ.update(saved[3])
        signal.signal(signal.SIGTERM, saved_sigterm)


def _call(call: Callable[[], int | None]) -> int:
    try:
        return int(call() or 0)
    except SystemExit as exc:  # argparse: --help, --version, a usage error
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        raise  # the test run's own Ctrl-C
    except Exception:  # what the interpreter would print before exiting 1
        traceback.print_exc()
        return 1


def _read(file) -> bytes:  # noqa: ANN001 - an unbuffered temporary file
    file.seek(0)
    return file.read()


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")

