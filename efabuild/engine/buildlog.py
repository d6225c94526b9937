"""Read BuildKit's plain progress output (`--progress plain`) line by line. Pure: no engine.

The lines look like this:

    #7 [stage 3/4] RUN ./efa_installer.sh -y ...      a step starts (repeated when it resumes)
    #7 12.30 E: Unable to locate package ...          the step's output, seconds since its start
    #7 CACHED / #7 DONE 1.2s
    #7 ERROR: process "/bin/sh -c ..." did not complete successfully: exit code: 1
    ERROR: failed to solve: ...                       the build's own verdict, at the end

`BuildLogReader` keeps just enough (the step names, the last lines of each step's output) to say
which step failed and show its last lines, whatever the log's size.
"""

from __future__ import annotations

import re
from collections import deque

import attrs

TAIL_LINES = 15

_STEP_LINE = re.compile(r"^#(\d+) (.*)$")
_OUTPUT = re.compile(r"^(\d+\.\d+) (.*)$")
_EXIT_CODE = re.compile(r"exit code: (\d+)")
# a Dockerfile instruction step: "[2/3] RUN ...", "[build 2/3] COPY ..."
_INSTRUCTION = re.compile(r"^\[(?:[^\]]* )?\d+/\d+\] ")


@attrs.frozen
class BuildFailure:
    """What went wrong, as far as the log says."""

    step: str | None  # e.g. "[2/3] RUN false"; None when no step failed (a bad Dockerfile, ...)
    reason: str  # BuildKit's error text
    exit_code: int | None  # the failing command's exit status, when a command failed
    tail: tuple[str, ...]  # the failing step's last output lines, else the log's last lines


class BuildLogReader:
    """Fed every line of a build's plain output, in order."""

    def __init__(self, tail_lines: int = TAIL_LINES) -> None:
        self._tail_lines = tail_lines
        self._names: dict[str, str] = {}
        self._output: dict[str, deque[str]] = {}
        self._cached: set[str] = set()
        self._ran: set[str] = set()
        self._failed_step: str | None = None
        self._step_error: str | None = None
        self._final_error: str | None = None
        self._last_lines: deque[str] = deque(maxlen=tail_lines)

    def feed(self, line: str) -> None:
        line = line.rstrip("\r\n")
        if line.strip():
            self._last_lines.append(line)
        if line.startswith("ERROR: "):
            self._final_error = line.removeprefix("ERROR: ")
            return
        match = _STEP_LINE.match(line)
        if not match:
            return
        step, rest = match.groups()
        if step not in self._names:
            self._names[step] = rest
            return
        output = _OUTPUT.match(rest)
        if output:
            self._output.setdefault(step, deque(maxlen=self._tail_lines)).append(output.group(2))
            self._ran.add(step)
        elif rest == "CACHED":
            self._cached.add(step)
        elif rest.startswith("DONE"):
            self._ran.add(step)
        elif rest.startswith("ERROR: ") and self._failed_step is None:
            self._failed_step = step
            self._step_error = rest.removeprefix("ERROR: ")

    @property
    def instruction_steps(self) -> list[str]:
        return [step for step, name in self._names.items() if _INSTRUCTION.match(name)]

    @property
    def fully_cached(self) -> bool:
        """True when every Dockerfile instruction came from BuildKit's cache (nothing ran)."""
        steps = [step for step in self.instruction_steps if not self._names[step].split("] ", 1)[1].startswith("FROM ")]
        return bool(steps) and all(step in self._cached for step in steps)

    def failure(self) -> BuildFailure:
        """The failure as the log tells it (call after a build exited non-zero)."""
        if self._failed_step is not None:
            reason = self._step_error or self._final_error or "failed"
            tail = tuple(self._output.get(self._failed_step, ()))
            step: str | None = self._names[self._failed_step]
        else:
            reason = self._final_error or "the build failed without an error message"
            tail = tuple(self._last_lines)
            step = None
        code = _EXIT_CODE.search(reason)
        return BuildFailure(
            step=step,
            reason=reason,
            exit_code=int(code.group(1)) if code else None,
            tail=tail or tuple(self._last_lines),
        )
