"""Progress of a make on stderr, as `--progress` asks (buildx's names): `tty` a live view per
layer, `plain` one line per event, `json` one JSON object per event; `auto` is `tty` on a terminal
(not TERM=dumb), else `plain`. States and outcomes are coloured on a terminal (cli/colour.py).
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from efabuild.make.reporter import Reporter
from efabuild.cli.colour import Palette, wanted
from efabuild.cli.output import compact_json
from efabuild.display import shown

PROGRESS_FORMAT = "efabuild.progress/v1"
PLANNING = "gathering facts for the plan: build contexts, the engine's images, the store…"


class PlainReporter(Reporter):
    """Plain lines: one when a layer starts, one when it ends. Safe to call from worker threads."""

    def __init__(self, out: TextIO | None = None, palette: Palette | None = None) -> None:
        self.out = out or sys.stderr
        self.palette = palette or Palette(False)
        self._lock = threading.Lock()

    def say(self, text: str) -> None:
        with self._lock:
            self._write(text)

    def _write(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def planning(self) -> None:
        """The plan is taking a while: say what it is doing."""
        self.say(f"efabuild: {PLANNING}")

    def started(self, name: str, action: str, detail: str = "") -> None:
        self.say(f"[{name}] {action}{': ' + shown(detail) if detail else ''}")

    def line(self, name: str, text: str) -> None:
        """A line of a layer's build log: only the live view shows these."""

    def finished(self, outcome) -> None:  # noqa: ANN001
        self.say(f"[{outcome.qualname}] {describe(outcome, self.palette)}")


def describe(outcome, palette: Palette) -> str:  # noqa: ANN001
    """How a layer ended, in words. A failure's message is shown once, after the summary."""
    status = palette.state(outcome.status)
    if outcome.status == "failed":
        return f"{status} after {outcome.seconds:.1f}s"
    if outcome.status == "skipped":
        return f"{status}: {outcome.error}"
    steps = " + ".join(outcome.steps) or "nothing to do"
    text = f"{status} ({steps}) in {outcome.seconds:.1f}s"
    if outcome.log:
        text += f"\n  log: {outcome.log}"
    if outcome.artifact:
        text += f"\n  artifact: {outcome.artifact}"
    return text


class LiveReporter(PlainReporter):
    """A block at the bottom of the terminal with the latest log line of every running layer,
    names and times in aligned columns."""

    def __init__(self, out: TextIO | None = None, palette: Palette | None = None) -> None:
        super().__init__(out, palette)
        self._active: dict[str, tuple[str, float, str]] = {}  # name -> (action, start, last line)
        self._drawn = 0
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, daemon=True)
        self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                self._redraw()

    def _clear(self) -> None:
        if self._drawn:
            self.out.write(f"\x1b[{self._drawn}F\x1b[J")
            self._drawn = 0

    def _redraw(self) -> None:
        self._clear()
        width = shutil.get_terminal_size((100, 20)).columns
        now = time.monotonic()
        name_width = max((len(name) for name in self._active), default=0)
        action_width = max((len(action) for action, _, _ in self._active.values()), default=0)
        for name, (action, start, last) in self._active.items():
            head = f"  {name:<{name_width}}  {action:<{action_width}}  {now - start:5.0f}s  "
            self.out.write((head + last)[: width - 1] + "\n")
        self._drawn = len(self._active)
        self.out.flush()

    def _write(self, text: str) -> None:
        self._clear()
        print(text, file=self.out)
        self._redraw()

    def started(self, name: str, action: str, detail: str = "") -> None:
        with self._lock:
            self._active[name] = (action, time.monotonic(), shown(detail))
            self._write(f"[{name}] {action}{': ' + shown(detail) if detail else ''}")

    def line(self, name: str, text: str) -> None:
        with self._lock:
            if name in self._active:
                action, start, _ = self._active[name]
                # a build's output line: its escapes shown, not sent to the terminal
                self._active[name] = (action, start, shown(text.strip()))

    def finished(self, outcome) -> None:  # noqa: ANN001
        with self._lock:
            self._active.pop(outcome.qualname, None)
            self._write(f"[{outcome.qualname}] {describe(outcome, self.palette)}")

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            self._clear()
            self.out.flush()


class JsonReporter(PlainReporter):
    """One JSON object per line and event, for a program following a make; every object carries
    `format` and `event`, and the JSON convention's field names (name, key, path; null, not "")."""

    def emit(self, event: str, **fields: object) -> None:
        self.say(compact_json({"format": PROGRESS_FORMAT, "event": event, **fields}))

    def planning(self) -> None:
        self.emit("planning", message=PLANNING)

    def started(self, name: str, action: str, detail: str = "") -> None:
        self.emit("started", name=name, action=action, detail=detail or None)

    def line(self, name: str, text: str) -> None:
        self.emit("log", name=name, line=text)

    def finished(self, outcome) -> None:  # noqa: ANN001
        self.emit("finished", **outcome_json(outcome))

    def notice(self, kind: str, message: str) -> None:
        """What the library reports (efabuild.notices) during the make, as an event too."""
        self.emit(kind, message=message)


def outcome_json(outcome, path: str | None = None) -> dict:  # noqa: ANN001
    """One layer's outcome in the JSON convention (make --json and the progress events)."""
    return {"name": outcome.qualname, "key": outcome.key, "status": outcome.status,
            "seconds": round(outcome.seconds, 3), "steps": list(outcome.steps), "log": outcome.log or None,
            "path": path or outcome.artifact or None, "error": outcome.error or None}


def chosen_mode(mode: str, stream: TextIO, environ=os.environ) -> str:  # noqa: ANN001
    """`auto` made concrete: the live view on a terminal that can move its cursor, else lines."""
    if mode != "auto":
        return mode
    isatty = getattr(stream, "isatty", None)
    return "tty" if isatty and isatty() and environ.get("TERM") != "dumb" else "plain"


def reporter_for(stream: TextIO | None = None, mode: str = "auto", environ=os.environ) -> PlainReporter:  # noqa: ANN001
    stream = stream or sys.stderr
    mode = chosen_mode(mode, stream, environ)
    if mode == "json":
        return JsonReporter(stream)
    palette = Palette(wanted(stream, environ))
    return LiveReporter(stream, palette) if mode == "tty" else PlainReporter(stream, palette)


def planning_line(stream: TextIO, mode: str) -> Callable[[], None]:
    """What to say while a long plan gathers facts, in the progress mode's own form."""
    return (JsonReporter(stream) if mode == "json" else PlainReporter(stream)).planning


class announce_after:  # noqa: N801 - used as a context manager, named for what it does
    """Call `say()` once if the block takes longer than `seconds`: a long plan shows a line
    while it gathers facts, a quick one shows nothing."""

    def __init__(self, say: Callable[[], None], seconds: float = 1.0) -> None:
        self.timer = threading.Timer(seconds, say)
        self.timer.daemon = True

    def __enter__(self) -> None:
        self.timer.start()

    def __exit__(self, *exc: object) -> None:
        self.timer.cancel()
