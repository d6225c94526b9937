"""Chunk indexes and the S3 chunk store: dedup, indexes kept beside artifacts, gc of shared chunks."""

from __future__ import annotations

import json
import os
import pytest

from efabuild.host.digest import file_digest
from efabuild.settings import S3Config
from efabuild.chunks.cdc import BadChunkIndex, ChunkIndex, chunk_file, mismatch
from efabuild.store.tiers.s3 import S3Tier
from efabuild.store.chunked.publish import upload
from efabuild.store.chunked.assembly import assemble
from efabuild.store.chunked.s3 import ChunkStore
from tests.kits.storekit import shifted_versions
from efabuild.store.chunked import seeds

KiB, MiB = 1024, 1024 * 1024
SMALL = (4 * KiB, 16 * KiB, 64 * KiB)  # small chunks, so a few MiB make many of them


def test_index_covers_the_file_and_digests_it_whole(tmp_path):
    one, _ = shifted_versions(tmp_path)
    index = chunk_file(one, chunking=SMALL)
    assert index.size == one.stat().st_size and index.digest == file_digest(one)
    assert sum(length for _, length in index.chunks) == index.size
    assert all(SMALL[0] <= length <= SMALL[2] for _, length in index.chunks[:-1])
    assert ChunkIndex.from_json(index.to_json(), "x") == index


@pytest.mark.parametrize("seed", range(4))
def test_a_file_others_can_write_is_cut_from_reads_into_the_chunks_a_mapping_gives(tmp_path, monkeypatch, seed):
    """Read in windows (small here, so that many chunks straddle one), never mapped: the index is
    the one the whole mapped file gives, at any size and chunking."""
    import random

    from efabuild.chunks import cdc as chunks

    rng = random.Random(seed)
    path = tmp_path / "shared.sqsh"
    path.write_bytes(rng.randbytes(rng.randrange(1, 3 << 20)))
    chunking = rng.choice([SMALL, (64, 256, 1024), (16 * KiB, 64 * KiB, 256 * KiB)])
    mapped = chunk_file(path, chunking=chunking)
    path.chmod(0o666)
    monkeypatch.setattr(chunks, "_WINDOW", rng.choice([1, 100_000, 1 << 20]))
    monkeypatch.setattr(chunks, "_mapped_cuts", None)  # it would fail if it were used
    assert chunk_file(path, chunking=chunking) == mapped


def test_a_file_others_can_write_truncated_while_it_is_cut_is_one_line_not_sigbus(tmp_path):
    """Its owner shortening it mid-cut: a mapping's reader would die of SIGBUS (a publish, as root)."""
    from efabuild.chunks.cdc import ShortRead

    path = tmp_path / "shared.sqsh"
    path.write_bytes(os.urandom(200 << 20))
    path.chmod(0o666)

    def shorten(cid, data):  # noqa: ANN001
        os.truncate(path, 4096)

    with pytest.raises(ShortRead, match="shared.sqsh: ended at byte .* while it was cut into chunks"):
        chunk_file(path, chunking=SMALL, on_chunk=shorten)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("left", [1, 1000, 40 * KiB])  # fewer bytes past the last cut than a chunk's maximum
def test_a_file_others_can_write_shortened_past_the_next_cut_is_one_line_not_a_hang(tmp_path, monkeypatch, left):
    """Its owner truncating it to a length the cutter has not reached yet: each read then returns
    the bytes up to the new end, fewer than a whole chunk's worth, and must not be asked again."""
    from efabuild.chunks import cdc as chunks
    from efabuild.chunks.cdc import ShortRead

    path = tmp_path / "shared.sqsh"
    path.write_bytes(os.urandom(3 << 20))
    path.chmod(0o666)
    monkeypatch.setattr(chunks, "_WINDOW", 256 * KiB)
    first = chunk_file(path, chunking=SMALL).chunks[0][1]

    def shorten(cid, data):  # noqa: ANN001
        if os.stat(path).st_size == 3 << 20:
            os.truncate(path, first + 300 * KiB + left)

    with pytest.raises(ShortRead, match="shared.sqsh: ended at byte .* while it was cut into chunks"):
        chunk_file(path, chunking=SMALL, on_chunk=shorten)


def test_a_shifted_version_shares_almost_all_chunks(tmp_path):
    one, two = shifted_versions(tmp_path)
    a, b = chunk_file(one, chunking=SMALL), chunk_file(two, chunking=SMALL)
    new = sum(length for cid, length in b.unique().items() if cid not in a.unique())
    assert new < 0.1 * b.size  # fixed-size blocks would share nothing after the insertion


@pytest.mark.parametrize("whose", ["this user's", "writable by others"])  # mapped; read (a truncation is no SIGBUS)
def test_an_index_is_checked_against_the_bytes_it_claims_to_describe(tmp_path, whose):
    one, two = shifted_versions(tmp_path)
    if whose == "writable by others":
        one.chmod(0o666)
    index = chunk_file(one, chunking=SMALL)
    assert mismatch(index, one) is None
    swapped = list(index.chunks)
    swapped[1], swapped[2] = swapped[2], swapped[1]  # same size, same digest field, other order
    assert mismatch(index._replace(chunks=tuple(swapped)), one) == (
        f"chunk 1 (at byte {index.chunks[0][1]}) does not hash to {swapped[1][0][:12]}")
    assert mismatch(index, two) == f"it describes {index.size} bytes, the file has {two.stat().st_size}"
    claims = "blake3:" + "0" * 64  # right chunks, but a digest (copied from some record) they do not make
    assert mismatch(index._replace(digest=claims), one) == f"its chunks make {index.digest}, it claims {claims}"
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert mismatch(chunk_file(empty, chunking=SMALL), empty) is None


@pytest.mark.parametrize("doc, problem", [
    ({"format": "other"}, "not a efabuild.chunks/v1"),
    ({"size": -1}, "bad size"),
    ({"digest": "md5:00"}, "bad size, digest"),
    ({"chunks": [["zz", 1]]}, "is not [id, length]"),
    ({"chunks": [["a" * 64, 0]]}, "is not [id, length]"),
    ({"chunks": [["a" * 64, True]]}, "is not [id, length]"),
    ({"size": 5}, "add up to 3 bytes, the index says 5"),
    ({"chunking": {"min": 1, "avg": 2, "max": 4}}, "bad chunking"),  # FastCDC's minimum is 64
    ({"chunking": {"min": 128, "avg": 64, "max": 256}}, "bad chunking"),
    ({"chunking": {"min": 64, "avg": 128, "max": 128 << 20}}, "bad chunking"),  # over 64 MiB
    ({"chunking": [64, 128, 256]}, "bad chunking"),
    # no chunk longer than the maximum it was cut with, none but the last shorter than the minimum
    ({"size": 300, "chunking": {"min": 64, "avg": 128, "max": 256}, "chunks": [["a" * 64, 300]]},
     "chunk 0 has 300 bytes, outside its chunking's 64..256"),
    ({"size": 300, "chunking": {"min": 64, "avg": 128, "max": 256}, "chunks": [["a" * 64, 10], ["b" * 64, 290]]},
     "chunk 0 has 10 bytes, outside"),
])
def test_an_index_read_from_a_store_is_checked(doc, problem):
    good = {"format": "efabuild.chunks/v1", "size": 3, "digest": "blake3:" + "0" * 64, "chunks": [["a" * 64, 3]]}
    with pytest.raises(BadChunkIndex, match=problem.replace("[", r"\[").replace("]", r"\]")):
        ChunkIndex.from_json(json.dumps({**good, **doc}).encode(), "objects/ab/k.chunks.json")


def test_deeply_nested_or_huge_index_is_refused(tmp_path):
    with pytest.raises(BadChunkIndex, match="not JSON"):
        ChunkIndex.from_json(b"[" * 100_000 + b"]" * 100_000, "x")
    with pytest.raises(BadChunkIndex, match="larger than"):
        ChunkIndex.from_json(b" " * (25 * MiB), "x")


@pytest.mark.slow
def test_an_index_lists_a_bounded_number_of_chunks_and_is_refused_before_parsing_more():
    from efabuild.chunks.cdc import MAX_CHUNKS

    entries = MAX_CHUNKS + 1
    doc = {"format": "efabuild.chunks/v1", "size": entries, "digest": "blake3:" + "0" * 64,
           "chunking": {"min": 64, "avg": 128, "max": 256}, "chunks": [["a" * 64, 1]] * entries}
    with pytest.raises(BadChunkIndex, match=f"chunk index of {entries} chunks, more than {MAX_CHUNKS}"):
        ChunkIndex.from_json(json.dumps(doc, separators=(",", ":")).encode(), "x")
    # values no index holds, by the million: refused before json makes them
    with pytest.raises(BadChunkIndex, match=f"more than {MAX_CHUNKS} chunks"):
        ChunkIndex.from_json(b'{"chunks":[' + b'"ab",' * (4 * MiB) + b'0]}', "x")


def test_an_index_beside_an_artifact_is_never_followed_and_junk_is_ignored(tmp_path, monkeypatch):
    """What a store writer plants in place of an index costs that artifact its use as a seed,
    nothing else: no link followed, no FIFO opened (it would block), no junk trusted."""
    from efabuild import notices
    from efabuild.store.tiers.fs import FilesystemTier
    from tests.kits.storekit import key_for, make_sqsh, record_for

    said: list[str] = []
    monkeypatch.setattr(notices, "_printer", lambda kind, message: said.append(message))
    tier = FilesystemTier(tmp_path / "store", "shared")
    sqsh = make_sqsh(tmp_path, os.urandom(MiB))
    key = key_for("indexed")
    tier.publish(key, sqsh, record_for(key, "demo:user", sqsh), show_progress=False)
    index = chunk_file(tier.sqsh_path(key), chunking=SMALL)
    tier.keep_index(key, index)
    assert tier.chunk_index(key) == index and tier.recently_indexed() == [key]
    path = seeds.index_path(tier, key)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(index.to_json())
    for plant in ("link", "fifo", "junk", "other-file"):
        path.unlink()
        if plant == "link":
            path.symlink_to(elsewhere)
        elif plant == "fifo":
            os.mkfifo(path)
        elif plant == "junk":
            path.write_text("{]")
        else:  # a valid index of other bytes
            path.write_bytes(chunk_file(elsewhere, chunking=SMALL).to_json())
        assert tier.chunk_index(key) is None, plant
    assert any("not a file" in m for m in said) and any("not JSON" in m for m in said)
    assert tier.sqsh_path(key).is_file() and tier.record(key) is not None


# ---- the S3 chunk store, on the loopback S3 server ---------------------------------------------

@pytest.fixture
def chunk_store(moto_server: str, s3_bucket: str) -> ChunkStore:
    settings = S3Config(bucket=s3_bucket, prefix="efabuild/", region="us-east-1", endpoint_url=moto_server)
    return ChunkStore(S3Tier(settings, show_progress=False))




@pytest.mark.s3
def test_gc_deletes_a_chunk_only_after_a_grace_period_in_which_nothing_used_it(tmp_path, chunk_store, s3_client):
    import time

    from efabuild.store.gc.s3chunks import collect

    one, two = shifted_versions(tmp_path)
    a, b = chunk_file(one, chunking=SMALL), chunk_file(two, chunking=SMALL)
    tier = chunk_store.tier
    for name, index, path in (("a", a, one), ("b", b, two)):
        upload(chunk_store, index, path, chunk_store.missing(index.unique()))
        tier._put_new(tier._path("objects", "00", f"{name * 64}.chunks.json"), index.to_json())
    only_a = set(a.unique()) - set(b.unique())
    assert only_a
    s3_client.delete_object(Bucket=tier.bucket, Key=tier._path("objects", "00", "a" * 64 + ".chunks.json"))

    start = time.time() + 1  # chunk objects' times have whole seconds
    first = collect(chunk_store, grace=3600, dry_run=False, now=start)
    assert first.deleted == 0 and first.marked == len(only_a)  # marked, not deleted
    early = collect(chunk_store, grace=3600, dry_run=False, now=start + 60)
    assert early.deleted == 0  # the grace period has not passed
    # after the grace period, a publisher reuses one of the marked chunks: it stays
    reused = sorted(only_a)[0]
    tier._put_new(tier._path("objects", "00", "c" * 64 + ".chunks.json"),
                  ChunkIndex(size=a.unique()[reused], digest=a.digest, chunks=((reused, a.unique()[reused]),)).to_json())
    dry = collect(chunk_store, grace=3600, dry_run=True, now=start + 7200)
    assert dry.deleted == len(only_a) - 1
    assert chunk_store.missing(only_a) == set()  # a dry run deletes nothing
    done = collect(chunk_store, grace=3600, dry_run=False, now=start + 7200)
    assert done.deleted == len(only_a) - 1
    assert chunk_store.missing(only_a) == only_a - {reused}
    out = tmp_path / "b.bin"
    with open(out, "w+b") as handle:
        assemble(chunk_store, b, handle.fileno(), [])
    assert file_digest(out) == b.digest  # b's chunks were never touched


@pytest.mark.s3
def test_gc_run_more_often_than_the_grace_period_still_frees_a_chunk(tmp_path, chunk_store):
    """Slip: gc deletes every mark, even those younger than the grace period. Run every 30 minutes
    with an hour's grace, it would then never free a chunk: a mark is kept until it is `grace` old."""
    import time

    from efabuild.store.gc.s3chunks import collect

    one, _ = shifted_versions(tmp_path, size=256 * KiB)
    index = chunk_file(one, chunking=SMALL)
    upload(chunk_store, index, one, set(index.unique()))  # no index names them: unreferenced
    start = time.time() + 1  # chunk objects' times have whole seconds
    runs = [collect(chunk_store, grace=3600, dry_run=False, now=start + 1800 * step) for step in range(4)]
    assert [run.deleted for run in runs] == [0, 0, len(index.unique()), 0]  # the first mark's hour is up
    assert chunk_store.missing(index.unique()) == set(index.unique())


@pytest.mark.s3
def test_gc_keeps_a_chunk_sent_again_after_its_mark(tmp_path, chunk_store, s3_client):
    """Slip: gc deletes a chunk written after its mark. A chunk gc marked unreferenced, then gone and
    sent again by a publish (whose index is not written yet) is not the chunk the mark found unused."""
    import math
    import time

    from efabuild.store.gc.s3chunks import collect

    one, _ = shifted_versions(tmp_path, size=256 * KiB)
    index = chunk_file(one, chunking=SMALL)
    tier = chunk_store.tier
    upload(chunk_store, index, one, set(index.unique()))
    marked_at = time.time()
    assert collect(chunk_store, grace=3600, dry_run=False, now=marked_at).marked == len(index.unique())
    resent = sorted(index.unique())[0]
    s3_client.delete_object(Bucket=tier.bucket, Key=chunk_store.object(resent))
    # its LastModified (whole seconds) after the mark; on a loaded machine that second may be past already
    time.sleep(max(0.0, math.floor(marked_at) + 1.1 - time.time()))
    upload(chunk_store, index, one, {resent})
    done = collect(chunk_store, grace=3600, dry_run=False, now=marked_at + 3601)
    assert done.deleted == len(index.unique()) - 1
    assert chunk_store.missing(index.unique()) == set(index.unique()) - {resent}
    data, _ = chunk_store.fetch(resent, index.unique()[resent])  # the publish's index, once written, holds
    assert len(data) == index.unique()[resent]


@pytest.mark.s3
def test_gc_skips_a_junk_index_with_a_warning(tmp_path, chunk_store, monkeypatch):
    from efabuild import notices
    from efabuild.store.gc.s3chunks import collect

    said = []
    monkeypatch.setattr(notices, "_printer", lambda kind, message: said.append((kind, message)))
    one, _ = shifted_versions(tmp_path)
    a = chunk_file(one, chunking=SMALL)
    upload(chunk_store, a, one, chunk_store.missing(a.unique()))
    tier = chunk_store.tier
    tier._put_new(tier._path("objects", "00", "a" * 64 + ".chunks.json"), a.to_json())
    tier._put_new(tier._path("objects", "00", "b" * 64 + ".chunks.json"), b"[" * 10000)
    report = collect(chunk_store, grace=0, dry_run=False)
    assert report.referenced == len(a.unique()) and report.deleted == 0
    assert report.skipped_indexes == (tier._path("objects", "00", "b" * 64 + ".chunks.json"),)
    assert [(kind, "not JSON" in message) for kind, message in said] == [(notices.WARNING, True)]


@pytest.mark.s3
def test_gc_holds_the_indexes_of_a_batch_at_once_not_every_artifacts(tmp_path, chunk_store, monkeypatch):
    """gc reads every chunk index to know which chunks are used; a bucket of many artifacts (or
    indexes planted by the thousand) must not have all of them parsed and waiting in memory
    together. Counted: indexes parsed and not yet taken in (two workers: batches of 4; 40 here)."""
    import threading

    from efabuild.store.chunked import s3 as s3chunks

    one, _ = shifted_versions(tmp_path)
    a = chunk_file(one, chunking=SMALL)
    tier = chunk_store.tier
    tier.workers = 2
    for number in range(40):
        tier._put_new(tier._path("objects", "00", f"{number:064x}.chunks.json"), a.to_json())
    lock, waiting, most = threading.Lock(), [0], [0]
    parse, take_in = s3chunks.ChunkIndex.from_json, s3chunks.ChunkIndex.unique

    def parsed(data: bytes, where: str) -> ChunkIndex:
        with lock:
            waiting[0] += 1
            most[0] = max(most[0], waiting[0])
        return parse(data, where)

    def taken_in(index: ChunkIndex) -> dict:
        with lock:
            waiting[0] -= 1
        return take_in(index)

    monkeypatch.setattr(s3chunks.ChunkIndex, "from_json", staticmethod(parsed))
    monkeypatch.setattr(s3chunks.ChunkIndex, "unique", taken_in)
    referenced, skipped = chunk_store.referenced()
    assert referenced == set(a.unique()) and skipped == []
    assert most[0] <= 4


# ---- an index of a file that reuses another's bytes (an incremental export's child) -------------

def _spliced_pair(tmp_path, rng, chunking):
    """A source file, and a file whose bytes [lo, hi) are the source's: another head (a rewritten
    superblock), the source's middle, a tail of its own; with their splice."""
    from efabuild.host.digest import Splice

    size = rng.randrange(20 * chunking[2], 80 * chunking[2])
    source = bytearray(rng.randbytes(size))
    lo = rng.choice([0, 96, rng.randrange(0, size // 2)])
    hi = rng.randrange(lo, size)
    child = bytearray(rng.randbytes(lo)) + source[lo:hi] + rng.randbytes(rng.randrange(0, 8 * chunking[2]))
    (tmp_path / "source").write_bytes(source)
    (tmp_path / "child").write_bytes(child)
    return tmp_path / "source", tmp_path / "child", Splice(str(tmp_path / "source"), lo, hi)


def test_a_file_that_reuses_anothers_bytes_gets_the_index_a_whole_cut_gives_it(tmp_path):
    """The child's index is taken from its ancestor's for the bytes the child reuses; whatever the
    chunk sizes and where the reused range lies, it is the index chunk_file gives the child."""
    import random

    from efabuild.chunks.cdc import chunk_spliced

    rng = random.Random(22)
    for _ in range(24):
        chunking = rng.choice([(64, 256, 1024), SMALL, (1 * KiB, 4 * KiB, 16 * KiB)])
        source, child, splice = _spliced_pair(tmp_path, rng, chunking)
        seed = chunk_file(source, chunking=chunking)
        assert chunk_spliced(child, splice, seed, chunking=chunking) == chunk_file(child, chunking=chunking)
        assert chunk_spliced(child, splice, None, chunking=chunking) == chunk_file(child, chunking=chunking)


def test_the_reused_range_is_hashed_from_the_source_not_cut_again(tmp_path):
    """What makes it cheap: the range's chunks come from the source's index and pages. Shown by
    breaking the contract on purpose: the child's own bytes in the range are zeros, yet its index
    names the source's chunks there."""
    import random

    from efabuild.host.digest import Splice
    from efabuild.chunks.cdc import chunk_spliced

    rng = random.Random(3)
    source = tmp_path / "source"
    source.write_bytes(rng.randbytes(2 * MiB))
    seed = chunk_file(source, chunking=SMALL)
    child = tmp_path / "child"
    child.write_bytes(b"\0" * (2 * MiB) + rng.randbytes(100 * KiB))
    index = chunk_spliced(child, Splice(str(source), 0, 2 * MiB), seed, chunking=SMALL)
    lent = [cid for cid, _ in seed.chunks[:-1]]
    assert [cid for cid, _ in index.chunks[:len(lent)]] == lent


def test_a_seed_index_that_lies_lends_nothing_after_the_lie(tmp_path):
    """An ancestor's index comes from a store: a chunk id that is not its bytes' hash is caught
    (the bytes are hashed from the source), and the child is cut as if there were no seed."""
    import random

    from efabuild.chunks.cdc import chunk_spliced

    rng = random.Random(7)
    source, child, splice = _spliced_pair(tmp_path, rng, SMALL)
    seed = chunk_file(source, chunking=SMALL)
    forged = seed._replace(chunks=tuple((("0" * 64 if n == 3 else cid), length)
                                        for n, (cid, length) in enumerate(seed.chunks)))
    assert chunk_spliced(child, splice, forged, chunking=SMALL) == chunk_file(child, chunking=SMALL)
    other = chunk_file(source, chunking=(1 * KiB, 4 * KiB, 16 * KiB))  # cut with other sizes: lends nothing
    assert chunk_spliced(child, splice, other, chunking=SMALL) == chunk_file(child, chunking=SMALL)


def test_a_seed_whose_ids_are_right_but_whose_cuts_are_not_fastcdcs_still_gives_the_childs_own_index(tmp_path):
    """A kept index in a shared tier may list true ids at lengths no FastCDC pass cut (each within
    the chunking's bounds, crossing the splice's edges anywhere): that costs sharing, but every id
    of the child's index is its bytes' hash and the lengths add up to the child."""
    import random

    from efabuild.chunks.cdc import ChunkIndex, chunk_id, chunk_spliced

    rng = random.Random(11)
    low, _, high = SMALL
    for _ in range(8):
        source, child, splice = _spliced_pair(tmp_path, rng, SMALL)
        data, pos, chunks = source.read_bytes(), 0, []
        while pos < len(data):
            length = min(len(data) - pos, rng.randrange(low, high + 1))
            chunks.append((chunk_id(data[pos:pos + length]), length))
            pos += length
        seed = ChunkIndex(len(data), file_digest(source), tuple(chunks), SMALL)
        index = chunk_spliced(child, splice, seed, chunking=SMALL)
        own = child.read_bytes()
        assert [cid for cid, _, _ in index.spans()] == [chunk_id(own[o:o + n]) for _, o, n in index.spans()]
        assert sum(n for _, n in index.chunks) == index.size == len(own) and index.digest == file_digest(child)
        assert all(n <= high for _, n in index.chunks) and all(n >= low for _, n in index.chunks[:-1])


def test_the_sources_short_last_chunk_is_not_lent_to_a_child_that_goes_on(tmp_path):
    """The source's last chunk was cut by the end of its data, not by FastCDC: a child whose bytes
    go on past it (an incremental child copies the ancestor's prefix, then adds) cuts there
    differently, and lending it would give an index that chunk_file() of the child does not."""
    import random

    from efabuild.host.digest import Splice
    from efabuild.chunks.cdc import chunk_spliced

    rng = random.Random(5)
    source = tmp_path / "source"
    source.write_bytes(rng.randbytes(2 * MiB + 777))
    seed = chunk_file(source, chunking=SMALL)
    child = tmp_path / "child"
    child.write_bytes(source.read_bytes() + rng.randbytes(300 * KiB))
    spliced = chunk_spliced(child, Splice(str(source), 0, 2 * MiB + 777), seed, chunking=SMALL)
    assert spliced == chunk_file(child, chunking=SMALL)
    assert seed.chunks[-1] not in spliced.chunks  # its short last chunk is the child's no more
