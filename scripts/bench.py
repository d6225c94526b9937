#!/usr/bin/env python3
"""Benchmark efabuild against what users would otherwise run, side by side.

    python scripts/bench.py            realistic sizes (GB-scale artifacts, 10k-file contexts)
    python scripts/bench.py --quick    the whole set on small sizes, in about two minutes
    python scripts/bench.py --only hash,lookup

Prints a table and writes JSON (default bench-results/bench.json). Every figure is a ratio
against a baseline measured in the same run on the same data; each time is the median of a few
repeats. Needs the Docker engine with buildx, squashfs-tools and busybox-static
(`bash scripts/setup-host.sh`); the S3 scenarios start their own loopback S3 server.
Scenarios: plan, hash, export, farm, incremental, publish, fetch, chunked, lookup, importer, scale, scale-real,
sign, lint, children (scale-real uses the real packages of scripts/fetch-real-binaries.py, fetched if
missing); `--only platforms` also runs the two-platform plan and the emulated arm64 build (it needs QEMU),
`--only lazy` a cold node's start from the artifact's chunks through `efabuild mount` (it needs FUSE).

The JSON is one run: its id, the commit (and whether the tree had changes), start and end, and the
load average before and after; `scripts/make-docs.py` writes docs/performance.md from it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmarks.common import REPO_ROOT, Context, Result, Sizes, human_bytes  # noqa: E402

SCENARIOS = ("plan", "hash", "export", "farm", "incremental", "publish", "fetch", "chunked", "lookup", "importer",
             "scale", "scale-real", "sign", "lint", "children")
# run only when named: platforms needs QEMU and Debian's arm64 packages (scripts/setup-host.sh); lazy
# (FUSE) joins the default set once a full-size run of it is committed
OPT_IN = ("platforms", "lazy")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: the whole set in about two minutes")
    parser.add_argument("--only", metavar="IDS",
                        help=f"comma-separated scenarios ({', '.join(SCENARIOS + OPT_IN)})")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per measurement (median reported)")
    parser.add_argument("--json-out", metavar="PATH", default=str(REPO_ROOT / "bench-results" / "bench.json"),
                        help="where to write the JSON results (default: bench-results/bench.json)")
    parser.add_argument("--work-dir", metavar="DIR", help="scratch space (default: a new temp directory)")
    parser.add_argument("--keep-work", action="store_true", help="keep the scratch directory afterwards")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    args.selected = SCENARIOS
    if args.only:
        wanted = tuple(s.strip() for s in args.only.split(",") if s.strip())
        unknown = [s for s in wanted if s not in SCENARIOS + OPT_IN]
        if unknown:
            parser.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS + OPT_IN)}")
        args.selected = tuple(s for s in SCENARIOS + OPT_IN if s in wanted)
    return args


def run_scenarios(ctx: Context, selected: tuple[str, ...]) -> list[Result]:
    """Run the selected scenarios in order; a failing one is reported and the rest still run."""
    import importlib

    # scenario -> (module, function); publish and fetch share one S3 server and one artifact
    groups: dict[str, tuple[str, list[str]]] = {}
    for name in selected:
        module = {"plan": "plan_noop", "hash": "hashing", "publish": "s3", "fetch": "s3",
                  "sign": "signing", "lint": "lint_scale", "farm": "farm_export",
                  "scale-real": "scale_real"}.get(name, name)
        groups.setdefault(module, (module, []))[1].append(name)
    results: list[Result] = []
    for module_name, ids in groups.values():
        started = time.perf_counter()
        try:
            module = importlib.import_module(f"benchmarks.{module_name}")
            produced = module.scenarios(ctx, ids) if module_name == "s3" else [module.scenario(ctx)]
        except Exception as exc:  # one broken scenario must not hide the others' figures
            ctx.log("".join(traceback.format_exception(exc)).rstrip())
            produced = [Result(id=i, what="(failed)", error=f"{type(exc).__name__}: {exc}") for i in ids]
        elapsed = time.perf_counter() - started
        results += [_with_seconds(result, elapsed / len(produced)) for result in produced]
    return results


def _with_seconds(result: Result, seconds: float) -> Result:
    import attrs

    return attrs.evolve(result, seconds=seconds)


def render(results: list[Result], quick: bool = False) -> str:
    header = ["scenario", "measure", "efabuild", "baseline", "figure", "target", "met"]
    rows = []
    for result in results:
        if result.error:
            rows.append([result.id, "ERROR", "", "", "", "", result.error[:100]])
            continue
        for check in result.checks:
            rows.append([result.id, check.name, check.efabuild, check.baseline, check.shown(check.value),
                         check.target_text, check.verdict(quick)])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def machine() -> dict:
    def out(*command: str) -> str | None:
        try:
            done = subprocess.run(list(command), capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        text = (done.stdout or done.stderr).strip()
        return text.splitlines()[0] if text else None

    def version(module: str) -> str | None:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as dist_version

        try:
            return dist_version(module)
        except PackageNotFoundError:
            return None

    mem_kib = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    cpu = None
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    disk = shutil.disk_usage(tempfile.gettempdir())
    return {
        "nproc": os.cpu_count(), "cpu": cpu, "memory": human_bytes(mem_kib * 1024),
        "disk_total": human_bytes(disk.total), "kernel": platform.release(),
        "python": platform.python_version(),
        "docker": out("docker", "version", "--format", "{{.Server.Version}}"),
        "buildx": out("docker", "buildx", "version"),
        "mksquashfs": out("mksquashfs", "-version"),
        "efabuild": version("efabuild"), "blake3": version("blake3"), "boto3": version("boto3"),
        "moto": version("moto"), "python_on_whales": version("python-on-whales"),
    }


def run_identity() -> dict:
    """What makes the JSON one run: an id, the commit (and whether the tree had changes beside
    it), when it started and the load average the machine had before it."""
    import uuid

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {"run_id": uuid.uuid4().hex[:12], "commit": git("rev-parse", "HEAD"),
            "dirty": None if status is None else bool(status),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load_before": [round(x, 2) for x in os.getloadavg()]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def log(message: str) -> None:
        print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    run = run_identity()  # before anything runs: the commit and load the figures belong to
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="efabuild-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    ctx = Context(quick=args.quick, sizes=Sizes.quick() if args.quick else Sizes.full(),
                  repeats=args.repeats, work=work, log=log)
    started = time.perf_counter()
    try:
        results = run_scenarios(ctx, args.selected)
    finally:
        if not args.keep_work:
            shutil.rmtree(work, ignore_errors=True)
    total = time.perf_counter() - started
    print(render(results, ctx.quick))
    data = {
        "mode": "quick" if args.quick else "full",
        "repeats": args.repeats,
        **run,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(total, 1),
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "selected": list(args.selected),
        "machine": machine(),
        "scenarios": [r.to_json(ctx.quick) for r in results],
    }
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    os.replace(tmp, out)
    print(f"\n{len(results)} scenarios in {total:.0f} s; JSON: {out}")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
