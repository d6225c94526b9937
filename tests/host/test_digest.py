"""blake3 digests of artifacts: the same value however the bytes arrive."""

from __future__ import annotations

import hashlib
import os
import time
import blake3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from efabuild.host.digest import (
    Sha256Pass,
    bytes_digest,
    file_digest,
    file_digests,
    is_digest,
    sha256_file,
)
from efabuild.errors import EfabuildError
from efabuild.store.record import ArtifactRecord


def test_known_value_of_the_empty_input(tmp_path):
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    # blake3's published digest of the empty input
    expected = "blake3:af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
    assert file_digest(empty) == expected
    assert bytes_digest(b"") == expected


@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=300_000))
def test_file_and_bytes_agree(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("digest") / "blob"
    path.write_bytes(data)
    expected = "blake3:" + blake3.blake3(data).hexdigest()
    assert file_digest(path) == expected
    assert bytes_digest(data) == expected


def test_a_large_file_hashed_with_threads_matches_the_single_threaded_digest(tmp_path):
    # Above blake3's multithreading threshold: the parallel tree hash must equal the serial one.
    data = hashlib.shake_256(b"efabuild").digest(24 * 1024 * 1024)
    path = tmp_path / "big"
    path.write_bytes(data)
    assert file_digest(path) == "blake3:" + blake3.blake3(data, max_threads=1).hexdigest()


def test_digest_shape():
    assert is_digest("blake3:" + "0" * 64)
    assert not is_digest("blake3:" + "0" * 63)
    assert not is_digest("sha256:" + "0" * 64)
    assert not is_digest("blake3:" + "G" * 64)
    assert not is_digest(None)


@settings(max_examples=20, deadline=None)
@given(data=st.binary(max_size=20 << 20) | st.sampled_from([b"", b"x", bytes(range(256)) * 40_000]))
def test_one_read_gives_blake3_and_sha256(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("digests") / "blob"
    path.write_bytes(data)
    blake3_digest, sha256 = file_digests(path)
    assert blake3_digest == "blake3:" + blake3.blake3(data).hexdigest()
    assert sha256 == hashlib.sha256(data).hexdigest() == sha256_file(path) == Sha256Pass(path).result()


def test_a_record_without_sha256_stays_readable_and_a_new_one_keeps_it():
    key = "ab" * 32
    old = {"version": 1, "key": key, "name": "demo:efa", "size": 3, "digest": "blake3:" + "0" * 64,
           "created": "2026-01-01T00:00:00.000000Z", "export": {}, "manifest_digest": None}
    record = ArtifactRecord.from_dict(old)
    assert record.sha256 is None and "sha256" not in record.to_dict()
    new = ArtifactRecord.from_json(record._replace(sha256="5a" * 32).to_json())
    assert new.sha256 == "5a" * 32
    with pytest.raises(EfabuildError, match="sha256 'sha256:"):
        ArtifactRecord.from_dict({**old, "sha256": "sha256:" + "5a" * 32}, "rec.json")


def test_a_spliced_file_hashes_as_the_file_it_is(tmp_path):
    """An incremental export's child is hashed with its reused range read from the ancestor (whose
    pages are cached where a clone's are not): the digests are the child's own, at any split."""
    import random

    from efabuild.host.digest import Splice, file_digests, spliced_digests

    rng = random.Random(1)
    source = rng.randbytes(3 << 20)
    (tmp_path / "source").write_bytes(source)
    for lo, hi in ((0, 0), (96, 3 << 20), (96, 1 << 20), (5000, 5001), (0, 3 << 20)):
        child = rng.randbytes(lo) + source[lo:hi] + rng.randbytes(rng.randrange(0, 1 << 20))
        (tmp_path / "child").write_bytes(child)
        splice = Splice(str(tmp_path / "source"), lo, hi)
        assert spliced_digests(tmp_path / "child", splice, True) == file_digests(tmp_path / "child")
        assert spliced_digests(tmp_path / "child", splice, False) == (file_digests(tmp_path / "child")[0], None)


@pytest.mark.parametrize("whose", ["this user's", "writable by others"])
def test_a_file_others_can_write_is_read_not_mapped_so_a_truncation_mid_hash_ends_no_process(tmp_path, whose):
    """A copy's owner in a shared tier may truncate it while it is hashed (a root `audit`, a job's
    verifying start): pages of a mapping past the new end kill the reader with SIGBUS, where a
    read just ends early (the digest is then another, and the check refuses the copy)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    big = tmp_path / "shared.sqsh"
    with open(big, "wb") as f:
        f.truncate(4 << 30)  # sparse: seconds of hashing, no disk
    if whose == "writable by others":
        big.chmod(0o666)
    script = ("import sys; from efabuild.host.digest import file_digest; print('hashing', flush=True); "
              "print(file_digest(sys.argv[1]))")
    proc = subprocess.Popen([sys.executable, "-c", script, str(big)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert proc.stdout.readline() == "hashing\n"
    time.sleep(0.3)
    os.truncate(big, 4096)
    out, _ = proc.communicate(timeout=120)
    if whose == "this user's":  # only this user could do that to their own file: mapped, as before
        assert proc.returncode == -signal.SIGBUS
    else:
        assert proc.returncode == 0 and is_digest(out.strip()), (proc.returncode, out)


def test_an_abandoned_sha256_pass_stops_and_lets_go_of_its_file(tmp_path):
    """An incremental export that falls back to a full one abandons the sha256 it began: the
    thread must not read on for a gigabyte, nor keep the unlinked temp file open."""
    from efabuild.host.digest import Abandoned, Sha256Pass, Splice

    source, child = tmp_path / "a", tmp_path / "c"
    for path in (source, child):
        with open(path, "wb") as f:
            f.truncate(1 << 30)  # sparse: about a second of sha256, no disk
    fd = os.open(child, os.O_RDONLY)
    started = Sha256Pass(f"/proc/self/fd/{fd}", Splice(str(source), 96, 1 << 30), holding=fd)
    started.abandon()
    with pytest.raises(Abandoned):  # stopped before its end
        started.result()
    with pytest.raises(OSError):
        os.fstat(fd)


@pytest.mark.parametrize("size", [0, 1, (8 << 20) + 3])
def test_sha256_file_is_the_files_whether_mapped_or_read(tmp_path, size):
    """Mapped for a file only this user can write, read for one someone could truncate meanwhile."""
    from efabuild.host.digest import sha256_file

    path = tmp_path / "a.sqsh"
    data = os.urandom(size)
    path.write_bytes(data)
    mapped = sha256_file(path)
    path.chmod(0o666)
    assert mapped == sha256_file(path) == hashlib.sha256(data).hexdigest()
