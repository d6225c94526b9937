"""The chunked S3 tier against a hostile co-tenant: someone who may write the shared filesystem
tier and the bucket plants chunk indexes, chunks and seeds, and efabuild must never hand out
wrong bytes, hang, read without bound or store an artifact it cannot fetch back.

Every case runs the store as users run it, on the loopback S3 server, over real SquashFS images.
"""

from __future__ import annotations

import os
import random
import resource
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from efabuild.errors import EfabuildError
from efabuild.settings import S3Config
from efabuild.chunks.cdc import AVG_SIZE, MIN_SIZE, ChunkIndex
from efabuild.host.digest import file_digest
from efabuild.store.tiers.fs import FilesystemTier
from efabuild.store.tiers.s3 import S3Tier
from efabuild.store.chunked.s3 import compress
from efabuild.store.tiered import Store
from tests.kits.storekit import CHUNKED, REPO, efabuild, key_for, make_sqsh, publish, record_for

pytestmark = pytest.mark.s3
KiB, MiB = 1024, 1024 * 1024


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> list[Path]:
    """Two versions of an image: v2 inserts 20 KiB early on."""
    rng = random.Random(5)
    body = rng.randbytes(2 * MiB)
    v2 = body[:MiB] + rng.randbytes(20 * KiB) + body[MiB:]
    base = tmp_path_factory.mktemp("versions")
    return [make_sqsh(base, payload, f"v{i + 1}") for i, payload in enumerate((body, v2))]


def store_at(directory: Path, settings: S3Config, name: str = "shared") -> Store:
    return Store([FilesystemTier(directory, name)], settings, show_progress=False, s3_options=CHUNKED)


def within(seconds: float, function, *args):  # noqa: ANN001, ANN201
    """function(*args) on a thread; a hang fails the test instead of hanging it."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = function(*args)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "hangs"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def test_a_seed_swapped_for_a_fifo_costs_a_download_not_a_hang(tmp_path, settings, versions):
    builder = store_at(tmp_path / "cache", settings, "local")
    k1, k2 = publish(builder, versions[0]), publish(builder, versions[1])
    cluster = store_at(tmp_path / "fsx", settings)
    assert file_digest(cluster.lookup(k1)) == file_digest(versions[0])  # v1 fetched, its index kept: a seed
    seeds = cluster.seeds("demo:user")
    seed = cluster.fs_tiers[0].sqsh_path(k1)
    assert [s.path for s in seeds] == [seed]
    # once the seeds are chosen, a co-tenant swaps a FIFO in: opening it to read waits for a writer
    seed.unlink()
    os.mkfifo(seed)
    dest = tmp_path / "fetched.sqsh"
    within(30, lambda: cluster.s3.download(k2, dest, cluster.s3.record(k2), seeds=seeds))
    assert file_digest(dest) == file_digest(versions[1])
    assert cluster.s3.last_transfer.reused == 0


def test_a_planted_index_beside_a_filesystem_copy_never_makes_publish_store_other_bytes(
        tmp_path, settings, versions):
    shared = FilesystemTier(tmp_path / "fsx", "shared")
    builder = Store([shared], settings, show_progress=False, s3_options=CHUNKED)
    k1 = publish(builder, versions[0])  # in the bucket, its chunks known to this node
    # v2 reached the shared tier alone (the bucket came later): `make` will copy it up
    k2 = key_for("demo:user-v2")
    shared.publish(k2, versions[1], record_for(k2, "demo:user", versions[1]))
    # a co-tenant plants an index for v2 that names v1's chunks, with v2's size and digest
    real = shared.chunk_index(k1)
    forged = ChunkIndex(size=versions[1].stat().st_size, digest=file_digest(versions[1]),
                        chunks=((real.chunks[0][0], real.chunks[0][1] + 20 * KiB), *real.chunks[1:]),
                        chunking=real.chunking)
    index_file = tmp_path / "fsx" / "objects" / k2[:2] / f"{k2}.chunks.json"
    index_file.write_bytes(forged.to_json())
    assert builder.complete(k2) is not None  # copied into the bucket
    node = store_at(tmp_path / "node", settings)
    assert file_digest(node.lookup(k2)) == file_digest(versions[1])


def test_a_file_renamed_over_a_checked_copy_is_never_copied_on(tmp_path, settings, versions, monkeypatch):
    """A co-tenant renames other bytes of the same size over a shared copy the moment it has been
    checked (a real one would watch for it with inotify; here the test does it right after the
    check), with an index beside it that describes them but claims the record's digest."""
    from efabuild.store import transfer

    shared = FilesystemTier(tmp_path / "fsx", "shared")
    local = FilesystemTier(tmp_path / "cache", "local")
    key = key_for("demo:user-v1")
    shared.publish(key, versions[0], record_for(key, "demo:user", versions[0]))
    good = file_digest(versions[0])
    forged = bytearray(versions[0].read_bytes())
    forged[len(forged) // 2] ^= 0xFF
    forged_file = tmp_path / "forged.sqsh"
    forged_file.write_bytes(bytes(forged))
    from efabuild.chunks.cdc import chunk_file

    real = chunk_file(forged_file, chunking=CHUNKED["chunking"])
    hint = ChunkIndex(size=real.size, digest=good, chunks=real.chunks, chunking=real.chunking)
    (tmp_path / "fsx" / "objects" / key[:2] / f"{key}.chunks.json").write_bytes(hint.to_json())
    checked = transfer.file_digest

    def check_then_swap(path):  # noqa: ANN001, ANN202
        digest = checked(path)
        os.replace(forged_file, shared.sqsh_path(key))
        return digest

    monkeypatch.setattr(transfer, "file_digest", check_then_swap)
    store = Store([local, shared], settings, show_progress=False, s3_options=CHUNKED)
    store.complete(key)
    monkeypatch.undo()
    assert file_digest(local.sqsh_path(key)) == good
    assert file_digest(store_at(tmp_path / "node", settings).lookup(key)) == good


def test_a_forged_s3_index_with_a_huge_chunk_is_refused_before_any_allocation(tmp_path, settings, versions):
    key = publish(store_at(tmp_path / "cache", settings), versions[0])
    tier = S3Tier(settings, **CHUNKED)
    size = 1 << 40  # one "chunk" of a TiB: a node must not truncate, allocate or decompress that much
    import zstandard

    body = zstandard.ZstdCompressor(write_content_size=False).compress(b"x")  # its header names no size
    forged = ChunkIndex(size=size, digest="blake3:" + "0" * 64, chunks=(("a" * 64, size),))
    client = tier.client
    client.put_object(Bucket=settings.bucket, Key=tier.index_object(key), Body=forged.to_json())
    client.put_object(Bucket=settings.bucket, Key=tier.chunks.object("a" * 64), Body=body)
    record = record_for(key, "demo:user", versions[0])
    client.put_object(Bucket=settings.bucket, Key=tier.record_object(key),
                      Body=record._replace(size=size, digest=forged.digest).to_json())
    node = store_at(tmp_path / "node", settings)
    with pytest.raises(EfabuildError, match="chunk"):
        node.lookup(key)
    assert os.listdir(tmp_path / "node" / "tmp") == []


CHILD = """
import sys
from efabuild.settings import S3Config
from efabuild.store.tiers.s3 import S3Tier
from efabuild.errors import EfabuildError
settings = S3Config(bucket=sys.argv[1], prefix="images/", region="us-east-1", endpoint_url=sys.argv[2])
tier = S3Tier(settings, chunking=(8 * 1024, 32 * 1024, 128 * 1024))
def peak():  # VmHWM, in KiB: the peak resident size of this program (ru_maxrss survives exec)
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
tier.client
before = peak()
try:
    tier.chunks.fetch(sys.argv[3], 4096)
    print("fetched")
except EfabuildError as exc:
    print("refused", exc, file=sys.stderr)
print((peak() - before) // 1024)
"""


@pytest.mark.parametrize("what", ["chunk", "index"])
def test_an_oversized_object_in_the_bucket_is_not_read_whole(tmp_path, settings, what):
    tier = S3Tier(settings, **CHUNKED)
    cid = "b" * 64
    junk = os.urandom(1 << 20) * 200  # 200 MiB where a 4 KiB chunk (or a small index) belongs
    path = tier.chunks.object(cid) if what == "chunk" else tier.index_object(cid)
    tier.client.put_object(Bucket=settings.bucket, Key=path, Body=junk)
    del junk
    script = CHILD if what == "chunk" else CHILD.replace("tier.chunks.fetch(sys.argv[3], 4096)",
                                                         "tier.chunk_index(sys.argv[3])")
    done = subprocess.run([sys.executable, "-c", script, settings.bucket, settings.endpoint_url, cid],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "refused" in done.stderr, done.stderr
    grew_mib = int(done.stdout.split()[-1])
    assert grew_mib < 64, f"reading a planted 200 MiB {what} grew the process by {grew_mib} MiB"


def _outside_link(index: Path, outside: Path) -> None:
    outside.write_bytes(index.read_bytes())
    index.unlink()
    index.symlink_to(outside)


def _fifo(index: Path, outside: Path) -> None:  # noqa: ARG001
    index.unlink()
    os.mkfifo(index)


def _ten_gb(index: Path, outside: Path) -> None:  # noqa: ARG001
    with open(index, "r+b") as handle:
        handle.truncate(10 << 30)  # sparse: 10 GB that a read would have to go through


def _deep(index: Path, outside: Path) -> None:  # noqa: ARG001
    index.write_bytes(b"[" * 200_000)


def _shuffled(index: Path, outside: Path) -> None:  # noqa: ARG001
    """Its real chunk ids and lengths, in another order: every offset is wrong."""
    real = ChunkIndex.from_json(index.read_bytes(), "x")
    chunks = list(real.chunks)
    random.Random(1).shuffle(chunks)
    index.write_bytes(ChunkIndex(size=real.size, digest=real.digest, chunks=tuple(chunks),
                                 chunking=real.chunking).to_json())


@pytest.mark.parametrize("plant", [_outside_link, _fifo, _ten_gb, _deep, _shuffled])
def test_a_planted_kept_index_never_yields_wrong_bytes_a_hang_or_a_long_read(tmp_path, settings, versions, plant):
    builder = store_at(tmp_path / "cache", settings, "local")
    k1, k2 = publish(builder, versions[0]), publish(builder, versions[1])
    cluster = store_at(tmp_path / "fsx", settings)
    cluster.lookup(k1)
    index = tmp_path / "fsx" / "objects" / k1[:2] / f"{k1}.chunks.json"
    plant(index, tmp_path / "outside.json")
    fetched = within(30, cluster.lookup, k2)
    assert file_digest(fetched) == file_digest(versions[1])
    if plant is not _shuffled:  # the others are no index at all: v2 is downloaded whole
        assert cluster.s3.last_transfer.reused == 0


@pytest.mark.parametrize("states_its_size", [True, False])
def test_a_chunk_that_inflates_past_its_length_is_refused_without_inflating(tmp_path, settings, states_its_size):
    import zstandard

    tier = S3Tier(settings, **CHUNKED)
    bomb = zstandard.ZstdCompressor(write_content_size=states_its_size).compress(b"\0" * (256 * MiB))
    assert len(bomb) < 64 * KiB
    cid = "c" * 64
    tier.client.put_object(Bucket=settings.bucket, Key=tier.chunks.object(cid), Body=bomb)
    with pytest.raises(EfabuildError, match="zstd|bytes"):
        tier.chunks.fetch(cid, 32 * KiB)


def _bomb(declares_size: bool) -> bytes:
    """1 GiB of zeros as one zstd frame of ~32 KiB, its header declaring that size or not."""
    import io

    import zstandard

    compressor = zstandard.ZstdCompressor(level=3, write_content_size=declares_size)
    with compressor.stream_writer(out := io.BytesIO(), closefd=False,
                                  size=(1 << 30) if declares_size else -1) as writer:
        zeros = bytes(1 << 20)
        for _ in range(1024):
            writer.write(zeros)
    return out.getvalue()


@pytest.mark.parametrize("bomb", ["declares 1 GiB", "declares nothing"])
def test_a_zstd_bomb_in_the_bucket_is_refused_before_it_takes_memory(tmp_path, settings, bomb):
    """A chunk object of ~32 KiB (within zstd's bound for a 4 MiB chunk) that inflates to 1 GiB:
    python-zstandard's one-shot decompress allocates what the frame declares, whatever the
    output limit says (1.1 GiB per chunk). A fetch allocates at most the index's length."""
    body = _bomb(bomb == "declares 1 GiB")
    assert len(body) < 64 * KiB
    tier = S3Tier(settings, **CHUNKED)
    cid = "d" * 64
    tier.client.put_object(Bucket=settings.bucket, Key=tier.chunks.object(cid), Body=body)
    script = CHILD.replace("tier.chunks.fetch(sys.argv[3], 4096)", "tier.chunks.fetch(sys.argv[3], 4 << 20)")
    done = subprocess.run([sys.executable, "-c", script, settings.bucket, settings.endpoint_url, cid],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "refused" in done.stderr and ("zstd" in done.stderr or "bytes" in done.stderr), done.stderr
    grew_mib = int(done.stdout.split()[-1])
    assert grew_mib < 32, f"a {len(body) // KiB} KiB chunk object grew the fetch by {grew_mib} MiB"


def test_a_forged_gc_mark_never_deletes_a_chunk_that_an_index_references(tmp_path, settings, versions):
    import json
    import time

    from efabuild.store.gc.s3chunks import collect

    store = store_at(tmp_path / "cache", settings, "local")
    key = publish(store, versions[0])
    tier = store.s3
    listed = [item["Key"] for item in tier._list(tier._path("chunks") + "/")]
    ids = [path.rsplit("/", 1)[-1] for path in listed]
    # a co-tenant's mark, a day old by its own word, naming every chunk of the bucket as unreferenced;
    # and junk beside it where marks go
    marks = tier._path("gc/marks")
    tier.client.put_object(Bucket=settings.bucket, Key=f"{marks}/forged.json",
                           Body=json.dumps({"time": time.time() + 5, "unreferenced": ids}).encode())
    tier.client.put_object(Bucket=settings.bucket, Key=f"{marks}/deep.json", Body=b"[" * 200_000)
    tier.client.put_object(Bucket=settings.bucket, Key=f"{marks}/nan.json",
                           Body=b'{"time": "nan", "unreferenced": "' + ids[0].encode() + b'"}')
    report = collect(tier.chunks, grace=1, dry_run=False, now=time.time() + 10)
    assert report.deleted == 0 and report.referenced == len(set(ids))
    assert sorted(item["Key"] for item in tier._list(tier._path("chunks") + "/")) == sorted(listed)
    node = store_at(tmp_path / "node", settings)
    assert file_digest(node.lookup(key)) == file_digest(versions[0])


def test_a_forged_artifact_larger_than_the_filesystem_allows_is_one_line(tmp_path, settings, versions, capsys,
                                                                         monkeypatch):
    """A record and index for 32 TiB (more than ext4 lets one file hold, and an index of more
    chunks than an index may list) is one line naming the file, not a traceback, and leaves
    nothing behind."""
    from efabuild.cli import main
    from efabuild.chunks.cdc import MAX_CHUNK_BYTES
    from efabuild.store.config import store_config_text

    key = publish(store_at(tmp_path / "cache", settings), versions[0])
    tier = S3Tier(settings, **CHUNKED)
    count = (32 << 40) // MAX_CHUNK_BYTES
    forged = ChunkIndex(size=count * MAX_CHUNK_BYTES, digest="blake3:" + "0" * 64,
                        chunks=(("e" * 64, MAX_CHUNK_BYTES),) * count)
    record = record_for(key, "demo:user", versions[0])._replace(size=forged.size, digest=forged.digest)
    tier.client.put_object(Bucket=settings.bucket, Key=tier.index_object(key), Body=forged.to_json())
    tier.client.put_object(Bucket=settings.bucket, Key=tier.record_object(key), Body=record.to_json())
    node = tmp_path / "node"
    node.mkdir()
    (node / "store.toml").write_text(store_config_text(settings))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EFABUILD_STORE", raising=False)
    code = main(["lookup", "--store", str(node), key])
    stderr = capsys.readouterr().err
    assert code == 1 and "Traceback" not in stderr, stderr
    error = stderr.splitlines()[-1]  # after the fetch's progress line
    assert error.startswith("efabuild: ") and "larger than the" in error and key in error, stderr
    assert not (node / "tmp").exists() or os.listdir(node / "tmp") == []


@pytest.mark.parametrize("planted", ["junk", "other bytes", "more than an index may hold"])
def test_an_index_planted_beside_a_whole_object_artifact_does_not_make_it_unfetchable(tmp_path, settings,
                                                                                        versions, planted):
    """Creating an object is all it takes: an index where a whole-object artifact (published
    before chunking) has none. The fetch falls back on the whole object, which its record vouches for."""
    whole = Store([FilesystemTier(tmp_path / "old", "local")], settings, show_progress=False,
                  s3_options={**CHUNKED, "chunked": False})
    key = publish(whole, versions[0])
    tier = S3Tier(settings, **CHUNKED)
    body = b"[" * 5000 if planted == "junk" else b" " * (25 * MiB)
    if planted == "other bytes":
        other = key_for("other")
        tier.publish(other, versions[1], record_for(other, "demo:other", versions[1]))
        body = tier.last_index.to_json()
    tier.client.put_object(Bucket=settings.bucket, Key=tier.index_object(key), Body=body)
    node = store_at(tmp_path / "node", settings)
    assert file_digest(node.lookup(key)) == file_digest(versions[0])


def _read_bytes_so_far() -> int:
    return next(int(line.split()[1]) for line in open("/proc/self/io") if line.startswith("rchar:"))


def test_choosing_seeds_reads_a_bounded_amount_whatever_history_and_indexes_are_planted(tmp_path, settings,
                                                                                         versions):
    """A co-tenant gives a name a long history of keys, each with a 60 MiB index beside it: the
    fetch reads a bounded amount of them to choose its seeds (they were all read: 1000 x 60 MiB),
    and still fetches right."""
    builder = store_at(tmp_path / "cache", settings, "local")
    k1, k2 = publish(builder, versions[0]), publish(builder, versions[1])
    cluster = store_at(tmp_path / "fsx", settings)
    cluster.lookup(k1)  # a real seed, kept with its index
    shared = cluster.fs_tiers[0]
    planted = [key_for(f"planted-{i}") for i in range(40)]
    for key in planted:
        directory = tmp_path / "fsx" / "objects" / key[:2]
        directory.mkdir(exist_ok=True)
        with open(directory / f"{key}.chunks.json", "wb") as handle:
            handle.truncate(60 * MiB)  # sparse: costs the co-tenant no space, a reader 60 MiB each
        shared.names.append("demo:user", key)
    shared.names.append("demo:user", k1)
    before = _read_bytes_so_far()
    seeds = cluster.seeds("demo:user")
    read_mib = (_read_bytes_so_far() - before) // MiB
    assert read_mib <= 300, f"choosing seeds read {read_mib} MiB"
    assert [s.path for s in seeds] == [shared.sqsh_path(k1)]
    assert file_digest(cluster.lookup(k2)) == file_digest(versions[1])


def test_a_name_whose_s3_history_is_flooded_is_one_error_not_an_endless_listing(tmp_path, settings, versions,
                                                                                  monkeypatch):
    """Creating objects is all it takes to flood refs/<graph>/<layer>/: a lookup of the name
    stops listing at a bound. (The bound is lowered here so that the test creates 60 objects,
    not 100,000.)"""
    from efabuild.store.tiers import s3names

    monkeypatch.setattr(s3names, "MAX_ENTRIES", 50)
    key = publish(store_at(tmp_path / "cache", settings), versions[0])
    tier = S3Tier(settings, **CHUNKED)
    for number in range(60):
        tier.client.put_object(Bucket=settings.bucket, Body=b"",
                               Key=tier._path("refs", "demo", "user") + f"/0000-{number:04}.{key}")
    node = store_at(tmp_path / "node", settings)
    with pytest.raises(EfabuildError, match="more than 50 objects"):
        node.lookup("demo:user")
    assert file_digest(node.lookup(key)) == file_digest(versions[0])  # by key it is still there


def test_names_planted_in_the_gc_trash_never_remove_a_running_gc_s_entry(tmp_path, settings, versions, monkeypatch):
    """gc/trash/<id> is where a running gc keeps a chunk until it knows no new index names it. A
    co-tenant's objects there (junk names, an old `sub/<id>` naming that chunk) are removed as
    what they are: never taken for another gc's entry of that id and deleted in its place."""
    import time

    from efabuild.store.gc import chunks as chunksweep
    from efabuild.store.gc.s3chunks import collect

    store = store_at(tmp_path / "cache", settings, "local")
    publish(store, versions[0])
    tier = store.s3
    live = sorted(item["Key"].rsplit("/", 1)[-1] for item in tier._list(tier._path("chunks") + "/"))[0]
    trash = tier._path(chunksweep.TRASH_DIR)
    for name in (f"sub/{live}", "not-a-chunk"):
        tier.client.put_object(Bucket=settings.bucket, Key=f"{trash}/{name}", Body=b"planted")
    time.sleep(5)  # the bucket dates objects to the second: these are older than the entry below
    # another gc, mid-run, has just moved this chunk aside (it is unreferenced as far as it knew)
    tier.client.copy_object(Bucket=settings.bucket, Key=f"{trash}/{live}",
                            CopySource={"Bucket": settings.bucket, "Key": tier.chunks.object(live)})
    monkeypatch.setattr(chunksweep, "ABANDONED_AFTER_S", 2.5)  # instead of an hour, so the plants are old
    report = collect(tier.chunks, dry_run=False)
    left = sorted(item["Key"][len(trash) + 1:] for item in tier._list(trash + "/"))
    assert left == [live]  # the running gc's entry is still there; what was planted is gone
    assert report.deleted == 0


def test_a_gc_mark_named_with_terminal_escapes_is_named_escaped(tmp_path, settings, versions, capsys):
    """Bucket keys are anyone's who may write the bucket: gc (run as root on a node) warns about
    a planted one by name, and its escape sequences must not reach the terminal raw."""
    from efabuild.cli import main

    store = store_at(tmp_path / "cache", settings, "local")
    publish(store, versions[0])
    tier = store.s3
    tier.client.put_object(Bucket=settings.bucket, Key=tier._path("gc/marks") + "/x\x1b]2;title\x07\x1b[2J",
                           Body=b"junk")
    (tmp_path / "cache" / "store.toml").write_text(
        f'[s3]\nbucket = "{settings.bucket}"\nprefix = "{settings.prefix}"\nregion = "us-east-1"\n'
        f'endpoint_url = "{settings.endpoint_url}"\n')
    assert main(["gc", "--s3", "--store", str(tmp_path / "cache")]) == 0
    out, err = capsys.readouterr()
    assert "not a gc mark" in err, err
    assert "\x1b" not in out + err and "\x07" not in out + err


def _flood(tier: S3Tier, prefix: str, count: int) -> None:
    """`count` objects under `prefix`, as a co-tenant with write access can create them."""
    from efabuild.store.parallel import run_parallel

    run_parallel(lambda n: tier.client.put_object(Bucket=tier.bucket, Key=f"{prefix}{n:06}", Body=b""),
                 range(count), 8)


@pytest.mark.parametrize("command", [["gc", "--yes", "--s3", "--keep", "1"], ["ls"], ["lookup", "PREFIX"]])
def test_a_flooded_objects_prefix_is_one_line_naming_it_and_the_bound(tmp_path, settings, versions, monkeypatch,
                                                                       command):
    """Objects planted under objects/ stop gc, ls and a lookup by key prefix (which the plan asks
    too) at a bound, with one line naming the bucket, the prefix and the bound, and gc deletes
    nothing. (The bound is lowered here so that the test plants 250 objects, not millions.)"""
    from efabuild.store import s3client

    builder = store_at(tmp_path / "cache", settings, "local")
    old, new = publish(builder, versions[0]), publish(builder, versions[1])
    monkeypatch.setattr(s3client, "MAX_LISTED", 200)  # above the ~70 chunks of both versions
    flood = builder.s3._path("objects", old[:2]) + f"/{old[:12]}-planted-"
    _flood(builder.s3, flood, 250)
    command = [old[:12] if word == "PREFIX" else word for word in command]
    if command[0] == "lookup":  # not on the filesystem tier: S3 is asked which key the prefix means
        (tmp_path / "cache" / "objects" / old[:2] / f"{old}.json").unlink()
    result = efabuild(*command, "--store", str(tmp_path / "cache"))
    listed = f"s3://{settings.bucket}/images/objects/" + (f"{old[:2]}/{old[:12]}" if command[0] == "lookup" else "")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [f"efabuild: {listed}: more than 200 objects (not written by efabuild?); "
                                          f"not listed further"]
    assert builder.s3.has(old) and builder.s3.has(new)


def test_gc_finds_what_every_name_points_at_in_one_listing_of_the_refs(tmp_path, settings, versions, fault_proxy):
    """A co-tenant can create names by the thousand (an object each under refs/): gc reads the
    current key of every name from one listing, not a listing per name; and it keeps them."""
    proxied = S3Config(bucket=settings.bucket, prefix=settings.prefix, region="us-east-1",
                       endpoint_url=fault_proxy.endpoint)
    builder = store_at(tmp_path / "cache", proxied, "local")
    old, new = publish(builder, versions[0]), publish(builder, versions[1])
    tier = builder.s3
    for number in range(30):
        tier.client.put_object(Bucket=tier.bucket, Body=b"",
                               Key=tier._path("refs", f"planted{number}", "user") + f"/2026-01-01T00:00:00Z.{old}")
    before = len(fault_proxy.requests)
    report = builder.gc(keep=1, dry_run=True)
    refs_listings = [path for method, path, _ in fault_proxy.requests[before:]
                     if method == "GET" and "list-type=2" in path and "prefix=images%2Frefs%2F" in path]
    assert len(refs_listings) == 1
    assert old in report.kept and new in report.kept  # a planted name points at it: it stays


FETCH = """
import sys
from efabuild.cli import main
code = main(["lookup", "--store", sys.argv[1], sys.argv[2]])
def field(path, name):
    return next(int(line.split()[1]) for line in open(path) if line.startswith(name))
# bytes written by system calls; the peak resident size (KiB), a child's own (ru_maxrss is the
# largest of all a parent waited for)
print("measured", code, field("/proc/self/io", "wchar:"), field("/proc/self/status", "VmHWM:"), file=sys.stderr)
"""
FETCH_RSS_BOUND = 512 * MiB  # the README's bound on what a fetch holds, whatever the bucket says


def _forged(case: str) -> tuple[list[tuple[str, int]], dict[str, bytes], tuple[int, int, int] | None]:
    """(an index's chunks, the chunk objects to plant {id: body}, the chunking it declares) of one
    forged artifact; every id is wrong for its bytes unless said."""
    import zstandard

    ids = [key_for(f"{case}-{number}") for number in range(16)]
    if case in ("bombs declaring 1 GiB", "bombs declaring nothing"):  # 16 parallel GETs of one each
        body = _bomb(case == "bombs declaring 1 GiB")
        return [(cid, 4 * MiB) for cid in ids], {cid: body for cid in ids}, None
    if case == "16 chunks of 64 MiB":  # each a real frame of its length: 1 GiB at once in 16 GETs
        body = zstandard.ZstdCompressor(level=1).compress(bytes(64 * MiB))
        return [(cid, 64 * MiB) for cid in ids], {cid: body for cid in ids}, (MIN_SIZE, AVG_SIZE, 64 * MiB)
    if case == "one good chunk 8 times":  # every chunk right, the whole wrong: found once all is written
        raw = random.Random(3).randbytes(16 * MiB)
        cid = __import__("blake3").blake3(raw).hexdigest()
        return [(cid, len(raw))] * 8, {cid: zstandard.ZstdCompressor(level=1).compress(raw)}, None
    if case == "12 TiB":  # chunks of the right bytes, in a record more than the filesystem's free space
        raw = bytes(64 * MiB)
        cid = __import__("blake3").blake3(raw).hexdigest()
        return [(cid, 64 * MiB)] * 200_000, {cid: zstandard.ZstdCompressor(level=1).compress(raw)}, (
            MIN_SIZE, AVG_SIZE, 64 * MiB)
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["bombs declaring 1 GiB", "bombs declaring nothing", "16 chunks of 64 MiB",
                                  "one good chunk 8 times", "12 TiB", "a flood of commas"])
def test_a_fetch_of_a_forged_artifact_stays_within_its_memory_and_the_records_size(tmp_path, settings, versions,
                                                                                   case):
    """A bucket writer plants a record and an index that agree (the digest is wrong: nothing else
    can be right), with chunk objects: the fetch, a process of its own as on a node, fails with
    one line, its peak RSS under the README's bound, having written no more than the record's
    size, and leaves nothing behind."""
    from efabuild.store.config import store_config_text

    key = publish(store_at(tmp_path / "cache", settings), versions[0])
    tier = S3Tier(settings, **CHUNKED)
    if case == "a flood of commas":  # 60 MiB of tiny strings: parsed, 800 MB of them, not an index
        size, index = 1 << 30, b'{"format":"efabuild.chunks/v1","chunks":[' + b'"ab",' * (12 * MiB) + b'0]}'
    else:
        chunks, bodies, chunking = _forged(case)
        size = sum(length for _, length in chunks)
        index = ChunkIndex(size=size, digest="blake3:" + "0" * 64, chunks=tuple(chunks),
                           chunking=chunking or (MIN_SIZE, AVG_SIZE, 16 * MiB)).to_json()
        for cid, body in bodies.items():
            tier.client.put_object(Bucket=settings.bucket, Key=tier.chunks.object(cid), Body=body)
    tier.client.put_object(Bucket=settings.bucket, Key=tier.index_object(key), Body=index)
    record = record_for(key, "demo:user", versions[0])._replace(size=size, digest="blake3:" + "0" * 64)
    tier.client.put_object(Bucket=settings.bucket, Key=tier.record_object(key), Body=record.to_json())
    node = tmp_path / "node"
    node.mkdir()
    (node / "store.toml").write_text(store_config_text(settings))
    done, code, wrote, peak = _measured_fetch(node, key)
    assert done.stdout == "", done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("efabuild: ") and "warning" not in line]
    assert code == 1 and len(errors) == 1, done.stderr
    if case == "12 TiB":  # refused before the first write
        assert errors[0].endswith(f"bytes free; {tier.url(tier.index_object(key))} not fetched"), errors
    assert peak < FETCH_RSS_BOUND, f"the fetch's peak RSS was {peak // MiB} MiB"
    assert wrote <= min(size, 256 * MiB) + MiB, f"wrote {wrote // MiB} MiB of a {size // MiB} MiB record"
    assert list((node / "tmp").glob("*")) == [] and list(node.rglob("*.sqsh")) == []


def _measured_fetch(node: Path, key: str) -> tuple[subprocess.CompletedProcess[str], int, int, int]:
    """`efabuild lookup --store NODE KEY` in a process of its own: (it, exit status, bytes it
    wrote, its peak RSS in bytes). No file of it may grow past 1 GiB (a write fails with EFBIG): a
    fetch that would write a forged record's terabytes fails the test, not the machine."""
    limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 30, 1 << 30))  # noqa: E731
    done = subprocess.run([sys.executable, "-c", FETCH, str(node), key], capture_output=True, text=True,
                          timeout=300, cwd=node.parent, env={**os.environ, "PYTHONPATH": str(REPO)}, preexec_fn=limit)
    assert "Traceback" not in done.stderr, done.stderr
    _, code, wrote, peak_kib = done.stderr.splitlines()[-1].split()
    return done, int(code), int(wrote), int(peak_kib) * KiB


def test_seeds_planted_on_the_node_keep_a_fetch_within_its_memory(tmp_path, settings, versions):
    """A co-tenant of the node's shared tier plants artifacts beside the one fetched, each with a
    record and a kept index as large as an index may be: choosing seeds holds a bounded part of
    them, and the fetch, right, stays under the README's bound."""
    from efabuild.store.config import store_config_text

    key = publish(store_at(tmp_path / "cache", settings), versions[0])
    node = tmp_path / "node"
    node.mkdir()
    (node / "store.toml").write_text(store_config_text(settings))
    from efabuild.chunks.cdc import MAX_CHUNKS

    chunks = tuple((key_for(f"planted-{number}"), MIN_SIZE) for number in range(MAX_CHUNKS))
    for number in range(8):  # each its own bytes, by its digest: all of them seeds
        digest = "blake3:" + key_for(f"planted seed {number}")
        index = ChunkIndex(size=MAX_CHUNKS * MIN_SIZE, digest=digest, chunks=chunks).to_json()
        planted = key_for(f"planted seed {number}")
        directory = node / "objects" / planted[:2]
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"{planted}.sqsh").write_bytes(b"")
        (directory / f"{planted}.json").write_bytes(record_for(planted, "demo:user", versions[0])._replace(
            size=MAX_CHUNKS * MIN_SIZE, digest=digest).to_json())
        (directory / f"{planted}.chunks.json").write_bytes(index)
        FilesystemTier(node, "shared").names.append("demo:user", planted)
    done, code, _, peak = _measured_fetch(node, key)
    assert code == 0 and file_digest(Path(done.stdout.strip())) == file_digest(versions[0]), done.stderr
    assert peak < FETCH_RSS_BOUND, f"the fetch's peak RSS was {peak // MiB} MiB"
