"""The trees fetches remember (host/treecache.py): believed only from this user's own directory and
files, for the very inode and stamp they were kept for, bounded in size and in number."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from efabuild.host import treecache
from efabuild.host.usercache import CACHE_ENV, own_dir
from tests.kits.storekit import cache_dir
from tests.kits.storekit import recalled_tree, swap_link_during_writes

MiB = 1 << 20
DIGEST = "blake3:" + "ab" * 32


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(cache_dir(tmp_path / "cache")))


@pytest.fixture
def kept(tmp_path) -> tuple[Path, bytes]:
    path = tmp_path / "v1.sqsh"
    path.write_bytes(os.urandom(3 * MiB + 5))
    os.chmod(path, 0o644)
    st = os.stat(path)
    values = os.urandom(32 * 3)
    assert treecache.remember(path, (st.st_dev, st.st_ino), DIGEST, values)
    return path, values



def _entry(path: Path) -> Path:
    st = os.stat(path)
    return own_dir() / "trees" / f"{st.st_dev:x}-{st.st_ino:x}.tree"


def test_a_kept_tree_is_recalled_for_the_same_file_unchanged(kept):
    path, values = kept
    assert recalled_tree(path) == (DIGEST, values)


def test_any_change_to_the_file_or_another_file_at_its_name_recalls_nothing(kept, tmp_path):
    path, values = kept
    os.utime(path, ns=(1, 1))
    assert recalled_tree(path) is None
    other = tmp_path / "other"
    other.write_bytes(path.read_bytes())
    os.replace(other, path)
    assert recalled_tree(path) is None


def test_a_tree_for_another_inode_or_of_the_wrong_size_is_not_kept(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(os.urandom(2 * MiB))
    st = os.stat(path)
    assert not treecache.remember(path, (st.st_dev, st.st_ino + 1), DIGEST, os.urandom(64))
    assert not treecache.remember(path, (st.st_dev, st.st_ino), DIGEST, os.urandom(96))
    assert recalled_tree(path) is None


@pytest.mark.parametrize("damage", ["open to others", "longer than a tree", "a link", "another format"])
def test_an_entry_that_is_not_this_users_own_and_well_formed_is_ignored(kept, damage):
    path, values = kept
    entry = _entry(path)
    if damage == "open to others":
        os.chmod(entry, 0o666)
    elif damage == "longer than a tree":
        with open(entry, "ab") as handle:
            handle.write(b"\0" * 4096)
    elif damage == "a link":
        target = entry.with_name("elsewhere")
        os.replace(entry, target)
        os.symlink(target, entry)
    else:
        entry.write_bytes(entry.read_bytes().replace(b"efabuild.tree/v1", b"efabuild.tree/v9"))
        os.chmod(entry, 0o600)
    assert recalled_tree(path) is None


def test_a_directory_open_to_others_is_neither_read_nor_written(kept):
    path, values = kept
    os.chmod(own_dir() / "trees", 0o777)
    try:
        assert recalled_tree(path) is None
        st = os.stat(path)
        assert not treecache.remember(path, (st.st_dev, st.st_ino), DIGEST, values)
    finally:
        os.chmod(own_dir() / "trees", 0o700)


def test_only_the_newest_entries_are_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(treecache, "KEEP", 3)
    for n in range(5):
        path = tmp_path / f"f{n}"
        path.write_bytes(os.urandom(MiB))
        st = os.stat(path)
        assert treecache.remember(path, (st.st_dev, st.st_ino), DIGEST, os.urandom(32))
    assert recalled_tree(tmp_path / "f4") is not None and recalled_tree(tmp_path / "f0") is None
    assert len(list((own_dir() / "trees").glob("*.tree"))) == 3


def test_an_entry_whose_header_nests_too_deep_is_ignored(tmp_path):
    # a large seed allows a long entry: a header of nested lists must not end the fetch in a traceback
    path = tmp_path / "big.sqsh"
    with open(path, "wb") as handle:
        handle.truncate(256 * MiB)
    os.chmod(path, 0o644)
    st = os.stat(path)
    assert treecache.remember(path, (st.st_dev, st.st_ino), DIGEST, os.urandom(32 * 256))
    entry = _entry(path)
    entry.write_bytes(b"efabuild.tree/v1\n" + b"[" * 8000 + b"\n")
    os.chmod(entry, 0o600)
    assert recalled_tree(path) is None


def test_a_directory_swapped_after_its_check_is_not_written(tmp_path, monkeypatch):
    # root fetching with a job user's $EFABUILD_VERIFY_CACHE below a link the user owns: the user
    # points the link at a directory of theirs once the trusted one was checked
    real, theirs = tmp_path / "real", tmp_path / "theirs"
    cache_dir(real / "verified")
    (theirs / "verified" / "trees").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.setenv(CACHE_ENV, str(link / "verified"))
    files = []
    for n in range(3):
        files.append(tmp_path / f"f{n}")
        files[-1].write_bytes(os.urandom(MiB))
        os.chmod(files[-1], 0o644)
    st = os.stat(files[0])
    # root walks to its cache directory from / and through no link at all; a user writes below theirs
    assert treecache.remember(files[0], (st.st_dev, st.st_ino), DIGEST, os.urandom(32)) == (os.geteuid() != 0)
    planted = theirs / "verified" / "trees" / "0-1.tree"
    planted.write_bytes(b"theirs")
    os.utime(planted, ns=(1, 1))
    monkeypatch.setattr(treecache, "KEEP", 1)
    swap_link_during_writes(monkeypatch, treecache, link, real, theirs)
    for path in files[1:]:
        st = os.stat(path)
        treecache.remember(path, (st.st_dev, st.st_ino), DIGEST, os.urandom(32))
    assert sorted(p.name for p in (theirs / "verified" / "trees").iterdir()) == ["0-1.tree"]
