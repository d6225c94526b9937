"""publish and fetch: efabuild's S3 tier against boto3's managed transfers with their defaults, on
moto's S3 server over loopback HTTP (its own process, see s3server.py).

- publish: `S3Tier.publish` of a multi-GB .sqsh (chunks sent from the index the export cut in its
  digest pass, created only if absent; index, then record written last) vs `upload_file`. Also
  counts the bytes this process read while publishing (/proc/self/io rchar): one read of the
  data means about 1.0× the file size.
- fetch: `Store.fetch` into a shared filesystem tier (parallel ranged GETs, fsync, blake3 verified
  against the record, published atomically under the key's lock) vs `download_file`, unverified.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import (
    BenchError,
    Check,
    Context,
    Result,
    Timing,
    human_bytes,
    io_counters,
    warm,
    write_random_file,
)

TARGET = 1.0
ONE_READ = 1.05  # bytes read / file size allowed for "one read of the data" (requests, responses)
DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "bench-access-key",
    "AWS_SECRET_ACCESS_KEY": "bench-secret-key",
    "AWS_DEFAULT_REGION": "us-east-1",
    # keep the developer's own AWS set-up out of the benchmark
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class S3Server:
    """The loopback S3 server process; dummy credentials set in this process while it runs."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self._saved: dict[str, str | None] = {}

    def __enter__(self) -> S3Server:
        self._saved = {name: os.environ.get(name) for name in DUMMY_CREDENTIALS}
        os.environ.update(DUMMY_CREDENTIALS)
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("s3server.py")), str(self.port)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            self.__exit__()
            raise BenchError("the loopback S3 server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _read_bytes_during(call) -> tuple[float, int]:  # noqa: ANN001
    before = io_counters()["rchar"]
    started = time.perf_counter()
    call()
    seconds = time.perf_counter() - started
    return seconds, io_counters()["rchar"] - before


def scenarios(ctx: Context, ids: list[str]) -> list:
    import boto3

    from efabuild.settings import S3Config
    from efabuild.chunks.cdc import chunk_file
    from efabuild.store.tiered import Store
    from efabuild.store.tiers.fs import FilesystemTier
    from efabuild.store.record import ArtifactRecord
    from efabuild.store.tiers.s3 import S3Tier

    size = ctx.sizes.s3_bytes
    scratch = ctx.scratch("s3")
    sqsh = scratch / "artifact.sqsh"
    ctx.log(f"s3: writing a {human_bytes(size)} artifact")
    write_random_file(sqsh, size, seed=2)
    index = chunk_file(sqsh)  # the digest and chunk index, made by the export in a real run, in one pass
    digest = index.digest
    warm(sqsh)
    results = []
    with S3Server() as server:
        client = boto3.session.Session().client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
        bucket = f"bench-{secrets.token_hex(4)}"
        client.create_bucket(Bucket=bucket)
        settings = S3Config(bucket=bucket, endpoint_url=server.endpoint, region="us-east-1")
        tier = S3Tier(settings, show_progress=False)

        def record_for(key: str) -> ArtifactRecord:
            return ArtifactRecord.for_file(key, "bench:artifact", sqsh, digest)

        # ---- publish
        ours_s, theirs_s, ours_read, theirs_read = [], [], [], []
        keys = []
        ctx.log("s3: timing publish")
        for _ in range(ctx.repeats):
            key = secrets.token_hex(32)
            keys.append(key)
            seconds, read = _read_bytes_during(lambda: tier.publish(key, sqsh, record_for(key), index=index))
            ours_s.append(seconds)
            ours_read.append(read)
            plain = f"plain/{secrets.token_hex(8)}.sqsh"
            seconds, read = _read_bytes_during(lambda: client.upload_file(str(sqsh), bucket, plain))
            theirs_s.append(seconds)
            theirs_read.append(read)
            # chunks of random bytes are shared by nothing: every publish here is a cold one
            tier.delete(key)
            tier.chunks.delete_objects([tier.chunks.object(c) for c in tier.last_index.unique()])
        kept = secrets.token_hex(32)  # one artifact for the fetch, and the same bytes as one object
        tier.publish(kept, sqsh, record_for(kept), index=index)
        plain = "plain/artifact.sqsh"
        client.upload_file(str(sqsh), bucket, plain)
        ours = Timing("efabuild S3 tier publish", tuple(ours_s))
        theirs = Timing("boto3 upload_file (defaults)", tuple(theirs_s))
        reads = max(ours_read) / size
        if "publish" in ids:
            results.append(Result(
                id="publish",
                what=f"store a {human_bytes(size)} .sqsh to S3 (loopback)",
                checks=(
                    Check("vs boto3 upload_file", theirs.median / ours.median, TARGET, "higher",
                          efabuild=f"{ours.median:.2f} s", baseline=f"{theirs.median:.2f} s (upload_file)"),
                    Check("reads of the data", reads, ONE_READ, "lower", unit="",
                          efabuild=human_bytes(max(ours_read)), baseline=human_bytes(max(theirs_read))),
                ),
                timings=(ours, theirs),
                figures={"bytes": size, "efabuild_read_bytes": ours_read, "boto3_read_bytes": theirs_read,
                         "boto3_reads_of_data": round(max(theirs_read) / size, 3),
                         "efabuild_part_size": tier.part_size, "efabuild_workers": tier.workers},
                notes=("reads: bytes this process read (rchar) while publishing, ÷ the file size: the chunks "
                       "are read back with pread by the export's index (a publish without one cuts the file "
                       "through mmap, which rchar does not count)",),
            ))

        # ---- fetch
        if "fetch" in ids:
            shared = scratch / "shared"
            store = Store([FilesystemTier(shared, "shared")], settings, show_progress=False)
            plain_dest = scratch / "downloaded.sqsh"
            ours_s, theirs_s = [], []
            ctx.log("s3: timing fetch")
            for _ in range(ctx.repeats):
                started = time.perf_counter()
                path = store.fetch(kept)
                ours_s.append(time.perf_counter() - started)
                if path.stat().st_size != size:
                    raise BenchError(f"fetched {path} has {path.stat().st_size} bytes, not {size}")
                store.fetch_tier.delete(kept)
                started = time.perf_counter()
                client.download_file(bucket, plain, str(plain_dest))
                theirs_s.append(time.perf_counter() - started)
                plain_dest.unlink()
            ours = Timing("efabuild Store.fetch (verified, durable)", tuple(ours_s))
            theirs = Timing("boto3 download_file (defaults, unverified)", tuple(theirs_s))
            results.append(Result(
                id="fetch",
                what=f"S3 → shared tier, {human_bytes(size)}, verified",
                checks=(Check("vs boto3 download_file", theirs.median / ours.median, TARGET, "higher",
                              efabuild=f"{ours.median:.2f} s", baseline=f"{theirs.median:.2f} s (download_file)"),),
                timings=(ours, theirs),
                figures={"bytes": size},
                notes=("efabuild's fetch also fsyncs and re-hashes (blake3) before publishing; "
                       "download_file does neither",),
            ))
        tier.delete(kept)
    return results
