"""scale: how `efabuild plan` grows with the number of layers and of context files.

Offline plans (`--offline`: no engine), so that what grows is efabuild's own work: loading the
graph, hashing contexts through the stat cache, computing keys, rendering the table. Each size
is timed cold (first plan: every context file read and hashed) and warm (stat cache filled: the
usual case). Growth is judged on the marginal cost per item between sizes: linear growth keeps
it flat; where it rises by more than half, the curve bends.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import time
from pathlib import Path

from benchmarks import fixtures
from benchmarks.common import Check, Context, Result, Timing, efabuild_command

CHAIN = 10  # layers per chain: every tenth layer starts from the base, the others from a parent
MAX_EXPONENT = 1.15  # fitted growth exponent allowed for "no faster than linear"
BEND = 1.5  # marginal cost rising by this factor between sizes marks a bend


def layers_workspace(root: Path, layers: int, base: str) -> None:
    """`layers` layers in chains of CHAIN, each with a small context file of its own."""
    (root / "graphs").mkdir(parents=True)
    (root / "files").mkdir()
    (root / "BUILD.toml").write_text('[store]\nlocal = "cache"\n')
    lines = ['[graph]\ndescription = "scale"\n']
    for index in range(layers):
        name = f"l{index:05d}"
        context = root / "files" / f"{name}.txt"
        context.write_text(f"layer {index}\n")
        os.utime(context, (fixtures.FIXED_MTIME, fixtures.FIXED_MTIME))
        start = f'base = "{base}"' if index % CHAIN == 0 else f'parent = "l{index - 1:05d}"'
        lines.append(f'[layers.{name}]\n{start}\ncontext = ["files/{name}.txt"]\n'
                     f'dockerfile = """\nCOPY files/{name}.txt /opt/{name}.txt\nRUN echo {index}\n"""\n')
    (root / "graphs" / "scale.toml").write_text("\n".join(lines))


def files_workspace(root: Path, files: int, base: str) -> None:
    """One layer whose context is a directory of `files` small files."""
    (root / "graphs").mkdir(parents=True)
    (root / "BUILD.toml").write_text('[store]\nlocal = "cache"\n')
    (root / "graphs" / "scale.toml").write_text(
        f'[layers.app]\nbase = "{base}"\ncontext = ["app"]\ndockerfile = "COPY app/ /app/"\n')
    fixtures.context_tree(root / "app", files)


def plan_seconds(root: Path, repeats: int) -> tuple[float, Timing]:
    """(cold plan, warm plans) of the workspace at `root`."""
    command = [*efabuild_command(), "plan", "--offline"]

    def once() -> float:
        started = time.perf_counter()
        subprocess.run(command, cwd=root, stdout=subprocess.DEVNULL, check=True)
        return time.perf_counter() - started

    cold = once()
    return cold, Timing(f"{root.name} warm", tuple(once() for _ in range(repeats)))


def growth(sizes: tuple[int, ...], seconds: list[float]) -> dict:
    """Marginal cost per item between sizes, the fitted exponent of the size-dependent part, and
    where (if anywhere) the marginal cost rises by more than BEND."""
    marginal = [(seconds[i + 1] - seconds[i]) / (sizes[i + 1] - sizes[i]) for i in range(len(sizes) - 1)]
    # t(n) = a + b·n^k; from three points: (t3 - t1) / (t2 - t1) = (n3^k - n1^k) / (n2^k - n1^k)
    exponent = None
    if len(sizes) >= 3 and seconds[1] > seconds[0] and seconds[2] > seconds[0]:
        target = (seconds[2] - seconds[0]) / (seconds[1] - seconds[0])
        lo, hi = 0.2, 3.0
        n1, n2, n3 = sizes[0], sizes[1], sizes[2]
        for _ in range(60):
            k = (lo + hi) / 2
            if (n3 ** k - n1 ** k) / (n2 ** k - n1 ** k) < target:
                lo = k
            else:
                hi = k
        exponent = round((lo + hi) / 2, 2)
    bend = None
    for i in range(1, len(marginal)):
        if marginal[i - 1] > 0 and marginal[i] > BEND * marginal[i - 1]:
            bend = f"between {sizes[i]} and {sizes[i + 1]}"
            break
    return {"sizes": list(sizes), "seconds": [round(s, 4) for s in seconds],
            "marginal_us_per_item": [round(m * 1e6, 1) for m in marginal],
            "exponent": exponent, "bends": bend}


def scenario(ctx: Context) -> Result:
    base = fixtures.busybox_image()
    scratch = ctx.scratch("scale")
    timings: list[Timing] = []
    figures: dict = {}
    checks = []
    for kind, sizes, make in (("layers", ctx.sizes.scale_layers, layers_workspace),
                              ("files", ctx.sizes.scale_files, files_workspace)):
        cold_s, warm_s, warm_best = [], [], []
        for size in sizes:
            root = scratch / f"{kind}-{size}"
            ctx.log(f"scale: {size} {kind}")
            make(root, size, base)
            cold, warm = plan_seconds(root, max(ctx.repeats, 3))
            cold_s.append(cold)
            warm_s.append(warm.median)
            warm_best.append(min(warm.seconds))
            timings.append(warm)
            shutil.rmtree(root, ignore_errors=True)
        # the fit uses the fastest of the warm runs: the one least disturbed by other load
        figures[kind] = {"warm": growth(sizes, warm_best), "warm_median_seconds": [round(s, 4) for s in warm_s],
                         "cold": growth(sizes, cold_s)}
        warm_fit = figures[kind]["warm"]
        exponent = warm_fit["exponent"] if warm_fit["exponent"] is not None else math.nan
        largest = f"{warm_s[-1]:.2f} s at {sizes[-1]}"
        checks.append(Check(f"growth exponent, {kind} {sizes[0]}→{sizes[-1]}", exponent, MAX_EXPONENT,
                            "lower", unit="", efabuild=largest,
                            baseline=f"{warm_s[0]:.2f} s at {sizes[0]}"))
    return Result(
        id="scale",
        what="plan time vs layers and context files (warm, offline)",
        checks=tuple(checks),
        timings=tuple(timings),
        figures=figures,
        notes=("exponent k of t(n) = a + b·n^k through the three sizes (fastest warm run of each): "
               "1 is linear; n/a when noise hides the growth",),
    )
