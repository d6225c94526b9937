"""Publishing to the chunked S3 tier from an index: the export's is used as it is (the file is
not cut again), one kept in a store only once the file's bytes are its chunks, and the chunks
the bucket holds are checked twice: before anything is sent and just after the index is written."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path
import pytest

from efabuild.settings import S3Config
from efabuild.store.chunked import publish as chunkpublish
from efabuild.chunks.cdc import chunk_file
from efabuild.host.digest import file_digest
from efabuild.store.tiers.fs import FilesystemTier
from efabuild.store.chunked.s3 import ChunkStore
from efabuild.store.tiered import Store
from tests.kits.storekit import collect_warnings, key_for, make_sqsh, record_for

pytestmark = pytest.mark.s3
KiB, MiB = 1024, 1024 * 1024
CHUNKING = (8 * KiB, 32 * KiB, 128 * KiB)  # small chunks: a few MiB make many of them


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> tuple[Path, Path]:
    """Two versions of an image: v2 changes 4 KiB in the middle."""
    rng = random.Random(12)
    body = bytearray(rng.randbytes(3 * MiB))
    base = tmp_path_factory.mktemp("versions")
    one = make_sqsh(base, bytes(body), "v1")
    body[MiB:MiB + 4 * KiB] = rng.randbytes(4 * KiB)
    return one, make_sqsh(base, bytes(body), "v2")


def store_at(root: Path, settings: S3Config, name: str = "local") -> Store:
    return Store([FilesystemTier(root, name)], settings, show_progress=False, s3_options={"chunking": CHUNKING})


def watch(monkeypatch, store: Store, events: list[str]) -> None:  # noqa: ANN001
    """Note in `events` each existence check of chunks (how many ids) and each index written."""
    real_etags, real_put = ChunkStore.etags, store.s3._put_new

    def etags(self, ids):  # noqa: ANN001, ANN202 - `missing` asks it too
        ids = set(ids)
        events.append(f"check {len(ids)}")
        return real_etags(self, ids)

    def put(path: str, body: bytes, **extra):  # noqa: ANN003, ANN202
        if path.endswith(".chunks.json"):
            events.append("index")
        return real_put(path, body, **extra)

    monkeypatch.setattr(ChunkStore, "etags", etags)
    monkeypatch.setattr(store.s3, "_put_new", put)


def test_the_exports_index_is_used_and_reused_chunks_are_checked_once_before_and_once_after_the_index(
        tmp_path, settings, versions, monkeypatch):
    one, two = versions
    store = store_at(tmp_path / "cache", settings)
    k1, k2 = key_for("v1"), key_for("v2")
    store.publish(k1, one, record_for(k1, "demo:user", one), index=chunk_file(one, chunking=CHUNKING))
    exported = chunk_file(two, chunking=CHUNKING)  # what the export's digest pass made
    cuts, events = [], []
    monkeypatch.setattr(chunkpublish, "chunk_file", lambda *a, **k: cuts.append(a) or chunk_file(*a, **k))
    watch(monkeypatch, store, events)
    store.publish(k2, two, record_for(k2, "demo:user", two), index=exported)

    assert cuts == []  # the file was not cut again
    sent = store.s3.last_transfer
    assert sent.bytes < 0.1 * two.stat().st_size and sent.reused > 0
    reused = len(exported.unique()) - sent.chunks
    # the chunks v1 had are checked before sending, and again right after the index is written
    assert events == [f"check {reused}", "index", f"check {reused}"]
    assert store.s3.chunk_index(k2) == exported
    assert store.fs_tiers[0].chunk_index(k2) == exported  # kept beside the local copy, to seed fetches
    node = store_at(tmp_path / "node", settings, "shared")
    assert file_digest(node.lookup(k2)) == file_digest(two)


def test_an_index_planted_beside_a_stored_copy_is_checked_against_the_bytes_and_ignored(
        tmp_path, settings, versions, monkeypatch):
    """v1 is in the bucket and on the shared tier; v2's kept index has v2's size and digest (both in
    its record) but lists two of the chunks it shares with v1 in the wrong order. Those chunks
    are in the bucket, so a publish that trusted it would send neither and commit an artifact no
    fetch can assemble."""
    one, two = versions
    k1, k2 = key_for("seed"), key_for("planted")
    shared = FilesystemTier(tmp_path / "fsx", "shared")
    store = Store([shared], settings, show_progress=False, s3_options={"chunking": CHUNKING})
    store.publish(k1, one, record_for(k1, "demo:user", one), index=chunk_file(one, chunking=CHUNKING))
    Store([shared], None, show_progress=False).publish(k2, two, record_for(k2, "demo:user", two))
    true = chunk_file(two, chunking=CHUNKING)
    shared_ids = set(chunk_file(one, chunking=CHUNKING).unique())
    first, second = next((i, j) for i, (a, _) in enumerate(true.chunks) for j, (b, _) in enumerate(true.chunks)
                         if i < j and a != b and {a, b} <= shared_ids)
    order = list(true.chunks)
    order[first], order[second] = order[second], order[first]
    planted = true._replace(chunks=tuple(order))
    (shared.root / "objects" / k2[:2] / f"{k2}.chunks.json").write_bytes(planted.to_json())
    said = collect_warnings(monkeypatch)

    assert store.complete(k2) == {"shared": "reused", "s3": "published"}
    assert any("ignoring the chunk index kept with" in line and "does not hash" in line for line in said)
    assert store.s3.chunk_index(k2) == true
    assert shared.chunk_index(k2) == true  # the checked index replaced the planted one
    node = store_at(tmp_path / "node", settings, "shared")
    assert file_digest(node.lookup(k2)) == file_digest(two)


def test_an_index_of_other_bytes_is_ignored_and_the_file_cut_again(tmp_path, settings, versions, monkeypatch):
    one, two = versions
    key = key_for("other-bytes")
    shared = FilesystemTier(tmp_path / "fsx", "shared")
    Store([shared], None, show_progress=False).publish(key, one, record_for(key, "demo:user", one))
    (shared.root / "objects" / key[:2] / f"{key}.chunks.json").write_bytes(chunk_file(two, chunking=CHUNKING).to_json())
    cuts: list = []
    monkeypatch.setattr(chunkpublish, "chunk_file", lambda *a, **k: cuts.append(a) or chunk_file(*a, **k))
    store = Store([shared], settings, show_progress=False, s3_options={"chunking": CHUNKING})
    store.complete(key)
    assert len(cuts) == 1
    assert store.s3.chunk_index(key) == chunk_file(one, chunking=CHUNKING)


def test_a_kept_index_that_matches_the_bytes_spares_the_cut(tmp_path, settings, versions, monkeypatch):
    one, _ = versions
    key = key_for("kept")
    shared = FilesystemTier(tmp_path / "fsx", "shared")
    Store([shared], None, show_progress=False).publish(key, one, record_for(key, "demo:user", one),
                                                       index=chunk_file(one, chunking=CHUNKING))
    cuts: list = []
    monkeypatch.setattr(chunkpublish, "chunk_file", lambda *a, **k: cuts.append(a) or chunk_file(*a, **k))
    store = Store([shared], settings, show_progress=False, s3_options={"chunking": CHUNKING})
    store.complete(key)
    assert cuts == [] and store.s3.last_transfer.bytes == one.stat().st_size
    assert file_digest(store_at(tmp_path / "node", settings, "shared").lookup(key)) == file_digest(one)


def lookups(requests: list) -> int:  # (method, path, range start), as the proxy notes them
    """Requests that ask whether chunks are there: a HEAD of one, or a LIST of a range of them."""
    return sum(1 for method, path, _ in requests if (method == "HEAD" and "/chunks/" in path)
               or (method == "GET" and "list-type=2" in path and "chunks" in path))


def chunk_puts(requests: list) -> int:
    return sum(1 for method, path, _ in requests if method == "PUT" and "/chunks/" in path)


def proxied(s3_bucket: str, fault_proxy) -> S3Config:  # noqa: ANN001
    return S3Config(bucket=s3_bucket, prefix="images/", region="us-east-1", endpoint_url=fault_proxy.endpoint)


def test_a_publish_looks_its_reused_chunks_up_twice_and_notes_the_etags_those_looks_and_its_puts_gave(
        tmp_path, s3_bucket, versions, fault_proxy, s3_client):
    """Before sending and after the index: no third look for the ETags the index notes, which are
    still each chunk object's own."""
    one, two = versions
    store = store_at(tmp_path / "cache", proxied(s3_bucket, fault_proxy))
    k1, k2 = key_for("etags-v1"), key_for("etags-v2")
    store.publish(k1, one, record_for(k1, "demo:user", one), index=chunk_file(one, chunking=CHUNKING))
    exported = chunk_file(two, chunking=CHUNKING)
    reused = set(exported.unique()) & set(chunk_file(one, chunking=CHUNKING).unique())
    before = len(fault_proxy.requests)
    assert store.s3.chunks.missing(reused) == set()
    one_look = lookups(fault_proxy.requests[before:])
    before = len(fault_proxy.requests)
    store.publish(k2, two, record_for(k2, "demo:user", two), index=exported)
    during = fault_proxy.requests[before:]
    assert lookups(during) == 2 * one_look
    assert chunk_puts(during) == store.s3.last_transfer.chunks == len(set(exported.unique()) - reused)
    noted = json.loads(s3_client.get_object(Bucket=s3_bucket, Key=store.s3.index_object(k2))["Body"].read())["etags"]
    assert noted == {cid: s3_client.head_object(Bucket=s3_bucket, Key=store.s3.chunks.object(cid))["ETag"].strip('"')
                     for cid in exported.unique()}


def test_chunks_sent_ahead_of_the_publish_are_neither_looked_up_nor_sent_again(
        tmp_path, s3_bucket, versions, fault_proxy):
    one, two = versions
    settings = proxied(s3_bucket, fault_proxy)
    store = store_at(tmp_path / "cache", settings)
    k1, k2 = key_for("ahead-v1"), key_for("ahead-v2")
    store.publish(k1, one, record_for(k1, "demo:user", one), index=chunk_file(one, chunking=CHUNKING))
    exported = chunk_file(two, chunking=CHUNKING)
    new = set(exported.unique()) - set(chunk_file(one, chunking=CHUNKING).unique())
    before = len(fault_proxy.requests)
    started = store.send_ahead("demo:user", two, exported)
    ahead = started.result(60).sent
    assert ahead.created == new and chunk_puts(fault_proxy.requests[before:]) == len(new)
    one_look = lookups(fault_proxy.requests[before:])
    assert store.send_ahead("demo:user", two, exported) is started  # once: a second call sends nothing
    before = len(fault_proxy.requests)
    store.publish(k2, two, record_for(k2, "demo:user", two), index=exported)
    during = fault_proxy.requests[before:]
    assert chunk_puts(during) == 0 and lookups(during) == one_look  # only the check after the index
    assert store.s3.last_transfer.created == new
    assert file_digest(store_at(tmp_path / "node", settings, "shared").lookup(k2)) == file_digest(two)


def test_a_publish_started_while_the_send_ahead_runs_waits_for_it_and_sends_nothing_twice(
        tmp_path, settings, versions):
    one, two = versions
    store = store_at(tmp_path / "cache", settings)
    k1, k2 = key_for("waits-v1"), key_for("waits-v2")
    store.publish(k1, one, record_for(k1, "demo:user", one), index=chunk_file(one, chunking=CHUNKING))
    exported = chunk_file(two, chunking=CHUNKING)
    new = set(exported.unique()) - set(chunk_file(one, chunking=CHUNKING).unique())
    release, puts = threading.Event(), []
    real_create = store.s3._create

    def held_create(path: str, body: bytes, **extra):  # noqa: ANN003, ANN202
        if "/chunks/" in path:
            puts.append(path)
            assert release.wait(60)
        return real_create(path, body, **extra)

    store.s3._create = held_create
    started = store.send_ahead("demo:user", two, exported)
    publisher = threading.Thread(target=store.publish, args=(k2, two, record_for(k2, "demo:user", two)),
                                 kwargs={"index": exported})
    publisher.start()
    publisher.join(1)
    assert publisher.is_alive() and not started.done()  # waiting for the sends ahead
    release.set()
    publisher.join(60)
    assert not publisher.is_alive()
    assert len(puts) == len(new) and store.s3.last_transfer.created == new
    assert file_digest(store_at(tmp_path / "node", settings, "shared").lookup(k2)) == file_digest(two)


def test_a_chunk_swept_between_the_send_ahead_and_the_index_is_sent_again(tmp_path, settings, versions, s3_client):
    one, two = versions
    store = store_at(tmp_path / "cache", settings)
    k1, k2 = key_for("swept-v1"), key_for("swept-v2")
    store.publish(k1, one, record_for(k1, "demo:user", one), index=chunk_file(one, chunking=CHUNKING))
    exported = chunk_file(two, chunking=CHUNKING)
    store.send_ahead("demo:user", two, exported).result(60)
    victim = sorted(set(exported.unique()) & set(chunk_file(one, chunking=CHUNKING).unique()))[0]  # found there
    s3_client.delete_object(Bucket=settings.bucket, Key=store.s3.chunks.object(victim))  # as gc's sweep would
    store.publish(k2, two, record_for(k2, "demo:user", two), index=exported)
    assert store.s3.chunks.missing(exported.unique()) == set()
    assert file_digest(store_at(tmp_path / "node", settings, "shared").lookup(k2)) == file_digest(two)


def test_a_chunk_planted_before_the_send_ahead_is_replaced_by_the_publish(tmp_path, settings, versions, s3_client,
                                                                          monkeypatch):
    from efabuild.store.chunked.s3 import compress

    one, two = versions
    store = store_at(tmp_path / "cache", settings)
    k1, k2 = key_for("planted-v1"), key_for("planted-v2")
    store.publish(k1, one, record_for(k1, "demo:user", one), index=chunk_file(one, chunking=CHUNKING))
    exported = chunk_file(two, chunking=CHUNKING)
    planted = sorted(set(exported.unique()) - set(chunk_file(one, chunking=CHUNKING).unique()))[0]
    s3_client.put_object(Bucket=settings.bucket, Key=store.s3.chunks.object(planted), Body=compress(b"\0" * 4096))
    assert planted not in store.send_ahead("demo:user", two, exported).result(60).sent.created  # its PUT was refused
    said = collect_warnings(monkeypatch)
    store.publish(k2, two, record_for(k2, "demo:user", two), index=exported)
    assert any(line.endswith("; storing it again") and planted in line for line in said), said
    assert store.s3.chunks.problem(planted, exported.unique()[planted]) is None
    assert file_digest(store_at(tmp_path / "node", settings, "shared").lookup(k2)) == file_digest(two)


def test_the_manifest_and_statement_are_written_while_the_chunks_are_checked_again_and_the_record_last(
        tmp_path, settings, versions, monkeypatch):
    """The second look at the reused chunks (after the index) and the PUTs of the objects beside
    the artifact overlap; the record, which commits them all, comes after both."""
    one, two = versions
    store = store_at(tmp_path / "cache", settings)
    k1, k2 = key_for("beside-v1"), key_for("beside-v2")
    store.publish(k1, one, record_for(k1, "demo:user", one), index=chunk_file(one, chunking=CHUNKING))
    exported = chunk_file(two, chunking=CHUNKING)
    real_etags, real_put = ChunkStore.etags, store.s3._put_new
    manifest_written, events = threading.Event(), []

    def etags(self, ids):  # noqa: ANN001, ANN202
        if "index" in events:  # the second look: it waits (up to 10 s) for the manifest's PUT
            events.append(f"second look saw the manifest: {manifest_written.wait(10)}")
        return real_etags(self, ids)

    def put(path: str, body: bytes, **extra):  # noqa: ANN003, ANN202
        created = real_put(path, body, **extra)
        names = {store.s3.index_object(k2): "index", store.s3.manifest_object(k2): "manifest",
                 store.s3.envelope_object(k2): "statement", store.s3.record_object(k2): "record"}
        events.append(names.get(path, path))
        if path == store.s3.manifest_object(k2):
            manifest_written.set()
        return created

    monkeypatch.setattr(ChunkStore, "etags", etags)
    monkeypatch.setattr(store.s3, "_put_new", put)
    store.publish(k2, two, record_for(k2, "demo:user", two), b'{"manifest": 1}', envelope=b'{"payload": ""}\n',
                  index=exported)
    assert "second look saw the manifest: True" in events, events
    assert events.index("index") < events.index("second look saw the manifest: True")
    assert events.index("record") > max(events.index(name) for name in ("index", "manifest", "statement")), events
    assert store_at(tmp_path / "node", settings, "shared").lookup(k2).read_bytes() == two.read_bytes()
