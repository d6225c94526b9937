"""export: image → `.sqsh` with efabuild's streamed export, against Enroot's own pipeline step by
step (what `enroot import dockerd://IMAGE` runs): `docker create`, `docker export` untarred into a
directory, fixperms, `mksquashfs` of the directory with Enroot's options, clean-up.

Extra disk is what a conversion needs beside its output: Enroot unpacks the whole root filesystem
first; efabuild streams it into mksquashfs, so only the output file grows.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

from benchmarks import fixtures
from benchmarks.common import (
    Check,
    Context,
    PeakSize,
    Result,
    Timing,
    allocated_bytes,
    human_bytes,
    run,
)

TARGET_SPEED = 2.0
TARGET_EXTRA_PERCENT = 10.0
ENROOT_SQUASH_OPTIONS = ("-comp", "lzo", "-noD")  # ENROOT_SQUASH_OPTIONS' default


def enroot_steps(image: str, out: Path, scratch: Path) -> tuple[float, int]:
    """Enroot's dockerd import, one step at a time. Returns (seconds, bytes of the unpacked rootfs),
    the size measured between the timed steps."""
    name = f"efabuild-bench-enroot-{uuid.uuid4().hex[:8]}"
    tmpdir = scratch / name
    rootfs = tmpdir / "rootfs"
    started = time.perf_counter()
    rootfs.mkdir(parents=True)
    try:
        run(["docker", "create", "--name", name, image])
        run(["bash", "-o", "pipefail", "-c",
             f"docker export {name} | tar -C {rootfs} --warning=no-timestamp --anchored "
             f"--exclude='dev/*' --exclude='.dockerenv' -px"])
        run(["chmod", "-f", "-R", "u+rX", str(rootfs)])
        run(["find", str(rootfs), "-maxdepth", "5", "-type", "d", "!", "-perm", "-u=w",
             "-exec", "chmod", "-f", "u+w", "{}", "+"])
        run(["docker", "inspect", image])  # Enroot reads the config to write /etc/environment & co.
        unpacked_at = time.perf_counter()
        unpacked = allocated_bytes(rootfs)
        paused = time.perf_counter() - unpacked_at
        run(["mksquashfs", str(rootfs), str(out), "-all-root", "-no-progress",
             "-processors", str(os.cpu_count() or 1), *ENROOT_SQUASH_OPTIONS])
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)  # Enroot's exit trap
        run(["docker", "rm", "-f", "-v", name])
    return time.perf_counter() - started - paused, unpacked


def scenario(ctx: Context) -> Result:
    from efabuild.engine.client import connect
    from efabuild.settings import BuilderSettings, ExportSettings
    from efabuild.export.squash import export_image

    sizes = ctx.sizes
    ctx.log(f"export: test image ({sizes.export_small_files} small files, {sizes.export_large_files} × "
            f"{human_bytes(sizes.export_large_bytes)}; imported once, then reused)")
    image, data_bytes = fixtures.export_image(sizes.export_small_files, sizes.export_large_files,
                                              sizes.export_large_bytes)
    ours_dir, theirs_dir = ctx.scratch("export/efabuild"), ctx.scratch("export/enroot")
    ours_out, theirs_out = ours_dir / "image.sqsh", theirs_dir / "image.sqsh"
    engine = connect(BuilderSettings())

    ours_s: list[float] = []
    theirs_s: list[float] = []
    ours_extra: list[int] = []
    unpacked: list[int] = []
    sizes_out: dict[str, int] = {}
    ctx.log("export: timing")
    for _ in range(ctx.repeats):
        for path in (ours_out, theirs_out):
            path.unlink(missing_ok=True)
        with PeakSize(ours_dir) as peak:
            started = time.perf_counter()
            result = export_image(image, ours_out, options=ExportSettings(), engine=engine)
            ours_s.append(time.perf_counter() - started)
        final = allocated_bytes(ours_out)
        ours_extra.append(max(0, peak.peak - final))
        sizes_out["efabuild"] = result.size

        seconds, rootfs_bytes = enroot_steps(image, theirs_out, theirs_dir)
        theirs_s.append(seconds)
        unpacked.append(rootfs_bytes)
        sizes_out["enroot"] = theirs_out.stat().st_size
    for path in (ours_out, theirs_out):
        path.unlink(missing_ok=True)

    ours = Timing("efabuild export_image (streamed)", tuple(ours_s))
    theirs = Timing("Enroot steps (export, untar, fixperms, mksquashfs)", tuple(theirs_s))
    artifact = sizes_out["efabuild"]
    extra_ours = max(ours_extra) / artifact * 100
    extra_theirs = max(unpacked) / sizes_out["enroot"] * 100
    return Result(
        id="export",
        what=f"image → .sqsh, {human_bytes(artifact)} artifact",
        checks=(
            Check("vs Enroot's steps", theirs.median / ours.median, TARGET_SPEED, "higher",
                  efabuild=f"{ours.median:.2f} s", baseline=f"{theirs.median:.2f} s (Enroot steps)"),
            Check("extra disk, % of artifact", extra_ours, TARGET_EXTRA_PERCENT, "lower", unit="%",
                  efabuild=human_bytes(max(ours_extra)), baseline=f"{human_bytes(max(unpacked))} (rootfs)"),
        ),
        timings=(ours, theirs),
        figures={
            "image": image, "file_data_bytes": data_bytes,
            "small_files": sizes.export_small_files,
            "large_files": [sizes.export_large_files, sizes.export_large_bytes],
            "sqsh_bytes": sizes_out, "efabuild_extra_bytes": max(ours_extra),
            "enroot_unpacked_rootfs_bytes": max(unpacked),
            "enroot_extra_percent": round(extra_theirs, 1),
        },
        notes=("extra disk: efabuild sampled every 20 ms in the output directory (peak minus the "
               "artifact); Enroot's is its unpacked rootfs, measured between its steps",),
    )
