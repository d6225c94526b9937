"""platforms: a no-op plan of the demo-shaped graph for linux/amd64 and linux/arm64 against the same
graph for linux/amd64 alone, and the emulated arm64 build of the offline demo fixture.

Both workspaces build on the offline mini NGC base, built for both platforms and joined in one
multi-platform index in a loopback registry (scripts/start-registry.sh), as NGC publishes its tags:
the one-platform plan asks the registry for the tag's digest, the two-platform plan for the index
and picks each platform's manifest from the same answer. arm64 is built under QEMU
(`[builder] emulate`); needs scripts/setup-host.sh's QEMU registration and arm64 packages.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import plan_noop
from benchmarks.common import REPO_ROOT, BenchError, Check, Context, Result, efabuild_command, interleaved, run

TARGET = 1.3  # the two-platform no-op plan takes at most 1.3× the one-platform one
PLATFORMS = ("linux/amd64", "linux/arm64")


def _registry(ctx: Context) -> tuple[str, Path]:
    import socket

    with socket.socket() as sock:  # a free loopback port
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    directory = ctx.scratch("platforms-registry")
    started = run(["bash", str(REPO_ROOT / "scripts/start-registry.sh"), str(port), str(directory)])
    return started.stdout.decode().strip(), directory


def _stop_registry(directory: Path) -> None:
    pidfile = directory / "registry.pid"
    if pidfile.exists():
        subprocess.run(["kill", pidfile.read_text().strip()], capture_output=True)


def _workspace(root: Path, base: str, files: int, platforms: tuple[str, ...]) -> Path:
    plan_noop.make_workspace(root, base, files, artifacts=True)
    builder = f"[builder]\nplatforms = {json.dumps(list(platforms))}\n"
    if "linux/arm64" in platforms:
        builder += 'emulate = ["linux/arm64"]\n'
    (root / "BUILD.toml").write_text('[store]\nlocal = "cache"\n' + builder)
    return root


def _two_platform_demo(root: Path, base: str) -> Path:
    """The shipped demo graph and app/ on the index, for both platforms, with a run-unique ARG the
    first RUN sees: no step is in BuildKit's cache, so its first make is a cold build."""
    import secrets
    import shutil

    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(REPO_ROOT / "app", root / "app", dirs_exist_ok=True)
    (root / "graphs").mkdir(exist_ok=True)
    text = (REPO_ROOT / "graphs" / "demo.toml").read_text()
    text = text.replace('base = "efabuild-fixtures/pytorch:26.08-py3"', f'base = "{base}"')
    text = text.replace("ARG EFA_INSTALLER_VERSION=1.50.0\n", "ARG EFA_INSTALLER_VERSION=1.50.0\nARG BENCH_RUN\n")
    text = text.replace('args = { EFA_INSTALLER_VERSION = "1.50.0" }',
                        f'args = {{ EFA_INSTALLER_VERSION = "1.50.0", BENCH_RUN = "{secrets.token_hex(6)}" }}')
    if "BENCH_RUN" not in text:
        raise BenchError("graphs/demo.toml changed shape: the bench cannot make its build cold")
    (root / "graphs" / "demo.toml").write_text(text)
    (root / "BUILD.toml").write_text('[store]\nlocal = "cache"\n[builder]\nplatforms = ["linux/amd64", '
                                     '"linux/arm64"]\nemulate = ["linux/arm64"]\n')
    return root


def scenario(ctx: Context) -> Result:
    sys.path.insert(0, str(REPO_ROOT))
    from efabuild.engine.client import connect
    from fixtures.builder import build_fixtures, publish_index
    from efabuild.settings import BuilderSettings

    files = ctx.sizes.plan_context_files
    url, registry_dir = _registry(ctx)
    efabuild = efabuild_command()
    try:
        ctx.log("platforms: the fixture base for both platforms, as one index")
        images = build_fixtures(platforms=PLATFORMS)
        base = publish_index(connect(BuilderSettings()), images, PLATFORMS, url).split("@")[0]
        one = _workspace(ctx.scratch("platforms-one"), base, files, PLATFORMS[:1])
        two = _workspace(ctx.scratch("platforms-two"), base, files, PLATFORMS)
        for ws in (one, two):
            run([*efabuild, "make", "--no-lint"], cwd=ws)
            pending = [layer["name"] for layer in json.loads(run([*efabuild, "plan", "--json"], cwd=ws).stdout)["layers"]
                       if layer["action"] != "none"]
            if pending:
                raise BenchError(f"after make the plan is not a no-op: {pending}")

        ctx.log("platforms: the offline demo, arm64 under QEMU beside amd64 (cold: a run-unique workspace)")
        demo = _two_platform_demo(ctx.scratch(f"platforms-demo-{time.time_ns()}"), base)
        made = json.loads(run([*efabuild, "make", "--json", "--no-lint", "demo"], cwd=demo).stdout)
        seconds = {p: sum(o["seconds"] for o in made["layers"] if o["platform"] == p) for p in PLATFORMS}

        def plan_once(ws: Path) -> None:
            subprocess.run([*efabuild, "plan"], cwd=ws, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           check=True)

        ctx.log("platforms: timing")
        timings = interleaved(ctx.repeats, [
            ("efabuild plan (linux/amd64)", lambda: plan_once(one)),
            ("efabuild plan (linux/amd64 + linux/arm64)", lambda: plan_once(two)),
        ])
    finally:
        _stop_registry(registry_dir)
    single, double = timings
    ratio = double.median / single.median
    return Result(
        id="platforms",
        what=f"no-op plan of two platforms against one, demo graph, {files}-file context; emulated arm64 demo",
        checks=(
            Check("no-op plan, two platforms / one", ratio, TARGET, "lower",
                  efabuild=f"{double.median:.3f} s", baseline=f"{single.median:.3f} s (linux/amd64 alone)"),
        ),
        timings=tuple(timings),
        figures={
            "context_files": files,
            "demo_build_seconds_amd64": round(seconds["linux/amd64"], 1),
            "demo_build_seconds_arm64_emulated": round(seconds["linux/arm64"], 1),
            "arm64_emulated_over_amd64": round(seconds["linux/arm64"] / seconds["linux/amd64"], 2)
            if seconds["linux/amd64"] else None,
        },
        notes=(
            "the context is hashed once for both platforms; the second platform adds its nodes' keys, "
            "store look-ups and image-list matches",
            "the demo's arm64 build runs the fixture's shell stand-ins under QEMU: a real NGC stack's "
            "compilation (DeepEP) is slowed far more",
        ),
    )
