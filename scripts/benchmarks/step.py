"""One efabuild operation in a process of its own, so that its peak memory is its own:

    python -m benchmarks.step export IMAGE OUT
    python -m benchmarks.step probe SQSH
    python -m benchmarks.step publish SQSH KEY BUCKET ENDPOINT
    python -m benchmarks.step fetch KEY BUCKET ENDPOINT SHARED_DIR

Prints one JSON line: the operation's seconds (imports and set-up left out), this process's peak
resident size (ru_maxrss) and what the operation found.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path


def export(image: str, out: str) -> dict:
    from efabuild.engine.client import connect
    from efabuild.export.squash import export_image
    from efabuild.settings import BuilderSettings, ExportSettings

    engine = connect(BuilderSettings())
    started = time.perf_counter()
    result = export_image(image, Path(out), options=ExportSettings(), engine=engine)
    return {"seconds": time.perf_counter() - started, "size": result.size, "digest": result.digest}


def probe(sqsh: str) -> dict:
    from efabuild.provenance.fsview import SqshView
    from efabuild.provenance.probe import probe_tree

    started = time.perf_counter()
    measured = probe_tree(SqshView(Path(sqsh)))
    seconds = time.perf_counter() - started
    found = {name: measured.component(name).version for name in ("cuda", "cudnn", "nccl", "libfabric")}
    found["openmpi"] = sorted(f"{m.path} {m.version}" for m in measured.openmpi)
    return {"seconds": seconds, "found": found}


def _settings(bucket: str, endpoint: str):  # noqa: ANN202 - an S3Config
    from efabuild.settings import S3Config

    return S3Config(bucket=bucket, prefix="scale/", endpoint_url=endpoint, region="us-east-1")


def publish(sqsh: str, key: str, bucket: str, endpoint: str) -> dict:
    from efabuild.chunks.cdc import chunk_file
    from efabuild.store.record import ArtifactRecord
    from efabuild.store.tiers.s3 import S3Tier

    path = Path(sqsh)
    started = time.perf_counter()
    index = chunk_file(path)  # the export's digest pass cuts it (make/publish.py); timed apart
    cut = time.perf_counter() - started
    tier = S3Tier(_settings(bucket, endpoint), show_progress=False)
    started = time.perf_counter()
    tier.publish(key, path, ArtifactRecord.for_file(key, "bench:scale", path, index.digest), index=index)
    sent = tier.last_transfer
    return {"seconds": time.perf_counter() - started, "index_seconds": cut, "chunks": len(index.chunks),
            "sent_bytes": sent.bytes if sent else None}


def fetch(key: str, bucket: str, endpoint: str, shared: str) -> dict:
    from efabuild.store.tiered import Store
    from efabuild.store.tiers.fs import FilesystemTier

    store = Store([FilesystemTier(Path(shared), "shared")], _settings(bucket, endpoint), show_progress=False)
    started = time.perf_counter()
    path = store.fetch(key)
    return {"seconds": time.perf_counter() - started, "size": path.stat().st_size}


def main(argv: list[str]) -> int:
    operation = {"export": export, "probe": probe, "publish": publish, "fetch": fetch}[argv[0]]
    result = operation(*argv[1:])
    result["maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
