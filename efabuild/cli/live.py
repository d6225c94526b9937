"""Progress of a make on stderr: a live view per layer on a terminal, plain lines otherwise."""

from __future__ import annotations

import shutil
import sys
import threading
import time
from typing import TextIO

from efabuild.build.reporter import Reporter


class PlainReporter(Reporter):
    """Plain lines: one when a layer starts, one when it ends. Safe to call from worker threads."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stderr
        self._lock = threading.Lock()

    def say(self, text: str) -> None:
        with self._lock:
            self._write(text)

    def _write(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def started(self, name: str, action: str, detail: str = "") -> None:
        self.say(f"[{name}] {action}{': ' + detail if detail else ''}")

    def line(self, name: str, text: str) -> None:
        """A line of a layer's build log: only the live view shows these."""

    def finished(self, name: str, text: str) -> None:
        self.say(f"[{name}] {text}")


class LiveReporter(PlainReporter):
    """A block at the bottom of the terminal with the latest log line of every running layer."""

    def __init__(self, out: TextIO | None = None) -> None:
        super().__init__(out)
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
        for name, (action, start, last) in self._active.items():
            head = f"  {name} {action} {now - start:5.0f}s "
            self.out.write((head + last)[: width - 1] + "\n")
        self._drawn = len(self._active)
        self.out.flush()

    def _write(self, text: str) -> None:
        self._clear()
        print(text, file=self.out)
        self._redraw()

    def started(self, name: str, action: str, detail: str = "") -> None:
        with self._lock:
            self._active[name] = (action, time.monotonic(), detail)
            self._write(f"[{name}] {action}{': ' + detail if detail else ''}")

    def line(self, name: str, text: str) -> None:
        with self._lock:
            if name in self._active:
                action, start, _ = self._active[name]
                self._active[name] = (action, start, text.strip())

    def finished(self, name: str, text: str) -> None:
        with self._lock:
            self._active.pop(name, None)
            self._write(f"[{name}] {text}")

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            self._clear()
            self.out.flush()


def reporter_for(stream: TextIO | None = None) -> PlainReporter:
    stream = stream or sys.stderr
    return LiveReporter(stream) if stream.isatty() else PlainReporter(stream)
