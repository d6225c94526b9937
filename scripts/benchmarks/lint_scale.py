"""lint: `efabuild lint` on 1k and 10k generated layers, as a ratio of the time per layer.

The same generator as the scale scenario (chains of 10 layers in one graph file, each with its
own context file), linted by the command a user runs (load, evaluate every layer with the ENV it
inherits, every rule, render). The baseline is the smaller workspace in the same run: linear work
keeps the time per layer flat (ratio 1); the quadratic lint this replaced (every layer re-read and
re-split the whole graph file) took 10× as long per layer at 10k as at 1k.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from benchmarks.common import Check, Context, Result, Timing, efabuild_command
from benchmarks.scale import layers_workspace

BASE = "nvcr.io/nvidia/pytorch:26.08-py3"  # an NGC base, so the NGC rules run too; never pulled
MAX_PER_LAYER_RATIO = 1.5  # time per layer at the large size over the small one


def lint_seconds(root: Path, repeats: int) -> Timing:
    command = [*efabuild_command(), "lint", "--json"]
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        done = subprocess.run(command, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        seconds.append(time.perf_counter() - started)
        if done.returncode not in (0, 1):  # 1: findings that are errors, still a full lint
            raise RuntimeError(f"efabuild lint exited {done.returncode}: {done.stderr.decode()[-500:]}")
    return Timing(f"lint {root.name}", tuple(seconds))


def scenario(ctx: Context) -> Result:
    small, large = (200, 2_000) if ctx.quick else (1_000, 10_000)
    scratch = ctx.scratch("lint")
    timings = []
    for size in (small, large):
        root = scratch / f"layers-{size}"
        ctx.log(f"lint: {size} layers")
        layers_workspace(root, size, BASE)
        timings.append(lint_seconds(root, ctx.repeats))
        shutil.rmtree(root, ignore_errors=True)
    per_layer = [timing.median / size for timing, size in zip(timings, (small, large))]
    ratio = per_layer[1] / per_layer[0]
    return Result(
        id="lint",
        what=f"efabuild lint, {small} vs {large} generated layers (time per layer)",
        checks=(Check(f"time per layer, {large} over {small} layers", ratio, MAX_PER_LAYER_RATIO, "lower",
                      efabuild=f"{timings[1].median:.2f} s at {large} ({per_layer[1] * 1e3:.2f} ms a layer)",
                      baseline=f"{timings[0].median:.2f} s at {small} ({per_layer[0] * 1e3:.2f} ms a layer)"),),
        timings=tuple(timings),
        figures={"sizes": [small, large], "seconds_per_layer": [round(p, 6) for p in per_layer]},
        notes=("1.0 is linear; the start-up of the small run makes it lower, quadratic work 10×",),
    )
