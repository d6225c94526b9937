"""Progress of long byte transfers: bytes done, rate, ETA.

The library never picks a stream itself: lines go to the stream given, else to the one the CLI
installed with `use` (its stderr), else nowhere. On a terminal one line is redrawn in place (at most every 0.2 s); otherwise (CI logs, Slurm
output files) a plain line is written at each quarter and one at the end, so logs stay short.
Thread-safe: parallel part uploads/downloads call `update` from worker threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TextIO

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")

_sink: Callable[[], TextIO] | None = None


def use(sink: Callable[[], TextIO] | None) -> None:
    """Write progress to `sink()` from now on (the CLI: its stderr of the moment); None: nowhere."""
    global _sink
    _sink = sink


def human_bytes(count: float) -> str:
    """1536 -> '1.5 KiB'; whole bytes below 1 KiB."""
    value = float(count)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_duration(seconds: float) -> str:
    """75 -> '1m15s'; 3725 -> '1h02m'; under a minute '42s'."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


# a rate over less time than this says nothing (a first read of a full pipe in microseconds: TiB/s)
MIN_RATE_S = 0.5


def rate_of(done: int, elapsed: float) -> float | None:
    return done / elapsed if elapsed >= MIN_RATE_S else None


def status_text(label: str, done: int, total: int | None, elapsed: float, *, estimate: bool = False) -> str:
    """'fetch 0123abcd: 6.2 GiB / 25.0 GiB (25%), 310.0 MiB/s, ETA 1m03s'. An `estimate` total (an
    export's image size: the tar stream is larger) is shown as '~', grows with what is done and
    stays below 100% until the end."""
    rate = rate_of(done, elapsed)
    parts = [f"{label}: {human_bytes(done)}"]
    if total:
        shown_total = max(total, done) if estimate else total
        percent = min(99 if estimate else 100, 100 * done // shown_total)
        parts[0] += f" / {'~' if estimate else ''}{human_bytes(shown_total)} ({percent}%)"
    if rate is not None:
        parts.append(f"{human_bytes(rate)}/s")
        if total and rate > 0 and done < total:
            parts.append(f"ETA {human_duration((total - done) / rate)}")
    return ", ".join(parts)


class Progress:
    """with Progress("upload abc", total) as p: p.update(n) ... — to `stream`, else the installed sink."""

    def __init__(
        self,
        label: str,
        total: int | None,
        *,
        stream: TextIO | None = None,
        enabled: bool = True,
        min_total: int = 32 * 1024 * 1024,
        interval: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
        estimate: bool = False,
    ) -> None:
        self.label = label
        self.total = total
        self.estimate = estimate
        self.stream = stream if stream is not None else (_sink() if _sink is not None else None)
        # Small transfers finish before anyone reads a progress line.
        self.enabled = enabled and self.stream is not None and (total is None or total >= min_total)
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval
        self.clock = clock
        self.done = 0
        self._start = clock()
        self._last_draw = -interval
        self._quarter = 0
        self._lock = threading.Lock()
        self._closed = False

    def update(self, count: int) -> None:
        with self._lock:
            self.done += count
            if not self.enabled:
                return
            now = self.clock()
            if self.tty:
                if now - self._last_draw >= self.interval:
                    self._last_draw = now
                    self._write("\r" + status_text(self.label, self.done, self.total, now - self._start, estimate=self.estimate) + "\x1b[K")
            elif self.total:
                quarter = min(3, 4 * self.done // self.total)
                if quarter > self._quarter:
                    self._quarter = quarter
                    self._write(status_text(self.label, self.done, self.total, now - self._start, estimate=self.estimate) + "\n")

    def close(self, ok: bool = True) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if not self.enabled:
                return
            elapsed = self.clock() - self._start
            rate = rate_of(self.done, elapsed)
            end = "done" if ok else "failed"
            line = (f"{self.label}: {end}, {human_bytes(self.done)} in {human_duration(elapsed)}"
                    + (f" ({human_bytes(rate)}/s)" if rate is not None else ""))
            self._write(("\r" + line + "\x1b[K\n") if self.tty else line + "\n")

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False  # stderr gone (closed pipe): keep transferring silently

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.close(ok=exc_type is None)
