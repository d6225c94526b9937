"""export/incremental.py without an engine: the ancestor's bytes must stay the checked ones until
the child written from them is hashed and kept (the layer-diff and engine parts: tests/make/)."""

from __future__ import annotations

import os
import time

import pytest

from efabuild.export.incremental import Ancestor, _unchanged, reuse
from efabuild.export.squash import ExportJob, Unkept, keep_export
from efabuild.export.tarfilter import RewritePlan
from efabuild.host import statstamp
from efabuild.host.digest import Splice, file_digest
from tests.kits.storekit import cache_dir
from tests.kits.storekit import give_to_another_user


def _ancestor(path, **fields) -> Ancestor:
    return Ancestor("a" * 64, "efabuild/efa:x", path, file_digest(path), {}, **fields)


def test_an_ancestor_rewritten_in_place_after_its_check_is_not_built_on(tmp_path):
    """In a shared tier the file's owner may rewrite it between the check and the copy: the child
    would then carry bytes nobody checked, under this make's record. Its stamp, taken before the
    check, tells."""
    sqsh = tmp_path / "efa.sqsh"
    sqsh.write_bytes(b"checked bytes")
    ancestor = _ancestor(sqsh, stamp=statstamp.stamp(os.stat(sqsh)))
    assert _unchanged(ancestor) is None
    time.sleep(0.01)
    sqsh.write_bytes(b"planted bytes")  # same size
    assert _unchanged(ancestor) == "the ancestor's copy changed while the child was written from it"


def _job(tmp_path, chunking=None) -> ExportJob:
    return ExportJob("img", tmp_path / "child.sqsh", (), RewritePlan((), "", frozenset(), frozenset()), None,
                     time.monotonic(), chunking)


def test_another_users_ancestor_changed_through_a_mapping_never_gives_a_child_of_unchecked_bytes(
        tmp_path, monkeypatch):
    """The owner of a file in a shared tier who keeps it mapped writable changes its bytes without
    moving its stamp (a page written again before it goes back to disk moves no time): between the
    check and the copy, the child would take their bytes under this make's record and signature."""
    import mmap

    from efabuild.host.blake3tree import file_tree

    sqsh = tmp_path / "efa.sqsh"
    sqsh.write_bytes(os.urandom(3 << 20))
    fd = os.open(sqsh, os.O_RDWR)
    mapped = mmap.mmap(fd, 0)
    mapped[5000:5001] = b"x"  # the owner's page is dirty before the check
    os.utime(sqsh, ns=(time.time_ns() - 60_000_000_000,) * 2)  # and the stamp long settled
    give_to_another_user(sqsh, monkeypatch)
    monkeypatch.setattr(statstamp, "clock_ns", lambda: time.time_ns() + 60_000_000_000)
    stamp = statstamp.stamp(os.stat(sqsh))
    ancestor = _ancestor(sqsh, stamp=stamp, tree=file_tree(sqsh))  # the check: digest and stamp
    mapped[5000:5008] = b"PLANTED!"  # after the check, through the same mapping
    assert statstamp.stamp(os.stat(sqsh)) == stamp  # the stamp cannot tell
    tmp = tmp_path / "child.tmp"
    tmp.write_bytes(os.urandom(96) + sqsh.read_bytes()[96:2 << 20] + b"new blocks and tables")
    with pytest.raises(Unkept, match="the ancestor's copy changed while the child was written from it"):
        keep_export(tmp, _job(tmp_path), True, **reuse(ancestor, tmp, 2 << 20))
    assert not (tmp_path / "child.sqsh").exists()
    mapped.close()
    os.close(fd)


@pytest.mark.parametrize("chunking", [None, (4096, 16384, 65536)])
def test_a_child_of_another_users_ancestor_is_hashed_from_its_own_bytes_and_kept(tmp_path, monkeypatch, chunking):
    from efabuild.host.blake3tree import file_tree
    from efabuild.host.digest import file_digests
    from efabuild.chunks.cdc import chunk_file

    sqsh = tmp_path / "efa.sqsh"
    sqsh.write_bytes(os.urandom(3 << 20))
    give_to_another_user(sqsh, monkeypatch)
    ancestor = _ancestor(sqsh, stamp=statstamp.stamp(os.stat(sqsh)), tree=file_tree(sqsh),
                         index=chunk_file(sqsh, chunking=chunking) if chunking else None)
    tmp = tmp_path / "child.tmp"
    tmp.write_bytes(os.urandom(96) + sqsh.read_bytes()[96:(2 << 20) + 7] + os.urandom(300_000))
    kept = keep_export(tmp, _job(tmp_path, chunking), True, **reuse(ancestor, tmp, (2 << 20) + 7))
    assert (kept.digest, kept.sha256) == file_digests(tmp_path / "child.sqsh")
    if chunking:
        assert kept.index == chunk_file(tmp_path / "child.sqsh", chunking=chunking)


@pytest.mark.parametrize("change", ["truncated", "rewritten"])
def test_another_users_ancestor_truncated_or_rewritten_after_the_copy_refuses_the_child_in_one_line(
        tmp_path, monkeypatch, change):
    sqsh = tmp_path / "efa.sqsh"
    sqsh.write_bytes(os.urandom(2 << 20))
    give_to_another_user(sqsh, monkeypatch)
    ancestor = _ancestor(sqsh, stamp=statstamp.stamp(os.stat(sqsh)))
    tmp = tmp_path / "child.tmp"
    tmp.write_bytes(os.urandom(96) + sqsh.read_bytes()[96:1 << 20] + b"tables")
    with open(sqsh, "r+b") as f:
        f.truncate(1000) if change == "truncated" else f.write(b"other")
    with pytest.raises(Unkept, match="^the ancestor's copy changed while the child was written from it$"):
        keep_export(tmp, _job(tmp_path), True, **reuse(ancestor, tmp, 1 << 20))


def test_a_refused_child_is_never_moved_to_its_name(tmp_path):
    source = tmp_path / "efa.sqsh"
    source.write_bytes(os.urandom(1 << 20))
    tmp = tmp_path / "child.tmp"
    tmp.write_bytes(source.read_bytes()[:4096] + b"new tail")
    job = ExportJob("img", tmp_path / "child.sqsh", (), RewritePlan((), "", frozenset(), frozenset()), None,
                    time.monotonic())
    with pytest.raises(Unkept, match="changed"):
        keep_export(tmp, job, True, splice=Splice(str(source), 96, 4096),
                    still_valid=lambda: "the ancestor's copy changed while the child was written from it")
    assert not (tmp_path / "child.sqsh").exists()
    kept = keep_export(tmp, job, True, splice=Splice(str(source), 96, 4096))
    assert kept.digest == file_digest(tmp_path / "child.sqsh")


@pytest.mark.parametrize("chunking", [None, (4096, 16384, 65536)])
@pytest.mark.parametrize("with_tree", [True, False])
def test_a_child_kept_from_its_ancestors_hashes_and_index_has_its_own_digests(tmp_path, chunking, with_tree):
    """Hashed from the ancestor's subtrees (with the helper) or pages (without), chunked with its
    ancestor's index lending the reused range: the digests and index are the child file's own."""
    import random

    from efabuild.host.blake3tree import file_tree
    from efabuild.host.digest import file_digests
    from efabuild.chunks.cdc import chunk_file

    rng = random.Random(9)
    source = tmp_path / "efa.sqsh"
    source.write_bytes(rng.randbytes(5 << 20))
    tmp = tmp_path / "child.tmp"
    tmp.write_bytes(rng.randbytes(96) + source.read_bytes()[96:(4 << 20) + 5] + rng.randbytes(700_000))
    job = ExportJob("img", tmp_path / "child.sqsh", (), RewritePlan((), "", frozenset(), frozenset()), None,
                    time.monotonic(), chunking)
    tree = file_tree(source) if with_tree else None
    assert (tree is not None) == with_tree
    seed = chunk_file(source, chunking=chunking) if chunking else None
    kept = keep_export(tmp, job, True, splice=Splice(str(source), 96, (4 << 20) + 5), seed=seed, tree=tree)
    assert (kept.digest, kept.sha256) == file_digests(tmp_path / "child.sqsh")
    if chunking:
        assert kept.index == chunk_file(tmp_path / "child.sqsh", chunking=chunking)


@pytest.mark.parametrize("chunking", [None, (4096, 16384, 65536)])
def test_a_sha256_begun_before_the_copy_is_the_childs_and_done_before_the_ancestor_is_found_unchanged(
        tmp_path, chunking):
    """The sha256 begun while the ancestor's range was being copied reads that range from the
    ancestor: the stamp check that vouches for those bytes must come after it has read them."""
    from efabuild.host.blake3tree import file_tree
    from efabuild.host.digest import Sha256Pass, file_digests

    source = tmp_path / "efa.sqsh"
    source.write_bytes(os.urandom(5 << 20))
    tmp = tmp_path / "child.tmp"
    tmp.write_bytes(os.urandom(96) + bytes((4 << 20) - 96) + os.urandom(300_000))  # the range not yet copied
    splice = Splice(str(source), 96, 4 << 20)
    fd = os.open(tmp, os.O_RDONLY)
    early = Sha256Pass(f"/proc/self/fd/{fd}", splice, holding=fd)
    with open(tmp, "r+b") as f:  # the copy, while the sha256 runs
        f.seek(96)
        f.write(source.read_bytes()[96:4 << 20])
    finished = []
    kept = keep_export(tmp, _job(tmp_path, chunking), False, splice=splice, tree=file_tree(source),
                       sha256_pass=early, still_valid=lambda: finished.append(not early._thread.is_alive()))
    assert finished == [True]
    assert (kept.digest, kept.sha256) == file_digests(tmp_path / "child.sqsh")
    with pytest.raises(OSError):
        os.fstat(fd)  # the pass let go of the file it held


@pytest.mark.parametrize("mistake", ["another file's tree", "the source changed since its tree"])
def test_a_tree_that_is_not_the_splice_sources_never_gives_the_child_a_wrong_digest(tmp_path, mistake):
    from efabuild.host.blake3tree import file_tree
    from efabuild.host.digest import file_digests

    source, other = tmp_path / "efa.sqsh", tmp_path / "other.sqsh"
    source.write_bytes(os.urandom(4 << 20))
    other.write_bytes(os.urandom(4 << 20))  # the same size: only its bytes differ
    tree = file_tree(other if mistake == "another file's tree" else source)
    if mistake == "the source changed since its tree":
        time.sleep(0.01)
        with open(source, "r+b") as f:  # before the child copies it: its tree is stale
            f.seek(2 << 20)
            f.write(os.urandom(1000))
    tmp = tmp_path / "child.tmp"
    tmp.write_bytes(os.urandom(96) + source.read_bytes()[96:3 << 20] + b"tables")
    kept = keep_export(tmp, _job(tmp_path), True, splice=Splice(str(source), 96, 3 << 20), tree=tree)
    assert (kept.digest, kept.sha256) == file_digests(tmp_path / "child.sqsh")


def test_a_kept_index_found_true_is_remembered_for_the_next_child_and_a_lying_one_never(tmp_path, monkeypatch):
    """The edit loop's second child of the same ancestor lends the kept index's chunks unhashed,
    once a first child found every one it lent true; an index that lied is never remembered."""
    import random

    from efabuild.export.incremental import _remember_seed, _seed_checked
    from efabuild.signing import verifycache
    from efabuild.chunks.cdc import chunk_file, chunk_spliced

    monkeypatch.setenv(verifycache.CACHE_ENV, str(cache_dir(tmp_path / "verified")))
    small = (4096, 16384, 65536)
    rng = random.Random(12)
    source = tmp_path / "efa.sqsh"
    source.write_bytes(rng.randbytes(3 << 20))
    child = tmp_path / "child.sqsh"
    child.write_bytes(rng.randbytes(96) + source.read_bytes()[96:(2 << 20) + 3] + rng.randbytes(300_000))
    splice = Splice(str(source), 96, (2 << 20) + 3)
    seed = chunk_file(source, chunking=small)
    forged = seed._replace(chunks=tuple(("f" * 64 if n == 5 else cid, length) for n, (cid, length) in enumerate(seed.chunks)))
    true, lying = _ancestor(source, index=seed), _ancestor(source, index=forged)
    assert not _seed_checked(true)
    _remember_seed(true, chunk_spliced(child, splice, seed, chunking=small), splice)
    assert _seed_checked(true)
    _remember_seed(lying, chunk_spliced(child, splice, forged, chunking=small), splice)
    assert not _seed_checked(lying)
    # lent unhashed, the index is still the child's own
    assert chunk_spliced(child, splice, seed, chunking=small, seed_checked=True) == chunk_file(child, chunking=small)
