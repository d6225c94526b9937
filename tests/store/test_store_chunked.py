"""The chunked S3 tier end to end through the store, on the loopback S3 server: versions share
chunks, a node's fetch is seeded by what it holds, damage is refused, interrupted publishes and a
concurrent gc lose nothing, and whole-object artifacts of before stay readable."""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from efabuild.host.digest import file_digest
from efabuild.errors import EfabuildError
from efabuild.settings import S3Config
from efabuild.store.tiered import Store
from efabuild.store.tiers.fs import FilesystemTier
from efabuild.store.gc.sweep import find_debris
from efabuild.store.tiers.s3 import S3Tier
from efabuild.store.chunked.s3 import ChunkStore
from efabuild.store.gc.s3chunks import collect
from tests.kits.storekit import CHUNKED, key_for, kill_publisher_at, make_sqsh, publish, record_for

pytestmark = pytest.mark.s3
KiB, MiB = 1024, 1024 * 1024


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> list[Path]:
    """Three versions of an image: v2 inserts 20 KiB early on, v3 also changes a byte late."""
    rng = random.Random(3)
    body = rng.randbytes(4 * MiB)
    insert = rng.randbytes(20 * KiB)
    v2 = body[:MiB] + insert + body[MiB:]
    v3 = bytearray(v2)
    v3[-100 * KiB] ^= 0xFF
    base = tmp_path_factory.mktemp("versions")
    return [make_sqsh(base, payload, f"v{i + 1}") for i, payload in enumerate((body, v2, bytes(v3)))]


def builder(base: Path, settings: S3Config, **options) -> Store:
    return Store([FilesystemTier(base / "cache", "local")], settings, show_progress=False,
                 s3_options={**CHUNKED, **options})


def node(base: Path, settings: S3Config) -> Store:
    return Store([FilesystemTier(base / "fsx", "shared")], settings, show_progress=False, s3_options=CHUNKED)


def test_versions_share_chunks_and_a_seeded_fetch_downloads_only_the_difference(tmp_path, settings, versions):
    store = builder(tmp_path, settings)
    k1 = publish(store, versions[0])
    first = store.s3.last_transfer
    assert first.bytes == versions[0].stat().st_size and first.reused == 0
    k2 = publish(store, versions[1])
    second = store.s3.last_transfer
    assert second.bytes < 0.05 * versions[1].stat().st_size  # the insertion and SquashFS's tables
    assert store.fs_tiers[0].chunk_index(k2) is not None  # kept beside the artifact, to seed fetches

    cluster = node(tmp_path, settings)
    assert file_digest(cluster.lookup(k1)) == file_digest(versions[0])
    cold = cluster.s3.last_transfer
    assert cold.reused == 0 and cold.bytes == versions[0].stat().st_size
    assert file_digest(cluster.lookup("demo:user")) == file_digest(versions[1])
    seeded = cluster.s3.last_transfer
    assert seeded.bytes <= second.bytes and seeded.reused_bytes > 0.9 * versions[1].stat().st_size
    assert os.listdir(tmp_path / "fsx" / "tmp") == []


def test_a_fetch_onto_the_previous_version_reads_the_fetched_file_once_and_its_reused_units_not_at_all(
        tmp_path, settings, monkeypatch, settled_clock):
    """An incremental child (the previous version's bytes at the same offsets but for a changed
    file) fetched onto a node holding that version: the check hashes the reused units from the
    previous version's pages, and nothing else of the fetch (staging, linking, keeping the index
    beside it) reads the file again."""
    from efabuild.host import blake3tree, fsutil
    from efabuild.store import transfer
    from efabuild.store.chunked import assembly
    from efabuild.store.tiers import fs

    rng = random.Random(9)
    body = rng.randbytes(6 * MiB)
    changed = bytearray(body)
    changed[3 * MiB:3 * MiB + 50 * KiB] = rng.randbytes(50 * KiB)
    v1, v2 = make_sqsh(tmp_path, body, "v1"), make_sqsh(tmp_path, bytes(changed), "v2")
    store = builder(tmp_path, settings)
    k1, k2 = publish(store, v1), publish(store, v2)
    cluster = node(tmp_path, settings)
    cluster.fetch(k1)  # the node holds the previous version, its index kept beside it
    reads: list[str] = []
    lent: list[int] = []

    def spied(module, name: str) -> None:  # noqa: ANN001
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, **k: reads.append(name) or real(*a, **k))

    for module, name in ((assembly, "_hashed"), (assembly, "wrong_chunks"), (transfer, "file_digest"),
                         (fs, "check_file"), (fsutil, "copy_file")):
        spied(module, name)
    real_tree = blake3tree.tree_with
    monkeypatch.setattr(blake3tree, "tree_with", lambda lib, fd, units: lent.append(len(units)) or
                        real_tree(lib, fd, units))
    fetched = cluster.fetch(k2)
    assert file_digest(fetched) == file_digest(v2) and reads == []
    assert lent and lent[0] * MiB >= 4 * MiB  # of 6 MiB: the units the change touches are the file's
    assert cluster.s3.last_transfer.reused_bytes > 0.9 * v2.stat().st_size


def test_a_damaged_chunk_index_or_chunk_is_refused_and_nothing_becomes_visible(tmp_path, settings, versions,
                                                                                 s3_client):
    key = publish(builder(tmp_path, settings), versions[0])
    tier = S3Tier(settings, **CHUNKED)
    index_object = tier.index_object(key)
    good = s3_client.get_object(Bucket=settings.bucket, Key=index_object)["Body"].read()
    # an index that describes other bytes than its record
    other = S3Tier(settings, **CHUNKED)
    other.publish(key_for("other"), versions[1], record_for(key_for("other"), "demo:other", versions[1]))
    s3_client.put_object(Bucket=settings.bucket, Key=index_object, Body=other.last_index.to_json())
    cluster = node(tmp_path, settings)
    with pytest.raises(EfabuildError, match="corrupt"):
        cluster.lookup(key)
    assert not cluster.fs_tiers[0].has(key)
    # junk in its place
    s3_client.put_object(Bucket=settings.bucket, Key=index_object, Body=b"[" * 5000)
    with pytest.raises(EfabuildError, match="not JSON"):
        cluster.lookup(key)
    # the right index, but one chunk's bytes replaced
    s3_client.put_object(Bucket=settings.bucket, Key=index_object, Body=good)
    from efabuild.chunks.cdc import ChunkIndex
    from efabuild.store.chunked.s3 import compress

    cid, length = ChunkIndex.from_json(good, "x").chunks[3]
    s3_client.put_object(Bucket=settings.bucket, Key=tier.chunks.object(cid), Body=compress(b"\0" * length))
    with pytest.raises(EfabuildError, match="corrupt"):
        cluster.lookup(key)
    assert not cluster.fs_tiers[0].has(key) and os.listdir(tmp_path / "fsx" / "tmp") == []


def test_an_interrupted_publish_leaves_only_unreferenced_chunks_and_the_retry_sends_none_again(
        tmp_path, settings, versions):
    key = key_for("killed-chunked")
    s3 = {"bucket": settings.bucket, "prefix": settings.prefix, "region": settings.region,
          "endpoint_url": settings.endpoint_url}
    plan = {"tiers": [["local", str(tmp_path / "cache")]], "key": key, "name": "demo:user",
            "sqsh": str(versions[0]), "pause": "s3-before-index", "s3": s3, "s3_options": CHUNKED}
    kill_publisher_at(plan, tmp_path / "plan.json")
    tier = S3Tier(settings, **CHUNKED)
    assert not tier.has(key) and tier.list() == []
    with pytest.raises(EfabuildError):
        node(tmp_path, settings).lookup(key)
    store = builder(tmp_path / "again", settings)
    store.publish(key, versions[0], record_for(key, "demo:user", versions[0]))
    assert store.s3.last_transfer.bytes == 0  # every chunk was already there
    assert file_digest(node(tmp_path / "n2", settings).lookup(key)) == file_digest(versions[0])


def test_gc_between_a_publishers_existence_check_and_its_index_write_loses_nothing(tmp_path, settings, versions):
    """The publisher finds every chunk present (an earlier artifact of the same bytes was deleted,
    its chunks are unreferenced and were marked long ago); gc sweeps them before its index lands."""
    chunk_store, marked = orphaned_chunks(tmp_path / "old", settings, versions[0])
    store = builder(tmp_path / "new", settings)
    reached, release = threading.Event(), threading.Event()
    real_put = store.s3._put_new

    def paused_put(path: str, body: bytes, **extra):  # noqa: ANN003, ANN202
        if path.endswith(".chunks.json") and not reached.is_set():
            reached.set()
            assert release.wait(60)
        return real_put(path, body, **extra)

    store.s3._put_new = paused_put
    key = key_for("after-gc")
    publisher = threading.Thread(target=store.publish, args=(key, versions[0], record_for(key, "demo:user", versions[0])))
    publisher.start()
    assert reached.wait(60)
    swept = collect(chunk_store, grace=3600, dry_run=False, now=time.time() + 7200)
    assert swept.deleted == marked  # gc saw no index using them: all gone
    release.set()
    publisher.join(60)
    assert not publisher.is_alive()
    assert store.s3.last_transfer.bytes == 0  # its existence check had found every chunk present
    index = store.s3.chunk_index(key)
    assert chunk_store.missing(index.unique()) == set()  # the publisher sent them back
    assert file_digest(node(tmp_path, settings).lookup(key)) == file_digest(versions[0])


def test_gc_that_listed_the_indexes_before_a_publishers_index_and_deletes_after_its_check_loses_nothing(
        tmp_path, settings, versions):
    """The gap a re-check alone leaves: gc lists the indexes, then a publisher checks its reused
    chunks, writes its index and checks them again (all still there), and only then does gc delete
    what its listing found unused. gc moves them aside, lists again and puts back the named ones."""
    chunk_store, _ = orphaned_chunks(tmp_path / "old", settings, versions[0])
    with gc_paused_after_its_listing(chunk_store) as result:
        store = builder(tmp_path / "new", settings)
        key = key_for("published-during-gc")
        store.publish(key, versions[0], record_for(key, "demo:user", versions[0]))
        assert store.s3.last_transfer.bytes == 0  # every chunk it needs was there, before and after its index
    assert result["gc"].deleted == 0  # all were put back
    index = store.s3.chunk_index(key)
    assert chunk_store.missing(index.unique()) == set()
    assert settings_objects(settings, "gc/trash/") == []
    assert file_digest(node(tmp_path, settings).lookup(key)) == file_digest(versions[0])


def test_a_gc_killed_with_chunks_in_its_trash_costs_no_fetch_and_the_next_gc_puts_them_back(
        tmp_path, settings, versions, monkeypatch):
    from efabuild.store.gc import chunks as chunksweep

    store = builder(tmp_path, settings)
    key = publish(store, versions[0])
    chunk_store = store.s3.chunks
    moved = sorted(store.s3.chunk_index(key).unique())[:3]
    for cid in moved:  # what a gc killed between moving chunks aside and listing again leaves
        assert chunksweep._move(store.s3, chunk_store.object(cid), chunksweep.trash_object(store.s3._path, cid))
    assert chunk_store.missing(moved) == set(moved)
    assert file_digest(node(tmp_path / "n1", settings).lookup(key)) == file_digest(versions[0])
    fresh = collect(chunk_store, grace=3600, dry_run=False)  # a trash this young may be a running gc's
    assert fresh.deleted == 0 and chunk_store.missing(moved) == set(moved)
    monkeypatch.setattr(chunksweep, "ABANDONED_AFTER_S", -60.0)  # the bucket's clock an hour on
    assert collect(chunk_store, grace=3600, dry_run=False).deleted == 0
    assert chunk_store.missing(moved) == set() and settings_objects(settings, "gc/trash/") == []
    assert file_digest(node(tmp_path / "n2", settings).lookup(key)) == file_digest(versions[0])


def test_one_gc_sweeps_a_bucket_at_a_time_and_a_killed_ones_lock_is_taken_over_once_stale(
        tmp_path, settings, versions, monkeypatch):
    """Two gcs sweeping at once could lose a chunk (one's delete landing after the other put it
    back): the second fails in one line and deletes nothing; a dry run still answers."""
    from efabuild.store.gc import lock as gclock

    chunk_store, _ = orphaned_chunks(tmp_path, settings, versions[0])
    with gc_paused_after_its_listing(chunk_store) as result:
        with pytest.raises(gclock.GcBusy, match=r"gc/lock: another gc of this bucket's chunks holds it since"):
            collect(chunk_store, grace=3600, dry_run=False, now=time.time() + 7200)
        assert collect(chunk_store, grace=3600, dry_run=True, now=time.time() + 7200).deleted > 0
    assert result["gc"].deleted > 0 and settings_objects(settings, "gc/lock") == []

    # a gc killed while holding the lock leaves it: refused while fresh, taken over once stale
    S3Tier(settings)._put_new(S3Tier(settings)._path("gc/lock"), b'{"pid": 1}')
    with pytest.raises(gclock.GcBusy):
        collect(chunk_store, grace=3600, dry_run=False)
    monkeypatch.setattr(gclock, "STALE_AFTER_S", -60.0)  # the bucket's clock a day on
    collect(chunk_store, grace=3600, dry_run=False)
    assert settings_objects(settings, "gc/lock") == []


def test_two_gcs_finding_the_same_stale_lock_take_it_one_at_most(settings, monkeypatch):
    """Slip: a stale lock is taken over without IfMatch on its version. Both gcs read the killed
    one's lock before either writes: only one overwrite of that version may succeed, or two sweeps
    run at once (the documented way to lose a chunk)."""
    from efabuild.store.gc import lock as gclock

    tier = S3Tier(settings)
    tier._put_new(tier._path(gclock.LOCK_OBJECT), b'{"pid": 1}')  # left by a killed gc
    time.sleep(5.5)
    monkeypatch.setattr(gclock, "STALE_AFTER_S", 4.0)  # that one is stale now, a lock just taken is not
    both_looked = threading.Barrier(2, timeout=20)
    looked: set[int] = set()
    real_head = S3Tier._head

    def head(self, path):  # noqa: ANN001, ANN202
        found = real_head(self, path)
        if path.endswith(gclock.LOCK_OBJECT) and threading.get_ident() not in looked:
            looked.add(threading.get_ident())
            both_looked.wait()
        return found

    monkeypatch.setattr(S3Tier, "_head", head)
    busy, entered = [], []

    def sweep() -> None:
        try:
            with gclock.sweeping_alone(S3Tier(settings)):
                entered.append(1)
                deadline = time.monotonic() + 20
                while len(entered) + len(busy) < 2 and time.monotonic() < deadline:
                    time.sleep(0.05)  # holds the lock until the other's attempt has ended
        except gclock.GcBusy as exc:
            busy.append(str(exc))

    sweeps = [threading.Thread(target=sweep) for _ in range(2)]
    for thread in sweeps:
        thread.start()
    for thread in sweeps:
        thread.join(30)
    assert (len(entered), len(busy)) == (1, 1), busy
    assert settings_objects(settings, "gc/lock") == []  # given up by its holder


def test_a_gc_whose_lock_was_taken_over_leaves_the_new_holders_lock(settings, monkeypatch):
    """Slip: the lock is released without checking its ETag is still its own. A gc that ran past
    STALE_AFTER_S lost its lock to another: deleting that one's lock lets a third gc sweep beside it."""
    from efabuild.store.gc import lock as gclock

    with gclock.sweeping_alone(S3Tier(settings)):
        monkeypatch.setattr(gclock, "STALE_AFTER_S", -60.0)  # the first one's lock looks a day old
        taken_over = gclock.sweeping_alone(S3Tier(settings))
        taken_over.__enter__()
        monkeypatch.setattr(gclock, "STALE_AFTER_S", 24 * 3600.0)
    try:
        assert settings_objects(settings, "gc/lock") != []
        with pytest.raises(gclock.GcBusy, match="holds it since"):
            with gclock.sweeping_alone(S3Tier(settings)):
                pass
    finally:
        taken_over.__exit__(None, None, None)
    assert settings_objects(settings, "gc/lock") == []


def test_a_sqsh_changed_after_the_export_cut_it_stores_no_chunk_under_a_wrong_name(tmp_path, settings, versions):
    """Slip: chunks are sent without checking the bytes read back against their ids. The export's
    index names each chunk by its bytes at the cut; a file changed after (a disk fault, a writer)
    would store new bytes under old names, and every artifact sharing one would fail to fetch."""
    import shutil

    from efabuild.chunks.cdc import chunk_file

    store = builder(tmp_path, settings)
    sqsh = tmp_path / "changed.sqsh"
    shutil.copy(versions[0], sqsh)
    key = key_for("changed after its cut")
    index = chunk_file(sqsh, chunking=CHUNKED["chunking"])
    record = record_for(key, "demo:changed", sqsh)
    with open(sqsh, "r+b") as handle:  # one byte in the middle, after the export's digest pass
        handle.seek(index.size // 2)
        byte = handle.read(1)
        handle.seek(index.size // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(EfabuildError, match="no longer hash"):
        store.publish(key, sqsh, record, b'{"m": 1}', index=index)
    chunks = store.s3.chunks
    stored = set(index.unique()) - chunks.missing(index.unique())
    assert stored  # the unchanged ones may have gone up: each holds the bytes its name says
    for cid in stored:
        chunks.fetch(cid, index.unique()[cid])
    assert store.s3.record(key) is None


def test_a_sqsh_cut_afresh_whose_digest_is_not_the_records_is_not_published(tmp_path, settings, versions):
    """Slip: publish does not compare a fresh cut's digest with the record. Without the export's
    index the S3 tier cuts the file itself: other bytes than the record's must not go up under it
    (every node would fetch them, then refuse them)."""
    import shutil

    store = builder(tmp_path, settings)
    sqsh = tmp_path / "changed.sqsh"
    shutil.copy(versions[0], sqsh)
    key = key_for("changed before its cut")
    record = record_for(key, "demo:changed", sqsh)
    with open(sqsh, "r+b") as handle:
        handle.seek(record.size // 2)
        byte = handle.read(1)
        handle.seek(record.size // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(EfabuildError, match=f"its record says {record.digest}; not published"):
        store.publish(key, sqsh, record, b'{"m": 1}')
    assert store.s3.record(key) is None
    assert settings_objects(settings, f"objects/{key[:2]}/{key}") == []  # no index either
class SkewedClock:
    """The `time` module as a gc host whose clock is `by` seconds off sees it."""

    def __init__(self, by: float) -> None:
        self.by = by

    def time(self) -> float:
        return time.time() + self.by

    def __getattr__(self, name: str):  # noqa: ANN204 - strftime, gmtime... as they are
        return getattr(time, name)


def skew_gc_hosts_clock(monkeypatch, by: float) -> None:  # noqa: ANN001
    """This process's gc, publish-leftover and trash code reads a clock `by` seconds off (the
    loopback S3 server, in this process too, keeps the true one)."""
    from datetime import datetime, timezone

    from efabuild.store.gc import chunks as chunksweep

    from efabuild.store.gc import lock as gclock

    from efabuild.store.tiers import s3

    from efabuild.store.chunked import s3 as s3chunks

    class SkewedDatetime(datetime):
        @classmethod
        def now(cls, tz=None):  # noqa: ANN001, ANN206
            return datetime.fromtimestamp(time.time() + by, tz or timezone.utc)

    for module in (gclock, s3chunks, chunksweep):
        monkeypatch.setattr(module, "time", SkewedClock(by), raising=False)
    monkeypatch.setattr(s3, "datetime", SkewedDatetime)


def test_a_gc_host_a_day_ahead_does_not_take_a_live_lock(tmp_path, settings, versions, monkeypatch):
    from efabuild.store.gc import lock as gclock

    chunk_store, _ = orphaned_chunks(tmp_path, settings, versions[0])
    S3Tier(settings)._put_new(S3Tier(settings)._path("gc/lock"), b'{"pid": 1}')  # another gc's, just taken
    skew_gc_hosts_clock(monkeypatch, 25 * 3600)
    with pytest.raises(gclock.GcBusy, match="another gc of this bucket's chunks holds it since"):
        collect(chunk_store, grace=3600, dry_run=False)
    assert settings_objects(settings, "gc/lock") == [S3Tier(settings)._path("gc/lock")]


def test_a_gc_host_a_day_behind_takes_over_a_stale_lock(tmp_path, settings, versions, monkeypatch):
    from efabuild.store.gc import lock as gclock

    chunk_store, _ = orphaned_chunks(tmp_path, settings, versions[0])
    S3Tier(settings)._put_new(S3Tier(settings)._path("gc/lock"), b'{"pid": 1}')  # a killed gc's
    monkeypatch.setattr(gclock, "STALE_AFTER_S", 2.0)  # instead of a day
    time.sleep(3)
    skew_gc_hosts_clock(monkeypatch, -25 * 3600)
    collect(chunk_store, grace=3600, dry_run=False)
    assert settings_objects(settings, "gc/lock") == []


def test_a_gc_host_an_hour_ahead_leaves_a_running_gcs_trash(tmp_path, settings, versions, monkeypatch):
    """Chunks another gc has just moved to its trash (it puts back those an index names): a gc
    whose clock is ahead must not take that trash for a killed gc's and empty it."""
    from efabuild.store.gc import chunks as chunksweep

    store = builder(tmp_path, settings)
    key = publish(store, versions[0])
    chunk_store = store.s3.chunks
    moved = sorted(store.s3.chunk_index(key).unique())[:3]
    for cid in moved:
        assert chunksweep._move(store.s3, chunk_store.object(cid), chunksweep.trash_object(store.s3._path, cid))
    skew_gc_hosts_clock(monkeypatch, 2 * 3600)
    collect(chunk_store, grace=3600, dry_run=False)
    assert sorted(path.rsplit("/", 1)[-1] for path in settings_objects(settings, "gc/trash/")) == moved


def test_gc_dates_its_marks_and_judges_leftovers_by_the_buckets_clock(tmp_path, settings, versions,
                                                                       monkeypatch, s3_client):
    """A gc host a day ahead: its mark is dated by S3's clock (compared with the chunks'
    LastModified), and the .sqsh a whole-object publish has just uploaded (its record comes next)
    is no leftover to delete. (moto dates every multipart upload 2010: those are not tried here.)"""
    import json

    chunk_store, _ = orphaned_chunks(tmp_path, settings, versions[1])
    tier = S3Tier(settings)
    s3_client.put_object(Bucket=settings.bucket, Key=tier.sqsh_object(key_for("live")), Body=b"uploading")
    skew_gc_hosts_clock(monkeypatch, 25 * 3600)
    assert find_debris(tier) == []
    before = time.time()
    collect(chunk_store, grace=3600, dry_run=False)
    newest = max(settings_objects(settings, "gc/marks/"))
    mark = json.loads(s3_client.get_object(Bucket=settings.bucket, Key=newest)["Body"].read())
    assert before - 2 <= mark["time"] <= time.time() + 1


def orphaned_chunks(base: Path, settings: S3Config, sqsh: Path) -> tuple[ChunkStore, int]:
    """A bucket holding `sqsh`'s chunks with the artifact that used them deleted, and how many of
    them a gc has just marked as unreferenced (a gc past the grace period sweeps them)."""
    store = builder(base, settings)
    store.s3.delete(publish(store, sqsh, "demo:old"))
    first = collect(store.s3.chunks, grace=3600, dry_run=False, now=time.time() + 1)
    assert first.marked > 0 and first.deleted == 0
    return store.s3.chunks, first.marked


@contextlib.contextmanager
def gc_paused_after_its_listing(chunk_store: ChunkStore) -> Iterator[dict]:
    """In the block, a sweeping gc two hours on (past the grace period) runs in a thread, paused
    just after its first listing of the indexes; on leaving, it goes on to its end, and the dict
    given holds its ChunkGc under "gc"."""
    listed, release = threading.Event(), threading.Event()
    real_referenced = chunk_store.referenced

    def paused():  # noqa: ANN202
        found = real_referenced()
        if not listed.is_set():
            listed.set()
            assert release.wait(60)
        return found

    chunk_store.referenced = paused
    result: dict = {}
    sweeper = threading.Thread(target=lambda: result.update(
        gc=collect(chunk_store, grace=3600, dry_run=False, now=time.time() + 7200)))
    sweeper.start()
    try:
        assert listed.wait(60)
        yield result
    finally:
        release.set()
        sweeper.join(60)
        chunk_store.referenced = real_referenced
    assert not sweeper.is_alive()


def settings_objects(settings: S3Config, under: str) -> list[str]:
    tier = S3Tier(settings)
    return [item["Key"] for item in tier._list(tier._path(under))]


def test_the_bucket_check_lists_many_chunks_and_heads_few_and_finds_exactly_the_missing(
        tmp_path, settings, versions, monkeypatch):
    store = builder(tmp_path, settings)
    key = publish(store, versions[0])
    present = set(store.s3.chunk_index(key).unique())
    absent = {random.Random(7).randbytes(32).hex()} | {os.urandom(32).hex() for _ in range(300)}
    chunk_store = store.s3.chunks
    requests = {"head": 0, "list": 0}
    for name, counter in (("_head", "head"), ("_list", "list")):
        real = getattr(store.s3, name)

        def counted(*args, _real=real, _counter=counter, **kwargs):  # noqa: ANN002, ANN003, ANN202
            requests[_counter] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(store.s3, name, counted)
    assert chunk_store.missing(present | absent) == absent
    assert requests["head"] == 0 and requests["list"] <= 16  # one listing per first hex digit
    few = set(sorted(present)[:2]) | set(sorted(absent)[:2])
    assert chunk_store.missing(few) == set(sorted(absent)[:2])
    assert requests["head"] == 4  # a handful of ids: one HEAD each, no listing
    gone = sorted(present)[len(present) // 2]
    chunk_store.delete_objects([chunk_store.object(gone)])  # as a gc would
    assert chunk_store.missing(present) == {gone}
    assert chunk_store.missing({gone}) == {gone}


def test_a_bucket_too_large_for_a_listing_of_the_ids_heads_the_rest_after_one_page(
        tmp_path, s3_bucket, fault_proxy, s3_client, monkeypatch):
    """A page that answers for fewer than LIST_FROM of the ids ends the listing (a 100k-chunk
    bucket took 7 pages a digit for ~25 ids): the rest is looked up with a HEAD each, and the
    answer is the same."""
    from efabuild.store.chunked import s3 as chunks_s3

    monkeypatch.setattr(chunks_s3, "LIST_PAGE", 20)  # S3's 1,000 keys a page, scaled to a test's bucket
    settings = S3Config(bucket=s3_bucket, prefix="images/", region="us-east-1", endpoint_url=fault_proxy.endpoint)
    chunk_store = S3Tier(settings).chunks
    rng = random.Random(5)
    ids = sorted("a" + rng.randbytes(32).hex()[1:] for _ in range(200))  # one first digit, as one group
    wanted, others = ids[::20], [cid for i, cid in enumerate(ids) if i % 20]
    present = set(wanted[::2])
    for cid in sorted(present) + others:
        s3_client.put_object(Bucket=s3_bucket, Key=chunk_store.object(cid), Body=b"x")
    before = len(fault_proxy.requests)
    assert chunk_store.missing(wanted) == set(wanted) - present
    asked = fault_proxy.requests[before:]
    lists = sum(1 for method, path, _ in asked if method == "GET" and "list-type=2" in path)
    heads = sum(1 for method, _, _ in asked if method == "HEAD")
    assert lists == 1 and lists + heads <= len(wanted)  # where listing the range took a page per 20 keys


def test_whole_object_artifacts_of_before_stay_readable(tmp_path, settings, versions):
    whole = builder(tmp_path / "old", settings, chunked=False)
    key = publish(whole, versions[2])
    assert S3Tier(settings).chunk_index(key) is None
    cluster = node(tmp_path, settings)
    assert file_digest(cluster.lookup(key)) == file_digest(versions[2])
    assert cluster.fs_tiers[0].chunk_index(key) is None


def test_du_reports_what_each_artifact_costs_and_the_dedup_ratio(tmp_path, settings, versions):
    import json

    from tests.kits.storekit import efabuild

    store = builder(tmp_path, settings)
    keys = [publish(store, sqsh) for sqsh in versions]
    result = efabuild("du", "--json", "--store", str(tmp_path / "cache"), check=True)
    report = json.loads(result.stdout)
    s3 = report["tiers"]["s3"]
    sizes = [sqsh.stat().st_size for sqsh in versions]
    assert s3["artifacts"] == 3 and s3["bytes"] == sum(sizes)
    assert s3["dedup_ratio"] > 2.5  # three versions stored about as one
    rows = {row["key"]: row for row in report["s3_artifacts"]}
    assert set(rows) == set(keys)
    for row in rows.values():
        assert row["unique"] < 0.2 * row["stored"]  # most of each version is shared with the others
    filesystem = [tier for name, tier in report["tiers"].items() if name != "s3"]
    assert filesystem == [{"artifacts": 3, "bytes": sum(sizes)}]  # --store opens that one tier
    text = efabuild("du", "--store", str(tmp_path / "cache"), check=True).stdout.splitlines()
    assert text[0].split() == ["KEY", "NAME", "SIZE", "S3", "STORED", "S3", "UNIQUE"]
    assert text[-1].startswith("s3: 3 artifacts") and "dedup" in text[-1]


def test_gc_of_an_artifact_marks_its_own_chunks_and_a_later_gc_sweeps_them(tmp_path, settings, versions):
    store = Store([FilesystemTier(tmp_path / "cache", "local")], settings, show_progress=False,
                  s3_options={**CHUNKED, "chunk_grace": 1.0}, keep=1)
    old = publish(store, versions[0])
    time.sleep(1.1)  # created times order the versions
    new = publish(store, versions[2])
    old_only = set(store.s3.chunk_index(old).unique()) - set(store.s3.chunk_index(new).unique())
    assert old_only
    dry = store.gc(dry_run=True)
    assert {r.record.key for r in dry.removals} == {old} and dry.chunks.deleted == 0
    first = store.gc(dry_run=False)
    assert {(r.tier, r.record.key) for r in first.removals} == {("local", old), ("s3", old)}
    assert first.chunks.deleted == 0 and first.chunks.marked == len(old_only)  # marked, kept a grace period
    assert store.s3.chunks.missing(old_only) == set()
    time.sleep(1.5)
    second = store.gc(dry_run=False)
    assert second.chunks.deleted == len(old_only)
    assert store.s3.chunks.missing(old_only) == old_only
    assert file_digest(node(tmp_path, settings).lookup(new)) == file_digest(versions[2])


def test_ls_shows_each_artifacts_stored_and_unique_s3_bytes(tmp_path, settings, versions):
    import json

    from efabuild.store.progress import human_bytes
    from tests.kits.storekit import efabuild

    store = builder(tmp_path, settings)
    keys = [publish(store, sqsh) for sqsh in versions]
    local_only = key_for("local-only")
    store.fs_tiers[0].publish(local_only, versions[0], record_for(local_only, "demo:local", versions[0]))
    where = ("--store", str(tmp_path / "cache"))
    listed = {item["key"]: item for item in json.loads(efabuild("ls", "--json", *where, check=True).stdout)["artifacts"]}
    du = {row["key"]: row for row in json.loads(efabuild("du", "--json", *where, check=True).stdout)["s3_artifacts"]}
    for key in keys:
        assert (listed[key]["s3_stored"], listed[key]["s3_unique"]) == (du[key]["stored"], du[key]["unique"])
        assert 0 <= listed[key]["s3_unique"] < listed[key]["s3_stored"]  # versions share most chunks
    assert (listed[local_only]["s3_stored"], listed[local_only]["s3_unique"]) == (None, None)
    no_s3 = json.loads(efabuild("ls", "--json", "--no-s3", *where, check=True).stdout)["artifacts"]
    assert {item["s3_stored"] for item in no_s3} == {None}
    lines = efabuild("ls", *where, check=True).stdout.splitlines()
    assert lines[0].split()[3:5] == ["S3", "STORED/UNIQUE"]
    row = next(line.split() for line in lines if line.startswith(keys[0][:12]))
    stored, unique = du[keys[0]]["stored"], du[keys[0]]["unique"]
    assert " ".join(row[4:7]) == f"{human_bytes(stored)}/{human_bytes(unique)}"
