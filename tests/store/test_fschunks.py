"""The chunks lazy mounts leave on a shared filesystem tier for other nodes: written whole and
atomically, read only as what their id says, never through a planted link, claimed so that
nodes starting together fetch a chunk once, and expired by gc."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import blake3
import pytest

from efabuild.store.chunked import fschunks
from efabuild.store.chunked.fschunks import NONE, OURS, THEIRS, FsChunks
from efabuild.store.gc.sweep import collect_garbage
from efabuild.store.tiers.fs import FilesystemTier

pytestmark = pytest.mark.timeout(60)


def _chunk(size: int = 50_000) -> tuple[str, bytes]:
    data = os.urandom(size)
    return blake3.blake3(data).hexdigest(), data


@pytest.fixture
def tier(tmp_path: Path) -> FilesystemTier:
    (tmp_path / "shared").mkdir()
    return FilesystemTier(tmp_path / "shared", "shared")


def test_a_chunk_put_is_read_back_whole_and_read_only(tier):
    cid, data = _chunk()
    chunks = FsChunks(tier)
    assert chunks.get(cid, len(data)) is None
    assert chunks.put(cid, data) is True
    path = tier.root / "chunks" / cid[:2] / cid
    assert path.read_bytes() == data and not path.stat().st_mode & 0o222
    assert chunks.get(cid, len(data)) == data
    assert FsChunks(tier).put(cid, data) is False  # another node's copy is there: kept, not replaced
    assert not list((tier.root / "tmp").iterdir())  # no temp file left


def test_a_file_at_an_id_with_other_bytes_is_a_miss(tier):
    cid, data = _chunk()
    FsChunks(tier).put(cid, data)
    path = tier.root / "chunks" / cid[:2] / cid
    path.chmod(0o644)
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert FsChunks(tier).get(cid, len(data)) is None
    path.write_bytes(data[:-1])  # truncated
    assert FsChunks(tier).get(cid, len(data)) is None


def test_a_planted_link_at_an_id_or_at_chunks_is_never_followed(tier, tmp_path):
    cid, data = _chunk()
    outside = tmp_path / "outside.bin"
    outside.write_bytes(data)  # even the right bytes are not read through a link
    (tier.root / "chunks" / cid[:2]).mkdir(parents=True)
    (tier.root / "chunks" / cid[:2] / cid).symlink_to(outside)
    chunks = FsChunks(tier)
    assert chunks.get(cid, len(data)) is None
    assert chunks.put(cid, data) is True  # the link is replaced whole, nothing written through it
    assert outside.read_bytes() == data and not (tier.root / "chunks" / cid[:2] / cid).is_symlink()
    assert chunks.get(cid, len(data)) == data
    other, other_data = _chunk()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tier.root / "chunks").rename(tmp_path / "moved")
    (tier.root / "chunks").symlink_to(elsewhere)
    fresh = FsChunks(tier)  # a mount started after the link was planted
    assert fresh.put(other, other_data) is False and not fresh.writable
    assert fresh.claim(other) == NONE
    assert not list(elsewhere.iterdir())


def test_a_fan_out_directory_planted_as_a_link_leaves_only_it_aside(tier, tmp_path):
    (blocked, blocked_data), (other, other_data) = _chunk(), _chunk()
    while other[:2] == blocked[:2]:
        other, other_data = _chunk()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tier.root / "chunks").mkdir()
    (tier.root / "chunks" / blocked[:2]).symlink_to(elsewhere)
    chunks = FsChunks(tier)
    assert chunks.put(blocked, blocked_data) is False and chunks.claim(blocked) == NONE
    assert chunks.put(other, other_data) is True and chunks.get(other, len(other_data)) == other_data
    assert chunks.writable and not list(elsewhere.iterdir())


def test_of_nodes_putting_one_chunk_at_once_one_adds_it(tier):
    cid, data = _chunk(2 << 20)
    stores = [FsChunks(tier) for _ in range(8)]
    barrier = threading.Barrier(len(stores))
    added = []

    def put(chunks: FsChunks) -> None:
        barrier.wait()
        added.append(chunks.put(cid, data))

    threads = [threading.Thread(target=put, args=(chunks,)) for chunks in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(added) == [False] * 7 + [True]
    assert FsChunks(tier).get(cid, len(data)) == data


def test_a_claim_makes_the_others_wait_for_the_chunk_and_a_stale_one_is_ignored(tier):
    cid, data = _chunk()
    first, second = FsChunks(tier), FsChunks(tier)
    assert first.claim(cid) == OURS
    assert second.claim(cid) == THEIRS
    threading.Timer(0.3, lambda: (first.put(cid, data), first.release(cid))).start()
    started = time.monotonic()
    assert second.wait(cid, len(data)) == data and time.monotonic() - started < 5
    other, other_data = _chunk()
    assert first.claim(other) == OURS
    first.release(other)  # the fetch failed: the waiter stops waiting and fetches itself
    assert second.wait(other, len(other_data)) is None
    claim = tier.root / "chunks" / other[:2] / f"{other}.claim"
    claim.touch()
    old = time.time() - fschunks.CLAIM_STALE - 5
    os.utime(claim, (old, old))  # a node killed while fetching
    assert FsChunks(tier).claim(other) == NONE


def test_a_claim_is_kept_alive_while_its_fetch_runs_and_a_dead_one_is_waited_on_briefly(tier, monkeypatch):
    monkeypatch.setattr(fschunks, "CLAIM_BEAT", 0.05)
    monkeypatch.setattr(fschunks, "CLAIM_FRESH", 0.5)
    cid, data = _chunk()
    slow, waiter = FsChunks(tier), FsChunks(tier)
    assert slow.claim(cid) == OURS
    # a fetch that takes four times CLAIM_FRESH: its heartbeat keeps the waiter waiting for it
    threading.Timer(2.0, lambda: (slow.put(cid, data), slow.release(cid))).start()
    assert waiter.claim(cid) == THEIRS and waiter.wait(cid, len(data)) == data and waiter.patient
    dead, _ = _chunk()
    claim = tier.root / "chunks" / dead[:2] / f"{dead}.claim"
    claim.parent.mkdir(exist_ok=True)
    claim.touch()  # made by a node killed since: never touched again
    assert waiter.claim(dead) == THEIRS and waiter.wait(dead, 1000) is None and not waiter.patient


def test_release_removes_only_this_node_s_claim(tier):
    cid, _ = _chunk()
    first, second = FsChunks(tier), FsChunks(tier)
    assert first.claim(cid) == OURS
    claim = tier.root / "chunks" / cid[:2] / f"{cid}.claim"
    claim.unlink()  # gc took it for a dead node's, and another node claimed the chunk since
    assert second.claim(cid) == OURS
    first.release(cid)
    assert claim.exists()
    second.release(cid)
    assert not claim.exists()
    held = [_chunk()[0] for _ in range(3)]
    assert all(first.claim(c) == OURS for c in held)
    first.release_all()  # an unmount while its prefetch fetched
    assert not any((tier.root / "chunks" / c[:2] / f"{c}.claim").exists() for c in held)


def test_a_wrong_file_at_an_id_is_replaced_by_the_next_verified_copy(tier):
    cid, data = _chunk()
    (tier.root / "chunks" / cid[:2]).mkdir(parents=True)
    (tier.root / "chunks" / cid[:2] / cid).write_bytes(os.urandom(len(data)))
    chunks = FsChunks(tier)
    assert chunks.get(cid, len(data)) is None
    assert chunks.put(cid, data) is True and chunks.get(cid, len(data)) == data


def test_gc_removes_chunks_unread_for_a_week_and_stale_claims_only(tier, tmp_path):
    (young, young_data), (old, old_data) = _chunk(), _chunk()
    chunks = FsChunks(tier)
    chunks.put(young, young_data)
    chunks.put(old, old_data)
    week_ago = time.time() - fschunks.EXPIRE_SECONDS - 60
    old_path = tier.root / "chunks" / old[:2] / old
    os.utime(old_path, (week_ago, week_ago))
    live_claim, dead_claim = _chunk()[0], _chunk()[0]
    assert chunks.claim(live_claim) == OURS
    dead = tier.root / "chunks" / dead_claim[:2] / f"{dead_claim}.claim"
    dead.parent.mkdir(exist_ok=True)
    dead.touch()  # a claim of a node killed a week ago
    os.utime(dead, (week_ago, week_ago))
    target = tmp_path / "keep-me"
    target.write_text("not the store's")
    planted = tier.root / "chunks" / old[:2] / (old[:2] + "f" * 62)
    planted.symlink_to(target)
    report = collect_garbage([tier], 1, (), dry_run=False, delete_remote=False, chunk_grace=0)
    assert sorted(item for _, item in report.expired_chunks) == sorted([str(old_path), str(dead)])
    assert report.expired_removed == 2 and report.debris == ()
    assert not old_path.exists() and not dead.exists()
    assert chunks.get(young, len(young_data)) == young_data
    assert (tier.root / "chunks" / live_claim[:2] / f"{live_claim}.claim").exists()
    assert planted.is_symlink() and target.read_text() == "not the store's"


def test_claims_planted_at_every_id_cost_a_mount_one_wait(tier, monkeypatch):
    """A co-tenant who creates a claim for every chunk (and never writes one) must not make each
    chunk a wait: the first wait that runs out ends waiting on claims for that mount."""
    monkeypatch.setattr(fschunks, "CLAIM_WAIT", 0.2)
    planter, chunks = FsChunks(tier), FsChunks(tier)
    ids = [_chunk(1000)[0] for _ in range(20)]
    assert all(planter.claim(cid) == OURS for cid in ids)
    waited = 0
    for cid in ids:
        if chunks.claim(cid) == THEIRS:
            waited += 1
            assert chunks.wait(cid, 1000) is None
    assert waited == 1 and not chunks.patient


def _index_of(*chunks: tuple[str, bytes]):  # noqa: ANN202 - a ChunkIndex
    from efabuild.chunks.cdc import ChunkIndex

    whole = b"".join(data for _, data in chunks)
    return ChunkIndex(len(whole), "blake3:" + blake3.blake3(whole).hexdigest(),
                      tuple((cid, len(data)) for cid, data in chunks), (64, 50_000, 1 << 20))


def test_a_start_list_is_kept_once_and_read_back_only_for_its_artifact(tier):
    from efabuild.chunks import startlist

    key, (a, b, c) = "ab" * 32, (_chunk(), _chunk(), _chunk())
    index = _index_of(a, b, c)
    chunks = FsChunks(tier)
    assert chunks.get_list(key) is None
    assert chunks.put_list(key, startlist.encode(key, [c[0], a[0]]), index) is True
    assert startlist.decode(chunks.get_list(key), key, index) == [c[0], a[0]]
    # the first node's list stands: a second start's is not written over it
    assert chunks.put_list(key, startlist.encode(key, [b[0]]), index) is False
    assert startlist.decode(chunks.get_list(key), key, index) == [c[0], a[0]]
    # the list is an order of the index's own chunks, nothing more: foreign ids and repeats are dropped
    forged = startlist.encode(key, [_chunk()[0], c[0], c[0], "../" * 21 + "x", b[0]])
    assert startlist.decode(forged, key, index) == [c[0], b[0]]
    with pytest.raises(startlist.BadStartList):
        startlist.decode(startlist.encode("cd" * 32, [a[0]]), key, index)  # another artifact's
    with pytest.raises(startlist.BadStartList):
        startlist.decode(b"[" * 100_000, key, index)


def test_a_planted_start_list_is_never_followed_and_gives_way_to_a_real_one(tier, tmp_path):
    from efabuild.chunks import startlist

    key, a = "cd" * 32, _chunk()
    index = _index_of(a)
    target = tmp_path / "not-the-store"
    target.write_text("theirs")
    where = tier.root / "chunks" / key[:2]
    where.mkdir(parents=True)
    (where / f"{key}.start").symlink_to(target)
    chunks = FsChunks(tier)
    assert chunks.get_list(key) is None  # the link is not read through
    assert chunks.put_list(key, startlist.encode(key, [a[0]]), index) is True  # and is replaced, not written through
    assert target.read_text() == "theirs" and not (where / f"{key}.start").is_symlink()
    (where / f"{key}.start").chmod(0o644)
    (where / f"{key}.start").write_text("junk")
    assert chunks.put_list(key, startlist.encode(key, [a[0]]), index) is True  # junk gives way too
    assert startlist.decode(chunks.get_list(key), key, index) == [a[0]]


def test_gc_removes_a_start_list_a_week_after_it_was_written(tier):
    from efabuild.chunks import startlist

    key, a = "ef" * 32, _chunk()
    chunks = FsChunks(tier)
    chunks.put_list(key, startlist.encode(key, [a[0]]), _index_of(a))
    kept = tier.root / "chunks" / key[:2] / f"{key}.start"
    week_ago = time.time() - fschunks.EXPIRE_SECONDS - 60
    os.utime(kept, (time.time(), week_ago))  # read by every mount since: written a week ago all the same
    report = collect_garbage([tier], 1, (), dry_run=False, delete_remote=False, chunk_grace=0)
    assert [item for _, item in report.expired_chunks] == [str(kept)] and not kept.exists()
