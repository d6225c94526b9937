"""make's check of an ancestor's copy (transfer.open_checked_stamped with its tree): a copy
unchanged since its tree was remembered is not read again; a tree that lies, or a copy changed
since, is hashed, and damage is still found."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from efabuild.host import blake3tree, treecache
from efabuild.host.digest import file_digest
from efabuild.store.record import ArtifactRecord
from efabuild.store.transfer import DamagedCopy, open_checked_stamped

pytestmark = pytest.mark.skipif(blake3tree.native() is None, reason="needs the blake3 helper")
MiB = 1 << 20


@pytest.fixture
def copy(tmp_path) -> tuple[Path, ArtifactRecord]:
    path = tmp_path / "ancestor.sqsh"
    path.write_bytes(os.urandom(5 * MiB + 123))
    os.chmod(path, 0o644)
    return path, ArtifactRecord.for_file("a" * 64, "demo:efa", path, file_digest(path))


@pytest.fixture
def hashed(monkeypatch) -> list[int]:
    """Each whole hash of a file by the check."""
    calls: list[int] = []
    real = blake3tree.file_tree
    monkeypatch.setattr(blake3tree, "file_tree", lambda path: calls.append(1) or real(path))
    return calls


def _check(path: Path, record: ArtifactRecord) -> blake3tree.Tree:
    checked = open_checked_stamped("local", path, record, with_tree=True)
    os.close(checked.fd)
    return checked.tree


def test_a_second_check_of_the_unchanged_copy_reads_none_of_it(copy, hashed):
    path, record = copy
    first = _check(path, record)
    second = _check(path, record)
    assert hashed == [1]
    assert (second.digest, second.cvs) == (first.digest, first.cvs) and second.digest == record.digest


def test_a_remembered_tree_that_does_not_make_the_records_digest_is_not_used(copy, hashed):
    path, record = copy
    first = _check(path, record)
    st = os.stat(path)
    assert treecache.remember(path, (st.st_dev, st.st_ino), record.digest, bytes(len(first.cvs)))
    again = _check(path, record)
    assert hashed == [1, 1] and again.cvs == first.cvs


def test_a_copy_changed_since_its_check_is_hashed_and_found_damaged(copy, hashed):
    path, record = copy
    _check(path, record)
    with open(path, "r+b") as handle:
        handle.seek(2 * MiB)
        handle.write(b"\0" * 64)
    with pytest.raises(DamagedCopy, match="its record says"):
        _check(path, record)
    assert hashed == [1, 1]
