"""children: a program started so that it dies with efabuild (efabuild.host.children: the kernel's
parent-death signal, forked by one long-lived thread) against plain subprocess.run, for the
quickest program efabuild starts often (`docker --version`, the CLI's own start-up) and for `true`.

The parent-death signal needs a preexec function, so Python forks instead of using vfork: the cost
is a few milliseconds per program, against programs that run for tens of milliseconds to hours.
"""

from __future__ import annotations

import subprocess

from benchmarks.common import Check, Context, Result, interleaved

TARGET = 1.25


def scenario(ctx: Context) -> Result:
    from efabuild.host import children

    runs = ctx.sizes.lookup_runs * 2
    timings = []
    for program in (["docker", "--version"], ["true"]):
        ctx.log(f"children: timing {runs} starts of {' '.join(program)} each way")
        timings += interleaved(runs, [
            (f"subprocess.run {' '.join(program)}", lambda p=program: subprocess.run(p, capture_output=True, check=True)),
            (f"children.run {' '.join(program)}", lambda p=program: children.run(p, capture_output=True, check=True)),
        ])
    plain_docker, ours_docker, plain_true, ours_true = timings
    return Result(
        id="children",
        what="a program that dies with efabuild vs subprocess.run",
        checks=(Check("docker --version vs subprocess.run", ours_docker.median / plain_docker.median, TARGET,
                      "lower", efabuild=f"{ours_docker.median * 1000:.1f} ms",
                      baseline=f"{plain_docker.median * 1000:.1f} ms (subprocess.run)"),),
        timings=tuple(timings),
        figures={"true_ratio": round(ours_true.median / plain_true.median, 2),
                 "true_added_ms": round((ours_true.median - plain_true.median) * 1000, 2)},
        notes=("figure: time to run the program to its end ÷ the same with subprocess.run (lower is better)",),
    )
