"""`efabuild ARGS` run inside the test process: the exit status, standard output and standard error
that `python -m efabuild ARGS` gives, without starting a Python each time (which was most of the
time of the tests that need neither the engine nor S3).

It calls `efabuild.cli.main` as `python -m efabuild` does, with what a process would have of its
own: the working directory, the environment (`env` replaces it, as subprocess does), standard
input, output and error, and the SIGTERM handler are set for the call and put back after it. A
usage error (argparse's exit) gives its status; an exception main() lets through is printed as a
traceback with status 1, as the interpreter would, so a test asserting "no traceback" still sees
one. Tests where the process boundary itself is the subject (the console script's exit status,
what `lookup` imports, signals, concurrent processes) keep running real processes.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Mapping, Sequence


def run_efabuild(args: Sequence[str | os.PathLike], *, cwd: str | os.PathLike | None = None,
                 env: Mapping[str, str] | None = None, input: str | bytes | None = None,  # noqa: A002
                 text: bool = True, check: bool = False, capture_output: bool = True,
                 timeout: float | None = None, stdin: int | None = None) -> subprocess.CompletedProcess:
    """Like `subprocess.run([sys.executable, "-m", "efabuild", *args], capture_output=True, ...)`;
    `capture_output`, `timeout` and `stdin` are accepted for that likeness: output is always
    captured, standard input is `input` or empty (as `subprocess.DEVNULL` gives), and a call in
    this process cannot be timed out (the test run's own timeout applies)."""
    del capture_output, timeout, stdin
    from efabuild.cli import main

    argv = [os.fspath(arg) for arg in args]
    out, err = io.BytesIO(), io.BytesIO()
    data = input.encode() if isinstance(input, str) else (input or b"")
    saved_streams = sys.stdin, sys.stdout, sys.stderr
    saved_cwd, saved_env = os.getcwd(), dict(os.environ)
    saved_sigterm = signal.getsignal(signal.SIGTERM)
    try:
        if cwd is not None:
            os.chdir(cwd)
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        sys.stdin = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
        sys.stdout = io.TextIOWrapper(out, encoding="utf-8", errors="backslashreplace", write_through=True)
        sys.stderr = io.TextIOWrapper(err, encoding="utf-8", errors="backslashreplace", write_through=True)
        code = _call(main, argv)
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        stdout, stderr = out.getvalue(), err.getvalue()  # before a wrapper's end closes its buffer
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        os.chdir(saved_cwd)
        if env is not None:
            os.environ.clear()
            os.environ.update(saved_env)
        signal.signal(signal.SIGTERM, saved_sigterm)
    if text:  # as subprocess's text mode reads them: UTF-8, universal newlines
        stdout, stderr = (_text(b) for b in (stdout, stderr))
    done = subprocess.CompletedProcess(["efabuild", *argv], code, stdout, stderr)
    if check:
        done.check_returncode()
    return done


def _call(main, argv: list[str]) -> int:  # noqa: ANN001 - efabuild.cli.main
    try:
        return int(main(argv) or 0)
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


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")

