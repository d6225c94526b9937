"""blake3 digests of artifacts: the same value however the bytes arrive."""

from __future__ import annotations

import hashlib

import blake3
from hypothesis import given, settings
from hypothesis import strategies as st

from efabuild.digest import Hasher, bytes_digest, file_digest, is_digest


def test_known_value_of_the_empty_input(tmp_path):
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    # blake3's published digest of the empty input
    expected = "blake3:af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
    assert file_digest(empty) == expected
    assert bytes_digest(b"") == expected
    assert Hasher().digest() == expected


@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=300_000), cuts=st.lists(st.integers(min_value=0, max_value=300_000), max_size=6))
def test_file_streaming_and_bytes_agree(tmp_path_factory, data, cuts):
    path = tmp_path_factory.mktemp("digest") / "blob"
    path.write_bytes(data)
    hasher = Hasher()
    previous = 0
    for cut in sorted(c for c in cuts if c <= len(data)) + [len(data)]:
        hasher.update(data[previous:cut])
        previous = cut
    expected = "blake3:" + blake3.blake3(data).hexdigest()
    assert file_digest(path) == expected
    assert hasher.digest() == expected
    assert hasher.size == len(data)
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
