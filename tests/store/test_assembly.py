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
from efabuild.store.chunked.chunks import chunk_file
from efabuild.host.digest import file_digest
from efabuild.host.rangecopy import RangeCopier
from efabuild.store.tiers.s3 import S3Tier
from tests.kits.storekit import shifted_versions
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

    from efabuild.store.chunked.chunks import ChunkIndex, chunk_id

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
