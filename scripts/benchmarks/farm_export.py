"""farm: `.sqsh` export without the image in a local engine, against `docker create | docker export`.

A farm's builder cannot load its images into the engine efabuild runs beside, so an artifact's
root filesystem streams from the builder (`FROM REGISTRY/…@digest`, `--output type=tar`) into the
same tar filter and mksquashfs, with the image config read from the registry. Both paths run
here side by side on one image (the export scenario's), in a loopback registry, on the local
engine's BuildKit; both must give the same bytes.

Beside the times, the CPU each path costs (less at the mercy of other work on the machine than
wall time): this process and its children (the docker or buildx client, mksquashfs), and the
engine's daemon (its BuildKit makes the stream), read from /proc before and after each export.
"""

from __future__ import annotations

import os
import resource
import socket
import statistics
import subprocess
import time
from pathlib import Path

from benchmarks import fixtures
from benchmarks.common import REPO_ROOT, Check, Context, Result, Timing, human_bytes, run

# The stream adds a BuildKit solve and a registry config read to the same filter and mksquashfs.
TARGET_SPEED = 0.8


def _registry(ctx: Context) -> tuple[str, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    directory = ctx.scratch("farm/registry")
    started = subprocess.run(["bash", str(REPO_ROOT / "scripts/start-registry.sh"), str(port), str(directory)],
                             capture_output=True, text=True, check=True)
    return started.stdout.strip(), (directory / "registry.pid").read_text().strip()


def _daemon_cpu() -> float | None:
    """CPU seconds the local dockerd has used so far, None when it cannot be read."""
    try:
        pid = Path("/var/run/docker.pid").read_text().strip()
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu() -> tuple[float, float | None]:
    """(CPU seconds of this process and its waited-for children, of the engine's daemon)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime, _daemon_cpu()


def _spent(before: tuple[float, float | None]) -> tuple[float, float | None]:
    after = _cpu()
    daemon = None if before[1] is None or after[1] is None else after[1] - before[1]
    return after[0] - before[0], daemon


def _cpu_text(cpu: dict[str, list], path: str) -> str:
    client, daemon = cpu[f"{path}_client"], cpu[f"{path}_daemon"]
    text = f"CPU {statistics.median(client):.1f} s here"
    return text + (f" + {statistics.median(daemon):.1f} s dockerd" if None not in daemon else "")


def scenario(ctx: Context) -> Result:
    from efabuild.engine.client import connect
    from efabuild.export.remote import export_remote
    from efabuild.make.farm import Farm
    from efabuild.export.squash import export_image
    from efabuild.settings import BuilderSettings, ExportSettings, RegistrySettings

    sizes = ctx.sizes
    image, data_bytes = fixtures.export_image(sizes.export_small_files, sizes.export_large_files,
                                              sizes.export_large_bytes)
    url, pid = _registry(ctx)
    try:
        name = f"{url}/efabuild/bench-export:{image.rsplit(':', 1)[1]}"
        run(["docker", "image", "tag", image, name])
        pushed = run(["docker", "image", "push", name]).stdout.decode()
        digest = next(w for line in pushed.splitlines() if "digest:" in line for w in line.split()
                      if w.startswith("sha256:"))
        node = connect(BuilderSettings())
        farm = Farm(nodes=[node], registry=RegistrySettings(url=url), jobs=1, busy=[0])
        ref = f"{name}@{digest}"
        out = ctx.scratch("farm")
        streamed_s, exported_s = [], []
        cpu: dict[str, list] = {"stream_client": [], "stream_daemon": [], "export_client": [], "export_daemon": []}
        ctx.log("farm: timing the streamed export and docker export, side by side")
        for _ in range(ctx.repeats):
            started, used = time.perf_counter(), _cpu()
            streamed = export_remote(node, ref, out / "streamed.sqsh", options=ExportSettings(), epoch=315532800,
                                     platform="linux/amd64")
            streamed_s.append(time.perf_counter() - started)
            for part, spent in zip(("stream_client", "stream_daemon"), _spent(used)):
                cpu[part].append(spent)
            started, used = time.perf_counter(), _cpu()
            exported = export_image(name, out / "exported.sqsh", options=ExportSettings(), epoch=315532800,
                                    engine=node)
            exported_s.append(time.perf_counter() - started)
            for part, spent in zip(("export_client", "export_daemon"), _spent(used)):
                cpu[part].append(spent)
        identical = streamed.path.read_bytes() == exported.path.read_bytes()
        run(["docker", "image", "rm", "--no-prune", name])
    finally:
        subprocess.run(["kill", pid], capture_output=True)
    ours = Timing("efabuild stream (buildx type=tar + registry config)", tuple(streamed_s))
    theirs = Timing("docker create | docker export", tuple(exported_s))
    return Result(
        id="farm",
        what=f"export without a local image, {human_bytes(streamed.size)} artifact",
        checks=(
            Check("vs docker export", theirs.median / ours.median, TARGET_SPEED, "higher",
                  efabuild=f"{ours.median:.2f} s ({_cpu_text(cpu, 'stream')})",
                  baseline=f"{theirs.median:.2f} s ({_cpu_text(cpu, 'export')}; docker export)"),
            Check("byte-identical .sqsh", 1.0 if identical else 0.0, 1.0, "higher", unit=""),
        ),
        timings=(ours, theirs),
        figures={"image": image, "file_data_bytes": data_bytes, "sqsh_bytes": streamed.size,
                 "identical": identical,
                 "cpu_seconds_median": {part: None if None in spent else round(statistics.median(spent), 2)
                                        for part, spent in cpu.items()}},
        notes=("both on the local engine and a loopback registry: no network between builder and efabuild",),
    )
