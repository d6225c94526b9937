"""The export of a registry image on a builder that cannot see this engine's images (a farm node):
the builder streams its root filesystem (`FROM ref`, `--output type=tar`) into the export, and the
image config comes from the registry. Byte-identical to exporting the same image from an engine.
Which builder does it is the caller's choice (make/farm.py picks one).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from efabuild.engine.client import Engine, EngineTimeout
from efabuild.engine.images import REMOTE_TIMEOUT_S
from efabuild.engine.registry import RegistryError
from efabuild.export.enroot import ImageConfig
from efabuild.export.squash import ExportResult, Progress, export_tar_stream
from efabuild.host.scratch import scratch_dir
from efabuild.settings import ExportSettings

# The buildx client of a streamed export receives the tar in BuildKit's 32 KiB messages, a fresh
# buffer each: with Go's default GC it spends half its CPU collecting them, CPU that mksquashfs,
# squashing on the same cores, then lacks. Collected when its heap reaches 128 MiB instead (the
# stream holds little live data), it needs about half the CPU (docs/performance-notes.md, "Farm export"); GOGC=1000,
# not off, bounds the heap where a Go before 1.19 ignores GOMEMLIMIT. A user's own setting wins.
_STREAM_GO_ENV = {"GOGC": "1000", "GOMEMLIMIT": "128MiB"}


def export_remote(node: Engine, ref: str, out: Path, *, options: ExportSettings, epoch: int, platform: str,
                  progress: Progress | None = None, sha256: bool = True, cancel: threading.Event | None = None,
                  chunking: tuple[int, int, int] | None = None) -> ExportResult:
    """Export the registry image `ref` to the .sqsh `out` on the builder `node`."""
    config, created = registry_config(node, ref)
    with scratch_dir("farm-export") as scratch:
        dockerfile = Path(scratch, "Dockerfile")
        dockerfile.write_text(f"FROM {ref}\n")
        args = ["buildx", "build", "--progress", "plain", "--provenance=false", "--sbom=false",
                "--platform", platform, "--output", "type=tar,dest=-", "--file", str(dockerfile)]
        if node.buildx_builder:
            args += ["--builder", node.buildx_builder]
        return export_tar_stream(node.command(*args, scratch), out, what=ref, config=config, created=created,
                                 options=options, progress=progress, epoch=epoch, sha256=sha256,
                                 cancel=cancel, chunking=chunking, env=_stream_env())


def _stream_env() -> dict[str, str]:
    return {} if any(name in os.environ for name in _STREAM_GO_ENV) else dict(_STREAM_GO_ENV)


def registry_config(engine: Engine, ref: str) -> tuple[ImageConfig, list[str]]:
    """(ImageConfig, creation times) of a registry image: what an export needs of its config."""
    try:
        found = engine.run("buildx", "imagetools", "inspect", ref, "--format", "{{json .Image}}",
                           timeout=REMOTE_TIMEOUT_S)
    except EngineTimeout:
        raise RegistryError(f"the registry did not give the config of {ref} within {REMOTE_TIMEOUT_S:g}s") from None
    try:
        image = json.loads(found.stdout) if found.returncode == 0 else None
    except ValueError:
        image = None
    if not isinstance(image, dict) or "config" not in image and "rootfs" not in image:
        detail = found.stderr.strip().splitlines()[-1:] or ["not a single-platform image"]
        raise RegistryError(f"cannot read the config of {ref}: {detail[0]}")
    history = image.get("history") or []
    created = [image.get("created") or ""] + [h.get("created") or "" for h in history if isinstance(h, dict)]
    return ImageConfig.from_docker(image.get("config") or {}), created
