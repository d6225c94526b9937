"""plan: a no-op `efabuild plan` and `efabuild make` of the demo-shaped graph, every layer built
and stored, against fully cached `docker buildx build` calls of the same layers (what a
hand-written pipeline runs to find out that nothing changed).

The graph has the demo's shape and Dockerfile structure (EFA layer on a base, DeepEP on it, user
code with a large context on top) on a busybox base, so it builds offline in seconds. Two baselines:
the three layers as three chained builds, one `--load` per layer as efabuild runs them (the
figure), and as one Dockerfile (one buildx call). `python -c pass` is timed beside them: what no
Python command can go below.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import time
from pathlib import Path

from benchmarks import fixtures
from benchmarks.common import (BenchError, Check, Context, Result, byte_compile_efabuild, efabuild_command,
                               interleaved, python, run)

TARGET = 3.0  # × faster than the three cached chained builds
TARGET_SECONDS = 0.15
PLATFORM = "linux/amd64"
EFA_VERSION = "1.50.0"
DEEPEP_COMMIT = "94a9f8f6b146c07d97ec58f67cd6d303296d6098"

EFA_DOCKERFILE = f"""\
ARG EFA_INSTALLER_VERSION={EFA_VERSION}
RUN mkdir -p /opt/amazon/efa/lib /opt/amazon/ofi-nccl/lib \\
 && echo "# EFA installer version: ${{EFA_INSTALLER_VERSION}}" > /opt/amazon/efa_installed_packages
ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:${{LD_LIBRARY_PATH}}
"""
DEEPEP_DOCKERFILE = f"""\
ARG HYBRID_EP_COMMIT={DEEPEP_COMMIT}
ENV TORCH_CUDA_ARCH_LIST=10.0
RUN mkdir -p /opt/DeepEP && echo "${{HYBRID_EP_COMMIT}}" > /opt/DeepEP/COMMIT
"""
USER_DOCKERFILE = """\
COPY app/ /workspace/app/
WORKDIR /workspace
"""
BUILD_ARGS = {"EFA_INSTALLER_VERSION": EFA_VERSION, "HYBRID_EP_COMMIT": DEEPEP_COMMIT}


def graph_toml(base: str, artifacts: bool) -> str:
    flag = "true" if artifacts else "false"
    return f"""\
[graph]
description = "demo-shaped graph on a busybox base (benchmark)"

[layers.efa]
base = "{base}"
dockerfile = '''
{EFA_DOCKERFILE}'''
args = {{ EFA_INSTALLER_VERSION = "{EFA_VERSION}" }}
artifact = {flag}

[layers.deepep]
parent = "efa"
dockerfile = '''
{DEEPEP_DOCKERFILE}'''
args = {{ HYBRID_EP_COMMIT = "{DEEPEP_COMMIT}" }}

[layers.user]
parent = "deepep"
dockerfile = '''
{USER_DOCKERFILE}'''
context = ["app"]
artifact = {flag}
"""


def make_workspace(root: Path, base: str, files: int, artifacts: bool) -> None:
    (root / "graphs").mkdir(parents=True, exist_ok=True)
    (root / "BUILD.toml").write_text('[store]\nlocal = "cache"\n')
    (root / "graphs" / "demo.toml").write_text(graph_toml(base, artifacts))
    fixtures.context_tree(root / "app", files)
    # the baselines use the workspace as their build context, like a repository with a Dockerfile
    (root / ".dockerignore").write_text("cache\ngraphs\nBUILD.toml\n")


def buildx(dockerfile: str, tag: str, context: Path) -> list[str]:
    """The same buildx invocation efabuild uses for a layer, without efabuild's bookkeeping."""
    command = ["docker", "buildx", "build", "--progress", "plain", "--file", "-", "--load",
               "--provenance=false", "--sbom=false", "--platform", PLATFORM, "--tag", tag]
    for name, value in BUILD_ARGS.items():
        command += ["--build-arg", f"{name}={value}"]
    return command + [str(context)]


def run_buildx(dockerfile: str, tag: str, context: Path) -> str:
    done = run(buildx(dockerfile, tag, context), input=dockerfile.encode())
    return done.stderr.decode(errors="replace")


def artifacts_supported() -> bool:
    """`efabuild make` exports artifact layers once its export step is installed."""
    return importlib.util.find_spec("efabuild.make.publish") is not None


def scenario(ctx: Context) -> Result:
    files = ctx.sizes.plan_context_files
    base = fixtures.busybox_image()
    ws = ctx.scratch("plan-ws")
    artifacts = artifacts_supported()
    ctx.log(f"plan: workspace with a {files}-file context (artifacts: {artifacts})")
    make_workspace(ws, base, files, artifacts)
    byte_compile_efabuild()
    efabuild = efabuild_command()

    started = time.perf_counter()
    run([*efabuild, "make", "--no-lint"], cwd=ws)
    make_seconds = time.perf_counter() - started
    plan = json.loads(run([*efabuild, "plan", "--json"], cwd=ws).stdout)
    pending = [layer["name"] for layer in plan["layers"] if layer["action"] != "none"]
    if pending or plan.get("engine") != "reachable":
        raise BenchError(f"after make the plan is not a no-op: {pending or plan.get('engine_error')}")
    tags = [f"efabuild/{layer['name'].split(':', 1)[1]}:{layer['key']}" for layer in plan["layers"]]

    single = EFA_DOCKERFILE + DEEPEP_DOCKERFILE + USER_DOCKERFILE
    single_tag = f"{fixtures.IMAGE_REPO}/baseline-demo:single"
    chain = [("efa", EFA_DOCKERFILE), ("deepep", DEEPEP_DOCKERFILE), ("user", USER_DOCKERFILE)]
    chain_tags = [f"{fixtures.IMAGE_REPO}/baseline-{name}:chained" for name, _ in chain]

    def single_build() -> None:
        run_buildx(f"FROM {base}\n{single}", single_tag, ws)

    def chained_builds() -> None:
        parent = base
        for (_, text), tag in zip(chain, chain_tags):
            run_buildx(f"FROM {parent}\n{text}", tag, ws)
            parent = tag

    def plan_once(*extra: str) -> None:
        subprocess.run([*efabuild, "plan", *extra], cwd=ws, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=True)

    def make_once() -> None:
        subprocess.run([*efabuild, "make"], cwd=ws, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=True)

    def python_start() -> None:
        subprocess.run([python(), "-c", "pass"], check=True)

    try:
        ctx.log("plan: first builds of the baselines (untimed: fills BuildKit's cache)")
        single_build()
        chained_builds()
        log = run_buildx(f"FROM {base}\n{single}", single_tag, ws)
        ctx.log("plan: timing")
        timings = interleaved(ctx.repeats, [
            ("efabuild plan", plan_once),
            ("efabuild make (no-op)", make_once),
            ("efabuild plan --offline", lambda: plan_once("--offline")),
            ("docker buildx build (one Dockerfile, cached)", single_build),
            ("docker buildx build (3 chained layers, cached)", chained_builds),
            ("python -c pass", python_start),
        ])
    finally:
        fixtures.remove_images([single_tag, *chain_tags, *tags])
    ours, make, offline, one, three, bare = timings
    chained = f"{three.median:.3f} s (3 cached buildx --load)"
    return Result(
        id="plan",
        what=f"no-op plan and make, demo graph, {files}-file context",
        checks=(
            Check("no-op plan vs chained cached buildx", three.median / ours.median, TARGET, "higher",
                  efabuild=f"{ours.median:.3f} s", baseline=chained),
            Check("no-op make vs chained cached buildx", three.median / make.median, TARGET, "higher",
                  efabuild=f"{make.median:.3f} s", baseline=chained),
            Check("no-op plan, seconds", ours.median, TARGET_SECONDS, "lower", unit="",
                  efabuild=f"{ours.median:.3f} s", baseline=f"{bare.median:.3f} s (python -c pass)"),
            Check("no-op make, seconds", make.median, TARGET_SECONDS, "lower", unit="",
                  efabuild=f"{make.median:.3f} s", baseline=f"{bare.median:.3f} s (python -c pass)"),
        ),
        timings=tuple(timings),
        figures={
            "context_files": files, "layers": len(plan["layers"]), "artifacts": artifacts,
            "make_seconds_first": round(make_seconds, 2),
            "ratio_vs_one_buildx": round(one.median / ours.median, 2),
            "ratio_offline_vs_chained_buildx": round(three.median / offline.median, 2),
            "plan_over_python_start": round(ours.median / bare.median, 2),
            "make_over_python_start": round(make.median / bare.median, 2),
            "buildx_steps_cached": log.count(" CACHED"),
        },
        notes=(
            "efabuild plan asks the engine (image list, base digest) and stats every context file "
            "through its hash cache; buildx sends the context and checks every step against its cache",
            "absolute seconds hold only on an idle machine: compare them with python -c pass",
        ),
    )
