"""Assembling a chunked artifact from seeds and downloads (store/chunked/assembly.py, host/rangecopy.py):
only missing chunks are downloaded, every chunk taken from a seed is checked in the result, a
damaged, shortened or vanished seed only costs downloads, and on XFS with reflink the seed's
blocks are shared rather than written (on a loop-mounted XFS made here)."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from efabuild.settings import S3Config
from efabuild.store.chunked.assembly import Seed, assemble, plan
from efabuild.store.chunked.publish import upload
from efabuild.chunks.cdc import chunk_file
from efabuild.host.digest import file_digest
from efabuild.host.rangecopy import RangeCopier
from efabuild.store.tiers.s3 import S3Tier
from tests.kits.storekit import give_to_another_user, shifted_versions
from efabuild.store.chunked.s3 import ChunkError, ChunkStore, compress

KiB, MiB = 1024, 1024 * 1024
SMALL = (4 * KiB, 16 * KiB, 64 * KiB)  # small chunks, so a few MiB make many of them


@pytest.fixture
def chunk_store(moto_server: str, s3_bucket: str) -> ChunkStore:
    settings = S3Config(bucket=s3_bucket, prefix="efabuild/", region="us-east-1", endpoint_url=moto_server)
    return ChunkStore(S3Tier(settings, show_progress=False))


def fill(chunk_store: ChunkStore, index, out: Path, seeds: list[Seed]):  # noqa: ANN001, ANN201
    with open(out, "w+b") as handle:
        return assemble(chunk_store, index, handle.fileno(), seeds)


def test_the_plan_copies_runs_of_chunks_that_follow_each_other_in_the_seed_and_downloads_the_rest(tmp_path):
    one, two = shifted_versions(tmp_path)
    a, b = chunk_file(one, chunking=SMALL), chunk_file(two, chunking=SMALL)
    runs, download = plan(b, [Seed(one, a)], most=256 * KiB)
    spans = sorted((offset, cid) for run in runs for cid, offset, _ in run.spans)
    spans += [(offset, cid) for cid, offsets in download.items() for offset in offsets]
    assert sorted(spans) == sorted((offset, cid) for cid, offset, _ in b.spans())  # every chunk, once
    assert set(download) == set(b.unique()) - set(a.unique())
    seed_bytes = one.read_bytes()
    target = two.read_bytes()
    for run in runs:
        assert run.length <= 256 * KiB or len(run.spans) == 1
        assert seed_bytes[run.source:run.source + run.length] == target[run.dest:run.dest + run.length]
    assert len(runs) < len(b.chunks) / 2  # back-to-back chunks are copied together


def reordered(tmp_path: Path):  # noqa: ANN201
    """A target and a seed holding the same eight chunks, the seed in pairs swapped (1 0 3 2 …):
    each chunk is in the seed, but no two that follow each other in the target do there."""
    import blake3

    from efabuild.chunks.cdc import ChunkIndex, chunk_id

    rng = random.Random(11)
    pieces = [rng.randbytes(rng.randrange(8 * KiB, 24 * KiB)) for _ in range(8)]
    order = [1, 0, 3, 2, 5, 4, 7, 6]

    def written(name: str, parts: list[bytes]):  # noqa: ANN202
        path = tmp_path / name
        path.write_bytes(b"".join(parts))
        return path, ChunkIndex(size=path.stat().st_size, digest="blake3:" + blake3.blake3(path.read_bytes()).hexdigest(),
                                chunks=tuple((chunk_id(p), len(p)) for p in parts), chunking=SMALL)

    return written("target.bin", pieces), written("seed.bin", [pieces[i] for i in order])


def test_the_plan_never_joins_chunks_that_do_not_follow_each_other_in_the_seed(tmp_path):
    """Slip: runs are joined where the chunks follow each other in the target only: the wrong bytes
    are copied, found wrong by the digest, and downloaded after all."""
    (target, index), (seed, seed_index) = reordered(tmp_path)
    runs, download = plan(index, [Seed(seed, seed_index)])
    assert download == {}
    seed_bytes, target_bytes = seed.read_bytes(), target.read_bytes()
    for run in runs:  # each run copies the bytes the target has there
        assert seed_bytes[run.source:run.source + run.length] == target_bytes[run.dest:run.dest + run.length]


@pytest.mark.s3
def test_a_seed_holding_every_chunk_in_another_order_costs_no_download(tmp_path, chunk_store):
    (target, index), (seed, seed_index) = reordered(tmp_path)
    upload(chunk_store, index, target, set(index.unique()))
    got = fill(chunk_store, index, tmp_path / "fetched.bin", [Seed(seed, seed_index)])
    assert got.digest == index.digest == file_digest(tmp_path / "fetched.bin")
    assert (got.transfer.chunks, got.transfer.bytes, got.transfer.reused) == (0, 0, 8)


@pytest.mark.s3
def test_a_seeded_assembly_downloads_only_what_the_seed_lacks(tmp_path, chunk_store):
    one, two = shifted_versions(tmp_path)
    a, b = chunk_file(one, chunking=SMALL), chunk_file(two, chunking=SMALL)
    upload(chunk_store, a, one, chunk_store.missing(a.unique()))
    second = upload(chunk_store, b, two, chunk_store.missing(b.unique()))
    seeded = fill(chunk_store, b, tmp_path / "fetched.bin", [Seed(one, a)])
    assert seeded.digest == b.digest == file_digest(tmp_path / "fetched.bin")
    assert seeded.transfer.bytes == second.bytes and seeded.transfer.reused_bytes == b.size - second.bytes
    cold = fill(chunk_store, b, tmp_path / "cold.bin", [])
    assert cold.digest == file_digest(tmp_path / "cold.bin") == b.digest and cold.transfer.reused == 0


@pytest.mark.s3
def test_a_damaged_shortened_or_vanished_seed_only_costs_the_downloads_of_what_it_got_wrong(tmp_path, chunk_store):
    one, two = shifted_versions(tmp_path)
    a, b = chunk_file(one, chunking=SMALL), chunk_file(two, chunking=SMALL)
    upload(chunk_store, b, two, chunk_store.missing(b.unique()))
    # one byte of the seed changed after it was indexed: that chunk alone is downloaded
    damaged = bytearray(one.read_bytes())
    victim, offset, length = next(span for span in a.spans() if span[0] in b.unique() and span[1] > 200 * KiB)
    damaged[offset + length // 2] ^= 1
    one.write_bytes(bytes(damaged))
    result = fill(chunk_store, b, tmp_path / "out.bin", [Seed(one, a)])
    assert result.digest == b.digest == file_digest(tmp_path / "out.bin")
    new = set(b.unique()) - set(a.unique())
    assert result.transfer.chunks == len(new) + 1 and result.transfer.bytes == sum(
        b.unique()[c] for c in new | {victim})
    # cut short after 300 KiB: everything after it is downloaded; a seed gone: everything is
    os.truncate(one, 300 * KiB)
    short = fill(chunk_store, b, tmp_path / "short.bin", [Seed(one, a)])
    assert short.digest == b.digest and 0 < short.transfer.reused_bytes < 300 * KiB
    one.unlink()
    gone = fill(chunk_store, b, tmp_path / "gone.bin", [Seed(one, a)])
    assert gone.digest == b.digest and gone.transfer.reused == 0


@pytest.mark.s3
def test_a_corrupt_or_missing_chunk_object_fails_the_assembly(tmp_path, chunk_store, s3_client):
    _, two = shifted_versions(tmp_path)
    b = chunk_file(two, chunking=SMALL)
    upload(chunk_store, b, two, chunk_store.missing(b.unique()))
    cid, length = b.chunks[0]
    s3_client.put_object(Bucket=chunk_store.tier.bucket, Key=chunk_store.object(cid), Body=compress(b"x" * length))
    with pytest.raises(ChunkError, match="corrupt"):
        fill(chunk_store, b, tmp_path / "bad.bin", [])
    s3_client.delete_object(Bucket=chunk_store.tier.bucket, Key=chunk_store.object(cid))
    with pytest.raises(ChunkError, match="missing"):
        fill(chunk_store, b, tmp_path / "gone.bin", [])


def test_ranges_are_copied_exactly_where_blocks_cannot_be_shared(tmp_path):
    """On the test machine's own filesystem (ext4 here: no reflink) every byte is copied."""
    source = tmp_path / "source"
    source.write_bytes(random.Random(1).randbytes(3 * MiB))
    with open(source, "rb") as src, open(tmp_path / "dest", "w+b") as dest:
        os.ftruncate(dest.fileno(), 3 * MiB)
        copier = RangeCopier(dest.fileno())
        for src_offset, dest_offset, length in ((0, 0, MiB), (MiB + 5, MiB + 5, MiB), (12345, 2 * MiB + 7, 1000)):
            copier.copy(src.fileno(), src_offset, dest_offset, length)
        with pytest.raises(OSError, match="source ended"):
            copier.copy(src.fileno(), 3 * MiB - 10, 2 * MiB + 2000, 100)
    data, written = source.read_bytes(), (tmp_path / "dest").read_bytes()
    assert written[:MiB] == data[:MiB] and written[MiB + 5:2 * MiB + 5] == data[MiB + 5:2 * MiB + 5]
    assert written[2 * MiB + 7:2 * MiB + 1007] == data[12345:13345]
    assert copier.cloned + copier.copied == 2 * MiB + 1000 + 10


@pytest.fixture(scope="module")
def xfs(tmp_path_factory) -> Path:
    """A loop-mounted XFS made with reflink=1 (needs root and loop devices, else skipped)."""
    if shutil.which("mkfs.xfs") is None:
        pytest.skip("mkfs.xfs is not installed (xfsprogs; scripts/setup-host.sh installs it)")
    base = tmp_path_factory.mktemp("xfs")
    image, mount = base / "xfs.img", base / "mnt"
    mount.mkdir()
    with open(image, "wb") as handle:
        handle.truncate(512 * MiB)  # sparse: XFS needs 300 MB at least
    subprocess.run(["mkfs.xfs", "-q", "-m", "reflink=1", str(image)], check=True, capture_output=True)
    done = subprocess.run(["mount", "-o", "loop", str(image), str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot loop-mount an XFS image here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)
        image.unlink()


def shared_bytes(path: Path) -> int:
    """Bytes of `path` in extents the filesystem reports as shared (FIEMAP, via filefrag)."""
    out = subprocess.run(["filefrag", "-v", "-b1", str(path)], check=True, capture_output=True, text=True).stdout
    total = 0
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(":")]
        if len(fields) >= 5 and fields[0].isdigit() and "shared" in line:
            total += int(fields[3].split()[0] if fields[3] else 0)
    return total


@pytest.mark.s3
def test_on_xfs_with_reflink_the_seeds_blocks_are_shared_and_still_every_chunk_is_checked(xfs, chunk_store):
    work = xfs / uuid.uuid4().hex
    work.mkdir()
    one, two = shifted_versions(work, size=8 * MiB)  # 4 KiB blocks: the shift of 3 KiB leaves most runs unaligned
    # v3: v1 with one byte changed in place, as a one-file change of a SquashFS image mostly is
    three = work / "v3.bin"
    body = bytearray(one.read_bytes())
    body[5 * MiB] ^= 0xFF
    three.write_bytes(bytes(body))
    a, c = chunk_file(one, chunking=SMALL), chunk_file(three, chunking=SMALL)
    upload(chunk_store, c, three, chunk_store.missing(c.unique()))
    out = work / "fetched.bin"
    result = fill(chunk_store, c, out, [Seed(one, a)])
    assert result.digest == c.digest == file_digest(out)
    assert result.transfer.cloned_bytes > 0.9 * c.size  # shared, not written
    assert shared_bytes(out) >= result.transfer.cloned_bytes
    # the copy is its own: writing the seed afterwards leaves it as it was
    with open(one, "r+b") as handle:
        handle.write(b"\0" * 4096)
    assert file_digest(out) == c.digest
    # the seed now lies about its first chunk: it is downloaded, not cloned into the result
    again = fill(chunk_store, c, work / "again.bin", [Seed(one, a)])
    assert again.digest == c.digest == file_digest(work / "again.bin")
    assert again.transfer.chunks == len(set(c.unique()) - set(a.unique())) + 1
    # an unaligned shift (v2's 3 KiB insertion): the bytes are right whatever was cloned
    b = chunk_file(two, chunking=SMALL)
    upload(chunk_store, b, two, chunk_store.missing(b.unique()))
    shifted = fill(chunk_store, b, work / "shifted.bin", [Seed(three, c)])
    assert shifted.digest == b.digest == file_digest(work / "shifted.bin")


# -- the check: units copied from a seed at the same offsets are hashed from the seed's pages --------

UNIT = 1 << 20


def test_the_lent_unit_is_blake3trees():
    from efabuild.host import blake3tree
    from efabuild.store.chunked import assembly

    assert assembly.UNIT == blake3tree.UNIT


def _composed(rng: random.Random, seed: bytes, size: int, seed_path: Path):  # noqa: ANN202
    """A target of `size` bytes made of pieces copied from the seed at the same offsets (often back
    to back, as plan() cuts long runs), at other offsets, and bytes of its own; its runs, and
    which of its bytes came from the seed at the same offset."""
    from efabuild.store.chunked.assembly import Run

    target, same, runs = bytearray(), bytearray(), []
    while len(target) < size:
        at = len(target)
        length = min(size - at, rng.choice([rng.randrange(1, 4096), rng.randrange(1, 3 * UNIT)]))
        kind = rng.choice(["same", "same", "same", "other", "own"])
        if kind == "same" and at + length <= len(seed):
            target += seed[at:at + length]
            same += b"\1" * length
            runs.append(Run(seed_path, at, at, length, ()))
        elif kind == "other" and len(seed) > length:
            source = rng.randrange(0, len(seed) - length)
            target += seed[source:source + length]
            same += bytes([source == at]) * length
            runs.append(Run(seed_path, source, at, length, ()))
        else:  # its own bytes, unlike the seed's there
            target += bytes(b ^ 0x5A for b in rng.randbytes(length))
            same += b"\0" * length
    return bytes(target), runs, same


def _check(target: Path, seed: Path, runs, size: int):  # noqa: ANN001, ANN202
    from efabuild.store.chunked.assembly import check_digest, settled_stamps

    with open(seed, "rb") as src, open(target, "r+b") as dest:
        before = settled_stamps({seed: src.fileno()})
        return check_digest(dest.fileno(), size, runs, {seed: src.fileno()}, before)[:2]


def test_a_digest_assembled_from_a_seed_is_the_files_at_any_split(tmp_path, settled_clock):
    """Same-offset runs back to back, runs at other offsets, units straddling their edges, a last
    partial unit: only units wholly copied from the seed at their own offset are taken from it."""
    rng = random.Random(5)
    for _ in range(12):
        seed = rng.randbytes(rng.randrange(UNIT, 12 * UNIT))
        (tmp_path / "seed").write_bytes(seed)
        size = rng.choice([rng.randrange(1, 2 * UNIT), rng.randrange(UNIT, 14 * UNIT), len(seed)])
        target, runs, same = _composed(rng, seed, size, tmp_path / "seed")
        (tmp_path / "target").write_bytes(target)
        digest, lent = _check(tmp_path / "target", tmp_path / "seed", runs, size)
        assert digest == file_digest(tmp_path / "target")
        whole_units = [n for n in range(size // UNIT) if all(same[n * UNIT:(n + 1) * UNIT])]
        assert lent == UNIT * len(whole_units)


def _versions(tmp_path: Path) -> tuple[Path, Path, bytes]:
    """v1, and v2 as an incremental export's child of it: v1's bytes at the same offsets but for
    a changed region and a new tail; and v2's bytes."""
    rng = random.Random(17)
    one = rng.randbytes(8 * MiB + 5000)
    two = bytearray(one)
    two[3 * MiB + 100:3 * MiB + 40 * KiB] = rng.randbytes(40 * KiB - 100)
    two = bytes(two[:7 * MiB + 333]) + rng.randbytes(300 * KiB)
    (tmp_path / "v1.bin").write_bytes(one)
    (tmp_path / "v2.bin").write_bytes(two)
    return tmp_path / "v1.bin", tmp_path / "v2.bin", two


@pytest.fixture
def counted(monkeypatch):  # noqa: ANN201
    """The seed descriptors whose units the check hashed."""
    from efabuild.host import blake3tree

    calls: list[int] = []
    real = blake3tree.unit_values

    def spy(lib, fd, units):  # noqa: ANN001, ANN202
        calls.append(fd)
        return real(lib, fd, units)

    monkeypatch.setattr(blake3tree, "unit_values", spy)
    return calls


@pytest.mark.s3
def test_a_fetch_onto_the_previous_version_hashes_its_reused_units_from_it(tmp_path, chunk_store, settled_clock):
    one, two, _ = _versions(tmp_path)
    a, b = chunk_file(one, chunking=SMALL), chunk_file(two, chunking=SMALL)
    upload(chunk_store, b, two, set(b.unique()))
    got = fill(chunk_store, b, tmp_path / "out.bin", [Seed(one, a)])
    assert got.digest == b.digest == file_digest(tmp_path / "out.bin")
    assert got.lent >= 4 * MiB  # all but the units the changed chunks and the new tail touch
    assert got.transfer.reused_bytes > 0.9 * b.size


@pytest.mark.s3
def test_a_seed_changed_within_the_clocks_step_or_without_the_helper_lends_nothing(tmp_path, chunk_store,
                                                                                   monkeypatch):
    """A stamp taken within RACY_WINDOW_NS of the seed's last change may not move at a second write;
    and without the helper the file is hashed as before."""
    from efabuild.host import blake3tree, statstamp

    one, two, _ = _versions(tmp_path)
    a, b = chunk_file(one, chunking=SMALL), chunk_file(two, chunking=SMALL)
    upload(chunk_store, b, two, set(b.unique()))
    one.write_bytes(one.read_bytes())  # written just now
    fresh = fill(chunk_store, b, tmp_path / "fresh.bin", [Seed(one, a)])
    assert fresh.digest == b.digest == file_digest(tmp_path / "fresh.bin") and fresh.lent == 0
    monkeypatch.setattr(statstamp, "clock_ns", lambda: os.stat(one).st_ctime_ns + statstamp.RACY_WINDOW_NS)
    monkeypatch.setattr(blake3tree, "installed", lambda: None)
    bare = fill(chunk_store, b, tmp_path / "bare.bin", [Seed(one, a)])
    assert bare.digest == b.digest == file_digest(tmp_path / "bare.bin") and bare.lent == 0
    monkeypatch.undo()
    # settled only by the time of the check, not when its stamp was taken before the copy
    changed = os.stat(one).st_ctime_ns
    times = iter([changed + 1_000_000])
    monkeypatch.setattr(statstamp, "clock_ns", lambda: next(times, changed + 10 * statstamp.RACY_WINDOW_NS))
    late = fill(chunk_store, b, tmp_path / "late.bin", [Seed(one, a)])
    assert late.digest == b.digest and late.lent == 0
    monkeypatch.setattr(statstamp, "clock_ns", lambda: changed + statstamp.RACY_WINDOW_NS)
    assert fill(chunk_store, b, tmp_path / "lent.bin", [Seed(one, a)]).lent > 0  # settled: it lends


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 1]))


@pytest.mark.s3
def test_a_seed_changed_since_it_was_indexed_costs_the_download_of_what_it_got_wrong(tmp_path, chunk_store,
                                                                                     settled_clock, counted):
    one, two, truth = _versions(tmp_path)
    a, b = chunk_file(one, chunking=SMALL), chunk_file(two, chunking=SMALL)
    upload(chunk_store, b, two, set(b.unique()))
    victim = next(span for span in a.spans() if span[0] in b.unique() and span[1] > 5 * MiB)
    _flip(one, victim[1] + victim[2] // 2)  # same size, its stamp moved: before the fetch took it
    got = fill(chunk_store, b, tmp_path / "out.bin", [Seed(one, a)])
    assert (tmp_path / "out.bin").read_bytes() == truth and got.digest == b.digest
    assert counted  # the seed's units were hashed, and gave another digest
    assert got.transfer.chunks == len(set(b.unique()) - set(a.unique())) + 1


@pytest.mark.s3
@pytest.mark.parametrize("when", ["copy", "hash"])
def test_a_seed_changed_during_the_copy_or_its_hash_lends_nothing(tmp_path, chunk_store, settled_clock,
                                                                   monkeypatch, when):
    """The seed lies (one byte of a chunk it lends differs from its index) when it is copied, and
    is put right before its units are hashed: its pages would then give the true digest for a
    file holding the wrong byte. Its stamp moved, so the file itself is hashed, and the chunk
    downloaded."""
    from efabuild.host import blake3tree

    one, two, truth = _versions(tmp_path)
    a, b = chunk_file(one, chunking=SMALL), chunk_file(two, chunking=SMALL)
    upload(chunk_store, b, two, set(b.unique()))
    victim = next(span for span in a.spans() if span[0] in b.unique() and span[1] > 5 * MiB)
    flipped = victim[1] + victim[2] // 2
    _flip(one, flipped)
    put_right = []

    def mend() -> None:
        if not put_right:
            _flip(one, flipped)
            put_right.append(True)

    if when == "copy":
        real_copy = RangeCopier.copy

        def copy(self, src_fd, src_offset, dest_offset, length):  # noqa: ANN001, ANN202
            real_copy(self, src_fd, src_offset, dest_offset, length)
            if src_offset <= flipped < src_offset + length:
                mend()

        monkeypatch.setattr(RangeCopier, "copy", copy)
    else:
        real_values = blake3tree.unit_values

        def values(lib, fd, units):  # noqa: ANN001, ANN202
            mend()
            return real_values(lib, fd, units)

        monkeypatch.setattr(blake3tree, "unit_values", values)
    got = fill(chunk_store, b, tmp_path / "out.bin", [Seed(one, a)])
    assert put_right
    assert (tmp_path / "out.bin").read_bytes() == truth and got.digest == b.digest and got.lent == 0
    assert got.transfer.chunks == len(set(b.unique()) - set(a.unique())) + 1


@pytest.mark.s3
@pytest.mark.parametrize("how", ["open to the group", "another user's"])
def test_a_seed_someone_else_can_write_lends_nothing(tmp_path, chunk_store, settled_clock, counted, monkeypatch, how):
    """Its owner can rewrite a dirty page of it through a mapping without moving its stamp, or
    truncate it under our mapping (SIGBUS): the file itself is hashed."""
    one, two, _ = _versions(tmp_path)
    a, b = chunk_file(one, chunking=SMALL), chunk_file(two, chunking=SMALL)
    upload(chunk_store, b, two, set(b.unique()))
    if how == "open to the group":
        one.chmod(0o664)
    else:
        give_to_another_user(one, monkeypatch)
    got = fill(chunk_store, b, tmp_path / "out.bin", [Seed(one, a)])
    assert got.digest == b.digest == file_digest(tmp_path / "out.bin")
    assert got.lent == 0 and counted == []
    assert got.transfer.reused_bytes > 0.9 * b.size  # its chunks are still copied, and checked in the file


@pytest.mark.s3
def test_the_units_a_seed_lends_are_not_read_from_the_file(tmp_path, chunk_store, settled_clock, monkeypatch):
    """What makes it cheap, shown by breaking the copy on purpose: the whole units of the file's
    copied ranges are zeroed behind the copy, and the digest is still the index's, hashed from the seed. The check
    vouches for the seed's pages and for what the kernel copied from them, not for a copy gone
    wrong; where nothing is lent (no helper) the same fault is found in the file and downloaded."""
    from efabuild.host import blake3tree

    one, two, truth = _versions(tmp_path)
    a, b = chunk_file(one, chunking=SMALL), chunk_file(two, chunking=SMALL)
    upload(chunk_store, b, two, set(b.unique()))
    real_copy = RangeCopier.copy

    def copy(self, src_fd, src_offset, dest_offset, length):  # noqa: ANN001, ANN202
        real_copy(self, src_fd, src_offset, dest_offset, length)
        first, end = -(-dest_offset // UNIT) * UNIT, (dest_offset + length) // UNIT * UNIT
        if end > first:
            os.pwrite(self.dest_fd, bytes(end - first), first)

    monkeypatch.setattr(RangeCopier, "copy", copy)
    lent = fill(chunk_store, b, tmp_path / "lent.bin", [Seed(one, a)])
    assert lent.digest == b.digest and lent.lent >= 4 * MiB
    assert file_digest(tmp_path / "lent.bin") != b.digest
    monkeypatch.setattr(blake3tree, "installed", lambda: None)
    hashed = fill(chunk_store, b, tmp_path / "hashed.bin", [Seed(one, a)])
    assert (tmp_path / "hashed.bin").read_bytes() == truth and hashed.digest == b.digest and hashed.lent == 0


@pytest.mark.s3
def test_a_seed_shorter_than_its_index_lends_nothing(tmp_path, chunk_store, settled_clock, counted):
    """Its runs past its new end fail and are downloaded; the runs before it were copied, but a
    seed that failed under one lends no unit at all: the file is hashed."""
    one, two, truth = _versions(tmp_path)
    a, b = chunk_file(one, chunking=SMALL), chunk_file(two, chunking=SMALL)
    upload(chunk_store, b, two, set(b.unique()))
    os.truncate(one, 6 * MiB)
    got = fill(chunk_store, b, tmp_path / "out.bin", [Seed(one, a)])
    assert (tmp_path / "out.bin").read_bytes() == truth and got.digest == b.digest
    assert got.lent == 0 and counted == [] and 2 * MiB < got.transfer.reused_bytes < 6 * MiB  # its first run


def test_only_runs_that_meet_are_one_lent_range():
    """Units are lent from a seed only where its bytes were copied at the same offsets: two runs of
    one seed with a gap between them are two ranges, and the unit in the gap (downloaded, or
    another seed's) is not taken from this seed's pages."""
    from efabuild.host.blake3tree import UNIT
    from efabuild.store.chunked.assembly import Run, lent_units

    seed = Path("/seed")
    runs = [Run(seed, 0, 0, UNIT, ()), Run(seed, 2 * UNIT, 2 * UNIT, UNIT, ()),
            Run(seed, UNIT * 3, UNIT * 3, UNIT // 2, ()), Run(seed, UNIT * 3 + UNIT // 2, UNIT * 3 + UNIT // 2, UNIT // 2, ())]
    assert lent_units(runs, 5 * UNIT) == {seed: [0, 2, 3]}


def test_a_kept_index_of_other_bytes_of_the_same_size_is_no_seed(tmp_path):
    """A kept index stands for the copy beside it only with the record's size AND digest: one of
    other bytes of the same length (a planted or stale index) would lend chunks the copy lacks."""
    from efabuild.chunks.cdc import ChunkIndex
    from efabuild.store.chunked.seeds import keep_beside_copies, keep_index, kept_index
    from efabuild.store.tiered import Store
    from efabuild.store.tiers.fs import FilesystemTier
    from tests.kits.storekit import key_for, make_sqsh, record_for

    tier = FilesystemTier(tmp_path / "store", "local")
    key = key_for("kept index")
    sqsh = make_sqsh(tmp_path, os.urandom(50_000))
    Store([tier], show_progress=False).publish(key, sqsh, record_for(key, "g:l", sqsh))
    record = tier.record(key)
    right = ChunkIndex(record.size, record.digest, (("ab" * 32, record.size),))
    wrong = right._replace(digest="blake3:" + "00" * 32)
    keep_index(tier, key, wrong)
    assert kept_index(tier, key) is None
    keep_index(tier, key, right)
    assert kept_index(tier, key) == right
    keep_beside_copies([tier], key, wrong._replace(chunks=(("cd" * 32, record.size),)))
    assert kept_index(tier, key) == right  # not replaced by the index of other bytes
