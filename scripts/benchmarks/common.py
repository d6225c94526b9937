"""What every scenario shares: sizes, timing, results, and small measuring helpers."""

from __future__ import annotations

import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

MiB = 1 << 20
GiB = 1 << 30
REPO_ROOT = Path(__file__).resolve().parents[2]
NOT_AT_THIS_SIZE = "n/a at this size"  # a full-size target measured with --quick


@attrs.frozen
class Sizes:
    """How big each scenario's data is: realistic by default, small with --quick."""

    plan_context_files: int
    hash_bytes: int
    export_small_files: int
    export_large_files: int
    export_large_bytes: int  # each
    s3_bytes: int
    lookup_runs: int
    scale_layers: tuple[int, ...]
    scale_files: tuple[int, ...]
    sign_verify_bytes: int  # the artifact verified cold by the sign scenario
    chunked_large_files: int
    chunked_large_bytes: int  # each
    chunked_small_files: int
    real_bytes: int  # scale-real: the real packages and generated files together
    real_files: int

    @classmethod
    def full(cls) -> Sizes:
        return cls(
            plan_context_files=10_000,
            hash_bytes=4 * GiB,
            export_small_files=20_000,
            export_large_files=4,
            export_large_bytes=320 * MiB,
            s3_bytes=2 * GiB,
            lookup_runs=30,
            scale_layers=(100, 1_000, 5_000),  # below ~100 layers start-up hides the growth
            scale_files=(1_000, 10_000, 100_000),
            sign_verify_bytes=1536 * MiB,
            chunked_large_files=4,
            chunked_large_bytes=320 * MiB,
            chunked_small_files=20_000,
            real_bytes=5 * GiB,
            real_files=100_000,
        )

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            plan_context_files=2_000,
            hash_bytes=256 * MiB,
            export_small_files=2_000,
            export_large_files=2,
            export_large_bytes=48 * MiB,
            s3_bytes=96 * MiB,
            lookup_runs=15,
            scale_layers=(50, 400, 1_600),
            scale_files=(1_000, 4_000, 16_000),
            sign_verify_bytes=64 * MiB,
            chunked_large_files=2,
            chunked_large_bytes=16 * MiB,
            chunked_small_files=1_000,
            real_bytes=384 * MiB,
            real_files=5_000,
        )


@attrs.frozen
class Context:
    quick: bool
    sizes: Sizes
    repeats: int
    work: Path  # scratch directory of this run (removed at the end unless kept)
    log: Callable[[str], None]

    def scratch(self, name: str) -> Path:
        path = self.work / name
        path.mkdir(parents=True, exist_ok=True)
        return path


@attrs.frozen
class Timing:
    """Wall times of one command or call, repeated."""

    label: str
    seconds: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "median": round(self.median, 6),
                "seconds": [round(s, 6) for s in self.seconds]}


@attrs.frozen
class Check:
    """One figure with its target: `value` compared with `target` by `better` ("higher"/"lower")."""

    name: str
    value: float
    target: float
    better: str  # "higher": value ≥ target meets it; "lower": value ≤ target does
    unit: str = "×"  # how value and target print: "×" (ratio), "%" or "" (a plain number)
    efabuild: str = ""  # what efabuild measured, printed
    baseline: str = ""  # what the baseline measured, printed
    # the target holds only on full-size data: a --quick image is so small that one changed chunk
    # is percents of it, and fixed costs outweigh the transfer
    full_size_only: bool = False

    @property
    def met(self) -> bool:
        return self.value >= self.target if self.better == "higher" else self.value <= self.target

    def applies(self, quick: bool) -> bool:
        return not (quick and self.full_size_only)

    def verdict(self, quick: bool) -> str:
        """What the table's "met" column says."""
        if not self.applies(quick):
            return NOT_AT_THIS_SIZE
        return "yes" if self.met else "NO"

    def shown(self, number: float) -> str:
        if math.isnan(number):
            return "n/a"
        if self.unit == "×":
            return f"{number:.2f}×" if number < 10 else f"{number:.1f}×"
        if self.unit == "%":
            return f"{number:.1f}%"
        return f"{number:.2f}"

    @property
    def target_text(self) -> str:
        return ("≥ " if self.better == "higher" else "≤ ") + self.shown(self.target)

    def to_json(self, quick: bool = False) -> dict[str, Any]:
        value = None if math.isnan(self.value) else round(self.value, 4)  # JSON has no NaN
        return {"name": self.name, "value": value, "target": self.target,
                "better": self.better, "unit": self.unit, "met": self.met,
                "full_size_only": self.full_size_only, "applies": self.applies(quick),
                "efabuild": self.efabuild, "baseline": self.baseline}


@attrs.frozen
class Result:
    id: str
    what: str
    checks: tuple[Check, ...] = ()
    timings: tuple[Timing, ...] = ()
    figures: dict[str, Any] = attrs.field(factory=dict)  # sizes, counts, extra measurements
    notes: tuple[str, ...] = ()
    error: str | None = None
    seconds: float = 0.0  # wall time of the whole scenario, set-up included

    def to_json(self, quick: bool = False) -> dict[str, Any]:
        return {
            "id": self.id, "what": self.what, "error": self.error, "seconds": round(self.seconds, 2),
            "met": None if self.error else all(c.met for c in self.checks if c.applies(quick)),
            "checks": [c.to_json(quick) for c in self.checks],
            "timings": [t.to_json() for t in self.timings],
            "figures": self.figures, "notes": list(self.notes),
        }


# ---------------------------------------------------------------- measuring


def interleaved(repeats: int, runs: Sequence[tuple[str, Callable[[], Any]]],
                before: Callable[[], Any] | None = None) -> list[Timing]:
    """Time each run `repeats` times, alternating between them so drift hits all alike.

    `before` runs (untimed) before every timed run, e.g. to remove the previous output.
    """
    seconds: dict[str, list[float]] = {label: [] for label, _ in runs}
    for _ in range(repeats):
        for label, run in runs:
            if before is not None:
                before()
            started = time.perf_counter()
            run()
            seconds[label].append(time.perf_counter() - started)
    return [Timing(label, tuple(seconds[label])) for label, _ in runs]


def run(command: Sequence[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
        input: bytes | None = None, quiet: bool = True) -> subprocess.CompletedProcess:
    """Run a command to completion; a failure raises with its last output lines."""
    done = subprocess.run(
        list(command), cwd=cwd, env=None if env is None else {**os.environ, **env}, input=input,
        stdout=subprocess.PIPE if quiet else None, stderr=subprocess.PIPE,
        stdin=None if input is not None else subprocess.DEVNULL,
    )
    if done.returncode != 0:
        tail = (done.stderr or b"").decode(errors="replace").strip().splitlines()[-5:]
        raise BenchError(f"`{' '.join(map(str, command[:4]))}…` exited {done.returncode}: {' | '.join(tail)}")
    return done


class BenchError(RuntimeError):
    pass


def python() -> str:
    """The interpreter running efabuild (not a version manager's shim, which adds its own start-up)."""
    return sys.executable


def byte_compile_efabuild() -> None:
    """Byte-compile the efabuild package the commands import, as `pip install` leaves it: a
    start-up timing must not include compiling its source (PYTHONDONTWRITEBYTECODE, or a checkout
    nothing has run from yet, would make every run compile it again). Asked from outside any
    checkout: run from one, `python -c` would find that checkout's efabuild first, not the one the
    console script imports, whose stale files would then be compiled again in every timed run."""
    found = subprocess.run([python(), "-c", "import efabuild; print(efabuild.__path__[0])"],
                           capture_output=True, text=True, check=True, cwd="/")
    subprocess.run([python(), "-m", "compileall", "-q", found.stdout.strip()], check=True,
                   stdout=subprocess.DEVNULL)


def efabuild_command() -> list[str]:
    """The `efabuild` console script beside the interpreter, as a job script would run it."""
    beside = Path(sys.executable).parent / "efabuild"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("efabuild")
    return [found] if found else [sys.executable, "-m", "efabuild"]


def allocated_bytes(path: Path) -> int:
    """Disk blocks a file or tree occupies (what `du` counts), hard links once."""
    total, seen = 0, set()
    stack = [path]
    while stack:
        current = stack.pop()
        try:
            st = current.lstat()
        except FileNotFoundError:
            continue
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
        if current.is_dir() and not current.is_symlink():
            try:
                stack.extend(current.iterdir())
            except FileNotFoundError:
                continue
    return total


class Sampler:
    """Calls `sample()` every `interval` seconds on a thread while open, and once more on closing."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self):  # noqa: ANN204 - the sampler itself
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


class PeakSize(Sampler):
    """Samples how much disk a directory occupies while a step runs; `peak` is the largest seen.

    Sampling can miss a short-lived peak, so it is used only where the expected answer is "the
    output file and nothing else" (a missed temp file would only flatter the baseline, not us).
    """

    def __init__(self, directory: Path, interval: float = 0.02) -> None:
        super().__init__(interval)
        self.directory = directory
        self.peak = 0

    def sample(self) -> None:
        self.peak = max(self.peak, _flat_allocated(self.directory))


def _flat_allocated(directory: Path) -> int:
    total = 0
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                try:
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
                except FileNotFoundError:
                    pass
    except FileNotFoundError:
        pass
    return total


def io_counters() -> dict[str, int]:
    """This process's I/O counters: rchar counts bytes read through read(2)/pread(2) & co."""
    counters = {}
    with open("/proc/self/io") as f:
        for line in f:
            name, _, value = line.partition(":")
            counters[name.strip()] = int(value)
    return counters


def drop_file(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def write_random_file(path: Path, size: int, seed: int) -> None:
    """`size` pseudo-random bytes (incompressible, not deduplicable), written in 64 MiB chunks."""
    import random

    rng = random.Random(seed)
    chunk = 64 * MiB
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(chunk, left)
            f.write(rng.randbytes(n))
            left -= n


def warm(path: Path) -> None:
    """Read a file once so that timed reads find it in the page cache."""
    with open(path, "rb") as f:
        while f.read(8 * MiB):
            pass


def settled(path: Path) -> None:
    """Wait until the file has not changed for the stamp window: a node's previous version was
    fetched by an earlier job, not seconds before, and a fetch lends a seed's units only once its
    stamp has settled (store/chunked/assembly.py). Without this a scenario's result depended on
    whether its steps before the fetch took more than 2 s."""
    from efabuild.host import statstamp

    info = os.stat(path)
    wait = (max(info.st_mtime_ns, info.st_ctime_ns) + statstamp.RACY_WINDOW_NS - statstamp.clock_ns()) / 1e9
    if wait > 0:
        time.sleep(wait + 0.05)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_seconds(s: float) -> str:
    if s < 1:
        return f"{s * 1000:.0f} ms"
    return f"{s:.2f} s"
