"""chunked: what the chunked S3 tier saves when one file of the user layer changes.

Images: an "EFA" SquashFS (large binaries and many small text files, Enroot's mksquashfs options),
and five versions of a "user" image on top of it that add a fixed 8 files of 256 KiB each
(2 MiB); each version changes one of them. All on moto's S3 server over loopback.

- publish: bytes and time of publishing user v2 after v1, chunked, vs publishing v2 as one whole
  object (what efabuild did before). Both start from what the export hands over: the .sqsh and
  its record, and for the chunked tier the chunk index the export cuts in its digest pass. What
  that index costs the export is measured too: the digest pass with it vs blake3 alone;
- fetch: bytes and time of fetching v2 onto a node that holds v1 (its seed) vs a whole-object fetch,
  on the scratch filesystem (ext4 here: every byte written) and on a loop-mounted XFS with reflink
  (the seed's blocks shared, not written), each against a whole-object fetch onto the same one;
- dedup: share of the user image's bytes in chunks the EFA image already holds, and bytes S3
  stores for five versions ÷ the size of one.
"""

from __future__ import annotations

import random
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from benchmarks.common import BenchError, Check, Context, Result, Timing, human_bytes, settled, warm
from benchmarks.loopfs import loop_xfs
from benchmarks.s3 import S3Server

KiB, MiB = 1024, 1024 * 1024
USER_FILES, USER_FILE_BYTES = 8, 256 * KiB
VERSIONS = 5


def _tree(root: Path, large: int, large_bytes: int, small: int, seed: int) -> None:
    rng = random.Random(seed)
    words = [rng.randbytes(4).hex() for _ in range(4000)]
    for i in range(large):
        path = root / "opt" / f"lib{i}" / f"libbig{i}.so"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            for _ in range(large_bytes // MiB):
                f.write(rng.randbytes(MiB))
    for i in range(small):
        path = root / "usr" / "lib" / "python3" / f"pkg{i // 200}" / f"mod{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(" ".join(rng.choice(words) for _ in range(rng.randint(20, 400))))


def _user(base: Path, dest: Path, version: int) -> None:
    """The base tree (hard links: no copy) plus the user layer of `version`."""
    subprocess.run(["cp", "-al", str(base), str(dest)], check=True)
    rng = random.Random(1000)
    for i in range(USER_FILES):
        data = bytearray(rng.randbytes(USER_FILE_BYTES))
        if i == 0:
            data[:16] = f"version {version:08d}".encode()  # the one file that changes
        path = dest / "workspace" / "app" / f"part{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes(data))


def _squash(tree: Path, out: Path) -> Path:
    subprocess.run(["mksquashfs", str(tree), str(out), "-noappend", "-all-root", "-comp", "lzo", "-noD",
                    "-mkfs-time", "0", "-all-time", "0", "-quiet", "-no-progress"], check=True)
    return out


def scenario(ctx: Context) -> Result:
    import boto3

    from efabuild.settings import S3Config
    from efabuild.chunks.cdc import AVG_SIZE, MAX_SIZE, MIN_SIZE, chunk_file
    from efabuild.store.tiered import Store
    from efabuild.store.tiers.fs import FilesystemTier
    from efabuild.store.record import ArtifactRecord
    from efabuild.store.tiers.s3 import S3Tier

    sizes = ctx.sizes
    scratch = ctx.scratch("chunked")
    large, large_bytes, small = sizes.chunked_large_files, sizes.chunked_large_bytes, sizes.chunked_small_files
    ctx.log(f"chunked: writing the EFA tree ({large} × {human_bytes(large_bytes)} + {small} small files)")
    _tree(scratch / "efa", large, large_bytes, small, seed=5)
    images = {"efa": _squash(scratch / "efa", scratch / "efa.sqsh")}
    for version in range(1, VERSIONS + 1):
        tree = scratch / f"user{version}"
        _user(scratch / "efa", tree, version)
        images[f"user{version}"] = _squash(tree, scratch / f"user{version}.sqsh")
        shutil.rmtree(tree)
    size = images["user2"].stat().st_size

    # what each export hands over: its digest pass cuts the chunk index too (make/publish.py)
    made = {name: chunk_file(path, chunking=(MIN_SIZE, AVG_SIZE, MAX_SIZE)) for name, path in images.items()}

    def record(key: str, name: str, path: Path) -> ArtifactRecord:
        return ArtifactRecord.for_file(key, name, path, made[path.stem].digest)

    def publish(store: Store, name: str, layer: str) -> None:
        store.publish(keys[name], images[name], record(keys[name], layer, images[name]), index=made[name])

    with S3Server() as server:
        client = boto3.session.Session().client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
        bucket = f"bench-{secrets.token_hex(4)}"
        client.create_bucket(Bucket=bucket)
        settings = S3Config(bucket=bucket, prefix="chunked/", endpoint_url=server.endpoint, region="us-east-1")
        whole_settings = S3Config(bucket=bucket, prefix="whole/", endpoint_url=server.endpoint, region="us-east-1")
        builder = Store([FilesystemTier(scratch / "builder", "local")], settings, show_progress=False)
        keys = {name: secrets.token_hex(32) for name in images}

        ctx.log("chunked: publishing efa and user v1")
        for name in ("efa", "user1"):
            publish(builder, name, f"bench:{name[:4]}")
        efa_chunks = set(made["efa"].unique())
        user_index = made["user1"]
        shared_with_efa = sum(length for cid, length in user_index.chunks if cid in efa_chunks) / user_index.size

        ctx.log("chunked: timing the publish of user v2")
        whole = S3Tier(whole_settings, show_progress=False, chunked=False)
        ours_publish, whole_publish = [], []
        warm(images["user2"])
        for _ in range(ctx.repeats):
            started = time.perf_counter()
            publish(builder, "user2", "bench:user")
            ours_publish.append(time.perf_counter() - started)
            sent = builder.s3.last_transfer
            # as it was before: v2 on no tier, its new chunks not in the bucket
            builder.s3.delete(keys["user2"])
            builder.s3.chunks.delete_objects([builder.s3.chunks.object(c) for c in sorted(sent.created)])
            builder.fs_tiers[0].delete(keys["user2"])
            started = time.perf_counter()
            whole.publish(keys["user2"], images["user2"], record(keys["user2"], "bench:user", images["user2"]))
            whole_publish.append(time.perf_counter() - started)
            whole.delete(keys["user2"])
        publish(builder, "user2", "bench:user")  # both kept for the fetches
        whole.publish(keys["user2"], images["user2"], record(keys["user2"], "bench:user", images["user2"]))
        digest_pass, index_pass, check_pass = _digest_passes(images["user2"], ctx.repeats)

        ctx.log("chunked: timing the fetch of user v2 onto a node holding v1")
        ours_fetch, whole_fetch, got = _time_fetches(scratch, settings, whole_settings, keys)

        on_xfs = _fetch_on_xfs(ctx, scratch, settings, whole_settings, keys)

        for version in range(3, VERSIONS + 1):
            publish(builder, f"user{version}", "bench:user")
        # everything the chunked prefix holds: the EFA image and five user versions on it
        five = sum(item["Size"] for item in _listing(client, bucket, "chunked/"))
        ctx.log("chunked: timing ls of the bucket")
        listed = _time_ls(scratch, settings, client, ctx.repeats)
        if got is None or sent is None:
            raise BenchError("the chunked publish or fetch reported no transfer")
    return Result(
        id="chunked",
        what=f"user layer, one file changed, {human_bytes(size)} image (S3 loopback)",
        checks=(
            Check("publish: bytes sent", 100 * sent.bytes / size, 1.0, "lower", unit="%",
                  efabuild=human_bytes(sent.bytes), baseline=human_bytes(size), full_size_only=True),
            Check("publish: time vs whole object", median(ours_publish) / median(whole_publish), 0.1, "lower",
                  efabuild=f"{median(ours_publish):.2f} s", baseline=f"{median(whole_publish):.2f} s (whole object)",
                  full_size_only=True),
            Check("fetch: bytes downloaded", 100 * got.bytes / size, 1.0, "lower", unit="%",
                  efabuild=human_bytes(got.bytes), baseline=human_bytes(size), full_size_only=True),
            Check("fetch: time vs whole object", ours_fetch / whole_fetch, 0.2, "lower",
                  efabuild=f"{ours_fetch:.2f} s", baseline=f"{whole_fetch:.2f} s (whole object)", full_size_only=True),
            *_xfs_checks(on_xfs),
            Check("user bytes in EFA's chunks", 100 * shared_with_efa, 95.0, "higher", unit="%", full_size_only=True),
            Check(f"S3 bytes for {VERSIONS} versions ÷ one", five / size, 1.2, "lower", unit="×",
                  efabuild=human_bytes(five), baseline=human_bytes(size), full_size_only=True),
            Check("ls: time vs listing the records", median(listed.ls) / median(listed.records), 3.0, "lower",
                  efabuild=f"{median(listed.ls):.2f} s, {listed.ls_requests} requests",
                  baseline=f"{median(listed.records):.2f} s, {listed.records_requests} requests (records alone)"),
        ),
        timings=(Timing("chunked publish of v2", tuple(ours_publish)), Timing("whole-object publish", tuple(whole_publish)),
                 Timing("seeded fetch of v2", (ours_fetch,)), Timing("whole-object fetch", (whole_fetch,)),
                 Timing("export's digest pass, blake3 and chunk index", index_pass),
                 Timing("export's digest pass, blake3 alone (no chunked tier)", digest_pass),
                 Timing("a kept chunk index checked against the file", check_pass),
                 Timing("ls of the bucket (S3 stored/unique bytes)", listed.ls),
                 Timing("listing the bucket's records alone", listed.records),
                 *([Timing("seeded fetch of v2 onto XFS", (on_xfs[0],)),
                    Timing("whole-object fetch onto XFS", (on_xfs[1],))] if on_xfs else [])),
        figures={"image_bytes": size, "publish_sent_bytes": sent.bytes, "publish_sent_chunks": sent.chunks,
                 "fetch_downloaded_bytes": got.bytes, "fetch_reused_bytes": got.reused_bytes,
                 "xfs_fetch_cloned_bytes": on_xfs[2] if on_xfs else None,
                 "s3_bytes_all_versions": five, "user_files_added": USER_FILES,
                 "user_bytes_added": USER_FILES * USER_FILE_BYTES},
        notes=("S3 bytes: every chunk object (zstd), index, record and manifest under the prefix, the EFA "
               "image included (its bytes are the bulk of every user version)",
               f"the export's digest pass of v2 took {median(index_pass):.2f} s with the chunk index the publish "
               f"sends from, {median(digest_pass):.2f} s for blake3 alone; checking a kept index against "
               f"it took {median(check_pass):.2f} s (warm, medians)"),
    )


def _digest_passes(path: Path, repeats: int) -> tuple[tuple[float, ...], ...]:
    """Times over `path` (warm), interleaved: the export's digest pass, blake3 alone and blake3 with
    the chunk index (what an export for a chunked S3 tier runs); and the check of a kept index
    against the file (what a copy to S3 from a filesystem tier runs instead of cutting again)."""
    from efabuild.chunks.cdc import chunk_file, mismatch
    from efabuild.host.digest import file_digest

    times: tuple[list[float], ...] = ([], [], [])
    warm(path)
    index = chunk_file(path)
    for _ in range(repeats):
        for spent, run in zip(times, (lambda: file_digest(path), lambda: chunk_file(path),
                                      lambda: mismatch(index, path))):
            started = time.perf_counter()
            run()
            spent.append(time.perf_counter() - started)
    return tuple(tuple(spent) for spent in times)


def _time_fetches(root: Path, settings, whole_settings, keys: dict[str, str]):  # noqa: ANN001, ANN202
    """(seeded fetch of v2, whole-object fetch of v2, what the seeded one moved) onto stores under
    `root`; the node fetches v1 first (written: it is the seed)."""
    from efabuild.store.tiers.fs import FilesystemTier
    from efabuild.store.tiered import Store

    node = Store([FilesystemTier(root / "node", "shared")], settings, show_progress=False)
    seed = node.fetch(keys["user1"])
    node.fs_tiers[0].names.append("bench:user", keys["user1"])
    settled(seed)  # fetched by an earlier job, not seconds before
    started = time.perf_counter()
    node.fetch(keys["user2"])
    seeded = time.perf_counter() - started
    whole_node = Store([FilesystemTier(root / "whole-node", "shared")], whole_settings, show_progress=False,
                       s3_options={"chunked": False})
    started = time.perf_counter()
    whole_node.fetch(keys["user2"])
    return seeded, time.perf_counter() - started, node.s3.last_transfer


def _fetch_on_xfs(ctx: Context, scratch: Path, settings, whole_settings, keys: dict[str, str]):  # noqa: ANN001, ANN202
    """_time_fetches onto a loop-mounted XFS with reflink, or None where none can be mounted."""
    with loop_xfs(scratch, 8 * 1024 * MiB, ctx.log) as mount:
        if mount is None:
            return None
        ctx.log("chunked: timing the fetch of user v2 onto XFS (reflink) holding v1")
        seeded, whole, got = _time_fetches(mount, settings, whole_settings, keys)
        return seeded, whole, got.cloned_bytes


def _xfs_checks(on_xfs) -> list[Check]:  # noqa: ANN001
    if on_xfs is None:
        return []
    seeded, whole, cloned = on_xfs
    return [Check("fetch onto XFS (reflink): time vs whole object", seeded / whole, 0.2, "lower",
                  efabuild=f"{seeded:.2f} s ({human_bytes(cloned)} cloned)", baseline=f"{whole:.2f} s (whole object)",
                  full_size_only=True)]


@dataclass(frozen=True)
class _Listed:
    ls: tuple[float, ...]
    records: tuple[float, ...]
    ls_requests: int
    records_requests: int


def _time_ls(root: Path, settings, client, repeats: int) -> _Listed:  # noqa: ANN001
    """What `efabuild ls` asks S3 (every record, and every chunk index for the S3 STORED/UNIQUE
    column) on a node holding nothing, vs the baseline: a boto3 listing of objects/ and a GET of
    each record, the least any listing of names, sizes and dates costs. Interleaved, warm."""
    from efabuild.store.gc.s3chunks import bucket_usage
    from efabuild.store.tiers.fs import FilesystemTier
    from efabuild.store.tiered import Store

    node = Store([FilesystemTier(root / "ls-node", "local")], settings, show_progress=False)
    counted = {"n": 0}
    node.s3.client.meta.events.register("before-call.s3", lambda **_: counted.__setitem__("n", counted["n"] + 1))
    prefix = settings.prefix.strip("/") + "/objects/"

    def ls() -> None:
        listings = node.ls()
        bucket_usage(node.s3, [listing.record for listing in listings])

    def records() -> None:
        for item in _listing(client, settings.bucket, prefix):
            if item["Key"].endswith(".json") and not item["Key"].endswith((".chunks.json", ".manifest.json")):
                client.get_object(Bucket=settings.bucket, Key=item["Key"])["Body"].read()

    times: tuple[list[float], list[float]] = ([], [])
    ls()
    ls_requests, counted["n"] = counted["n"], 0
    for _ in range(repeats):
        for spent, run in zip(times, (ls, records)):
            started = time.perf_counter()
            run()
            spent.append(time.perf_counter() - started)
    found = _listing(client, settings.bucket, prefix)
    records_requests = -(-len(found) // 1000) + sum(
        item["Key"].endswith(".json") and not item["Key"].endswith((".chunks.json", ".manifest.json")) for item in found)
    return _Listed(tuple(times[0]), tuple(times[1]), ls_requests, records_requests)


def _listing(client, bucket: str, prefix: str) -> list[dict]:  # noqa: ANN001
    items, token = [], None
    while True:
        page = client.list_objects_v2(Bucket=bucket, Prefix=prefix, **({"ContinuationToken": token} if token else {}))
        items += page.get("Contents", [])
        if not page.get("IsTruncated"):
            return items
        token = page["NextContinuationToken"]
