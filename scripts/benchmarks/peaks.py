"""The peak resident memory of every process a step starts, sampled from /proc.

A process's VmHWM is its own high-water mark, kept by the kernel, so a sample taken any time before
it exits holds every peak until then: sampling every 50 ms misses at most what a process reached in
its last 50 ms. RUSAGE_CHILDREN would give only the largest of all reaped descendants together.
The engine's daemons are not descendants of the benchmark: their resident size (VmRSS, not their
lifetime's high-water mark) is sampled by name beside them.
"""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks.common import Sampler

DAEMONS = ("dockerd", "containerd", "buildkitd")


def _status(pid: str) -> dict[str, str]:
    fields = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, value = line.partition(":")
                fields[name] = value.strip()
    except OSError:
        pass
    return fields


def _kib(value: str | None) -> int:
    return int(value.split()[0]) * 1024 if value else 0


def _program(pid: str, name: str) -> str:
    """A process's program: its name, or for Python the script or module it runs."""
    if not name.startswith("python"):
        return name
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode(errors="replace").split("\0")[1:]
    except OSError:
        return name
    for i, arg in enumerate(args):
        if arg == "-c":
            return "python -c"
        if arg == "-m" and i + 1 < len(args):
            return f"python -m {args[i + 1]}"
        if arg and not arg.startswith("-"):
            return f"python {Path(arg).name}"
    return name


class ProcessPeaks(Sampler):
    """Samples, while open, every descendant of this process and the engine's daemons; `peaks`
    maps a program's name to the largest resident size any process of that name reached."""

    def __init__(self, interval: float = 0.05) -> None:
        super().__init__(interval)
        self.root = os.getpid()
        self.peaks: dict[str, int] = {}
        # anonymous memory alone (RssAnon, sampled): what a process holds beyond the page cache's
        # file pages it maps, which the kernel can reclaim (an mmap'd .sqsh read through counts in VmHWM)
        self.anon: dict[str, int] = {}

    def sample(self) -> None:
        parents: dict[str, str] = {}
        statuses: dict[str, dict[str, str]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                status = _status(entry.name)
                if status:
                    statuses[entry.name] = status
                    parents[entry.name] = status.get("PPid", "0")
        root = str(self.root)
        for pid, status in statuses.items():
            name = status.get("Name", "?")
            if name in DAEMONS:
                self._keep(f"{name} (engine, resident)", _kib(status.get("VmRSS")))
                continue
            ancestor, hops = parents.get(pid), 0
            while ancestor and ancestor != root and ancestor != "0" and hops < 64:
                ancestor, hops = parents.get(ancestor), hops + 1
            if ancestor == root and pid != root:
                program = _program(pid, name)
                self._keep(program, _kib(status.get("VmHWM")))
                self._keep(program, _kib(status.get("RssAnon")), self.anon)

    def _keep(self, name: str, size: int, into: dict[str, int] | None = None) -> None:
        kept = self.peaks if into is None else into
        if size > kept.get(name, 0):
            kept[name] = size
