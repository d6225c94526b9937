"""scale-real: efabuild at the size users run, on real packages (realimage.py: NVIDIA's CUDA wheels
and Debian's libfabric and Open MPI, plus generated files to at least 5 GB in 100k files).

- full export (efabuild's streamed export, in a process of its own) against Enroot's steps and
  against the bare `docker export | mksquashfs -tar` pipe a user would write;
- the growth exponent of the export's time from the export scenario's 1.4 GB image to this one;
- incremental export of a one-file change in a user layer on it, against its full export and
  against copying the ancestor alone;
- the probe on the .sqsh: its time, its peak memory, and its versions against the packages' own
  metadata (read from the .whl and .deb at run time);
- chunked publish to and fetch from S3 (moto's server over loopback) against boto3's managed
  transfers of the same file;
- the peak resident memory of every process each step started (peaks.py), the engine's daemons
  beside them.

The 5 GB steps run once each (a full export takes about a minute here); --repeats applies to the
rest of the suite.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

from benchmarks import fixtures, incremental, realimage
from benchmarks.common import (
    MiB,
    BenchError,
    Check,
    Context,
    Result,
    Timing,
    human_bytes,
    python,
)
from benchmarks.export import enroot_steps
from benchmarks.peaks import ProcessPeaks
from benchmarks.s3 import S3Server

BENCH_DIR = Path(__file__).resolve().parent.parent
TARGET_VS_ENROOT = 2.0
TARGET_VS_PIPE = 0.8
TARGET_INCREMENTAL = 0.2
MAX_EXPONENT = 1.15
MAX_EFABUILD_MIB = 512  # any efabuild process of any step: bounded whatever the image's size
MAX_EXPORT_MIB = 1536  # the export's largest process: mksquashfs, capped at -mem 1G, and its buffers


STEP = "python -m benchmarks.step"  # how peaks.py names an efabuild step's process


def _sampled(peaks: ProcessPeaks) -> dict[str, dict[str, int]]:
    return {"resident": dict(peaks.peaks), "anonymous": dict(peaks.anon)}


def step(*args: str) -> tuple[dict, dict[str, dict[str, int]]]:
    """One efabuild operation in a process of its own (step.py): (its JSON, the peaks of its
    processes, resident and anonymous)."""
    with ProcessPeaks() as peaks:
        done = subprocess.run([python(), "-m", "benchmarks.step", *args], cwd=BENCH_DIR,
                              capture_output=True, text=True)
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-4:])
        raise BenchError(f"step {args[0]} exited {done.returncode}: {tail}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    sampled = _sampled(peaks)
    # its own high-water mark, kept by the kernel: a sample may come too late for a short step
    sampled["resident"][STEP] = max(sampled["resident"].get(STEP, 0), result["maxrss"])
    return result, sampled


def bare_pipe(image: str, out: Path) -> tuple[float, dict[str, dict[str, int]]]:
    """`docker create`, `docker export | mksquashfs - OUT -tar` with Enroot's options, `docker rm`."""
    name = f"efabuild-bench-pipe-{secrets.token_hex(4)}"
    with ProcessPeaks() as peaks:
        started = time.perf_counter()
        subprocess.run(["docker", "create", "--name", name, image], check=True, capture_output=True)
        try:
            subprocess.run(["bash", "-o", "pipefail", "-c",
                            f"docker export {name} | mksquashfs - {out} -tar -noappend -all-root -no-xattrs "
                            f"-comp lzo -noD -quiet -no-progress"], check=True, capture_output=True)
        finally:
            subprocess.run(["docker", "rm", "-f", "-v", name], capture_output=True)
        seconds = time.perf_counter() - started
    return seconds, _sampled(peaks)


def _mib(size: int) -> str:
    return f"{size / MiB:.0f} MiB"


def _peaks_text(sampled: dict[str, dict[str, int]]) -> str:
    resident, anonymous = sampled["resident"], sampled["anonymous"]
    return ", ".join(f"{name} {_mib(size)}" + (f" ({_mib(anonymous[name])} anonymous)" if name in anonymous else "")
                     for name, size in sorted(resident.items(), key=lambda i: -i[1]))


def _largest(sampled: dict[str, dict[str, int]], kind: str = "anonymous") -> tuple[str, int]:
    kept = {n: s for n, s in sampled[kind].items() if "(engine" not in n}
    return max(kept.items(), key=lambda item: item[1], default=("none", 0))


def scenario(ctx: Context) -> Result:
    sizes, scratch = ctx.sizes, ctx.scratch("scale-real")
    found = realimage.packages(ctx.log)
    truth = realimage.truth(found)
    image, held = realimage.real_image(found, sizes.real_bytes, sizes.real_files, whole=not ctx.quick, log=ctx.log)
    small, _ = fixtures.export_image(sizes.export_small_files, sizes.export_large_files, sizes.export_large_bytes)
    peaks: dict[str, dict[str, dict[str, int]]] = {}
    times: dict[str, float] = {}

    ctx.log("scale-real: full export, efabuild")
    ours_out = scratch / "ours.sqsh"
    exported, peaks["export"] = step("export", image, str(ours_out))
    times["export"] = exported["seconds"]
    artifact = exported["size"]
    ctx.log("scale-real: probe")
    probed, peaks["probe"] = step("probe", str(ours_out))
    times["probe"] = probed["seconds"]
    transfers = _transfers(ctx, scratch, ours_out, peaks, times)
    ours_out.unlink()

    ctx.log("scale-real: the bare docker export | mksquashfs pipe")
    times["pipe"], peaks["pipe"] = bare_pipe(image, scratch / "pipe.sqsh")
    (scratch / "pipe.sqsh").unlink()
    ctx.log("scale-real: Enroot's steps")
    with ProcessPeaks() as enroot_peaks:
        times["enroot"], unpacked = enroot_steps(image, scratch / "enroot.sqsh", scratch)
    peaks["enroot"] = _sampled(enroot_peaks)
    (scratch / "enroot.sqsh").unlink()

    ctx.log("scale-real: full export of the 1.4 GB image, for the growth")
    small_run, _ = step("export", small, str(scratch / "small.sqsh"))
    (scratch / "small.sqsh").unlink()
    exponent = math.log(times["export"] / small_run["seconds"]) / math.log(artifact / small_run["size"])

    ctx.log("scale-real: incremental export of a one-file change")
    incr = _incremental(scratch, image)
    return _result(ctx, held, artifact, times, peaks, truth, probed["found"], transfers, exponent, small_run,
                   incr, unpacked)


def _transfers(ctx: Context, scratch: Path, sqsh: Path, peaks: dict, times: dict) -> dict:
    """Chunked publish and a cold fetch of the .sqsh, and boto3's upload_file and download_file of it."""
    import boto3

    with S3Server() as server:
        client = boto3.session.Session().client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
        bucket = f"bench-{secrets.token_hex(4)}"
        client.create_bucket(Bucket=bucket)
        key = secrets.token_hex(32)
        ctx.log("scale-real: chunked publish, then upload_file")
        published, peaks["publish"] = step("publish", str(sqsh), key, bucket, server.endpoint)
        started = time.perf_counter()
        client.upload_file(str(sqsh), bucket, "plain/artifact.sqsh")
        times["upload_file"] = time.perf_counter() - started
        ctx.log("scale-real: cold fetch, then download_file")
        fetched, peaks["fetch"] = step("fetch", key, bucket, server.endpoint, str(scratch / "shared"))
        shutil.rmtree(scratch / "shared")
        started = time.perf_counter()
        client.download_file(bucket, "plain/artifact.sqsh", str(scratch / "downloaded.sqsh"))
        times["download_file"] = time.perf_counter() - started
        (scratch / "downloaded.sqsh").unlink()
    times["publish"], times["fetch"], times["index"] = published["seconds"], fetched["seconds"], published["index_seconds"]
    return {"chunks": published["chunks"], "sent_bytes": published["sent_bytes"], "fetched_bytes": fetched["size"]}


def _incremental(scratch: Path, image: str) -> dict:
    """The user layer's one-file change exported from its ancestor's .sqsh, in full, and the copy alone."""
    import attrs

    from efabuild.engine.client import connect
    from efabuild.engine.images import layer_facts
    from efabuild.export.artifact import export_record
    from efabuild.export.incremental import Ancestor, layers_digest
    from efabuild.export.squash import export_image
    from efabuild.settings import BuilderSettings, ExportSettings
    from efabuild.signing import verifycache

    engine, options = connect(BuilderSettings()), ExportSettings()
    (scratch / "verified").mkdir(mode=0o700, exist_ok=True)
    os.environ[verifycache.CACHE_ENV] = str(scratch / "verified")
    keys = {name: secrets.token_hex(32) for name in ("efa", "user")}
    tags = {"efa": incremental._labelled(image, keys["efa"])}
    tags["user"] = incremental._labelled(tags["efa"], keys["user"], incremental._user_context(scratch / "context", 2))
    try:
        efa = export_image(tags["efa"], scratch / "efa.sqsh", options=options, engine=engine)
        efa = attrs.evolve(efa, image_layers=layers_digest(layer_facts(engine, tags["efa"])[1]))
        ancestor = incremental._as_make_holds_it(Ancestor(keys["efa"], tags["efa"], efa.path, efa.digest,
                                                          export_record(efa, options, 0)))
        times, made, _ = incremental._timed_exports(engine, tags["user"], ancestor, efa, options, scratch, 1,
                                                    copy_alone=True)
    finally:
        subprocess.run(["docker", "image", "rm", "-f", *tags.values()], capture_output=True)
        for path in [scratch / "efa.sqsh", *scratch.glob("out-*")]:
            path.unlink(missing_ok=True)
    if isinstance(made, str):
        raise BenchError(f"the incremental export fell back to a full one: {made}")
    return {name: seconds[0] for name, seconds in times.items()}


def _result(ctx: Context, held: dict, artifact: int, times: dict, peaks: dict, truth: dict, found: dict,
            transfers: dict, exponent: float, small_run: dict, incr: dict, unpacked: int) -> Result:
    measured = {name: found[name] for name in ("cuda", "cudnn", "nccl", "libfabric")}
    debian_mpi = [entry for entry in found["openmpi"] if entry.startswith("/usr/lib/x86_64-linux-gnu ")]
    measured["openmpi"] = debian_mpi[0].split(" ", 1)[1] if debian_mpi else None
    matches = sum(measured[name] == version for name, version in truth.items())
    efabuild_peak = max(p["anonymous"].get(STEP, 0) for p in peaks.values())
    efabuild_resident = max(p["resident"].get(STEP, 0) for p in peaks.values())
    export_name, export_peak = _largest(peaks["export"])
    pipe_name, pipe_peak = _largest(peaks["pipe"])
    return Result(
        id="scale-real",
        what=(f"real packages + generated files, {held['files']} files, {human_bytes(held['bytes'])} of data, "
              f"{human_bytes(artifact)} artifact"),
        checks=(
            Check("full export vs Enroot's steps", times["enroot"] / times["export"], TARGET_VS_ENROOT, "higher",
                  efabuild=f"{times['export']:.1f} s", baseline=f"{times['enroot']:.1f} s (Enroot steps)"),
            Check("full export vs docker export | mksquashfs", times["pipe"] / times["export"], TARGET_VS_PIPE,
                  "higher", efabuild=f"{times['export']:.1f} s", baseline=f"{times['pipe']:.1f} s (bare pipe)"),
            Check("export: largest process, anonymous MiB", export_peak / MiB, MAX_EXPORT_MIB, "lower", unit="",
                  efabuild=f"{export_name} {_mib(export_peak)}", baseline=f"{pipe_name} {_mib(pipe_peak)} (bare pipe)"),
            Check("growth exponent, export 1.4 GB → this", exponent, MAX_EXPONENT, "lower", unit="",
                  efabuild=f"{times['export']:.1f} s at {human_bytes(artifact)}",
                  baseline=f"{small_run['seconds']:.1f} s at {human_bytes(small_run['size'])}", full_size_only=True),
            Check("incremental export vs full export", incr["incremental"] / incr["full"], TARGET_INCREMENTAL,
                  "lower", efabuild=f"{incr['incremental']:.1f} s",
                  baseline=f"{incr['full']:.1f} s (full; copying the ancestor alone {incr['copy']:.1f} s)",
                  full_size_only=True),
            Check("probe: versions as the packages say", matches / len(truth), 1.0, "higher", unit="",
                  efabuild=", ".join(f"{n} {measured[n]}" for n in truth),
                  baseline=", ".join(f"{n} {v}" for n, v in truth.items())),
            Check("efabuild's largest process, anonymous MiB", efabuild_peak / MiB, MAX_EFABUILD_MIB, "lower",
                  unit="", efabuild=f"{_mib(efabuild_peak)} ({_mib(efabuild_resident)} resident with mapped files)",
                  baseline=f"probe {times['probe']:.1f} s"),
            Check("chunked publish vs boto3 upload_file", times["upload_file"] / times["publish"], 1.0, "higher",
                  efabuild=f"{times['publish']:.1f} s, {transfers['chunks']} chunks",
                  baseline=f"{times['upload_file']:.1f} s (upload_file)"),
            Check("cold fetch vs boto3 download_file", times["download_file"] / times["fetch"], 1.0, "higher",
                  efabuild=f"{times['fetch']:.1f} s (verified)",
                  baseline=f"{times['download_file']:.1f} s (download_file, unverified)"),
        ),
        timings=tuple(Timing(name, (seconds,)) for name, seconds in times.items()),
        figures={"image": held, "artifact_bytes": artifact, "enroot_unpacked_rootfs_bytes": unpacked,
                 "truth": truth, "probe_found": found, "transfers": transfers,
                 "incremental": incr, "small_export": small_run,
                 "peak_rss_bytes": peaks},
        notes=("peak memory: every process each step started, from /proc every 50 ms: its resident "
               "high-water mark (VmHWM, which counts the pages of a file it maps, such as the .sqsh it "
               "digests) and, in brackets, its largest anonymous memory seen (RssAnon); the engine's daemons "
               "by their resident size while the step ran",
               "the export's digest pass with the chunk index (timed apart from the publish): "
               f"{times['index']:.1f} s",
               *(f"peak memory, {name}: {_peaks_text(step_peaks)}" for name, step_peaks in peaks.items())),
    )
