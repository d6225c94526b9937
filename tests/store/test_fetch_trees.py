"""A fetch onto the previous version on a node takes the reused units' values from the tree that
version's own fetch remembered (host/treecache.py), instead of hashing them from its pages; a
version changed since, or a tree that lies, never puts other bytes under the key."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from efabuild.host import blake3tree, treecache
from efabuild.host.digest import file_digest
from efabuild.settings import S3Config
from efabuild.store.tiered import Store
from efabuild.store.tiers.fs import FilesystemTier
from tests.kits.storekit import CHUNKED, make_sqsh, publish, recalled_tree

pytestmark = [pytest.mark.s3, pytest.mark.skipif(blake3tree.installed() is None, reason="needs the blake3 helper")]
KiB, MiB = 1024, 1024 * 1024


def _versions(tmp_path: Path) -> tuple[Path, Path]:
    rng = random.Random(11)
    body = rng.randbytes(6 * MiB)
    changed = bytearray(body)
    changed[3 * MiB:3 * MiB + 50 * KiB] = rng.randbytes(50 * KiB)
    return make_sqsh(tmp_path, body, "v1"), make_sqsh(tmp_path, bytes(changed), "v2")


def _node(tmp_path: Path, settings: S3Config) -> Store:
    return Store([FilesystemTier(tmp_path / "fsx", "shared")], settings, show_progress=False, s3_options=CHUNKED)


@pytest.fixture
def seeded(tmp_path, settings, settled_clock, monkeypatch):  # noqa: ANN001, ANN201
    """(node, the previous version's path there, the new key, the new version, seed hashes): the
    node fetched v1; the units hashed from a seed's pages in any fetch after are counted."""
    v1, v2 = _versions(tmp_path)
    store = Store([FilesystemTier(tmp_path / "cache", "local")], settings, show_progress=False, s3_options=CHUNKED)
    k1, k2 = publish(store, v1), publish(store, v2)
    cluster = _node(tmp_path, settings)
    previous = cluster.fetch(k1)
    hashed: list[int] = []
    real = blake3tree.unit_values
    monkeypatch.setattr(blake3tree, "unit_values", lambda lib, fd, units: hashed.append(len(units)) or
                        real(lib, fd, units))
    return cluster, previous, k2, v2, hashed


def test_the_next_fetch_takes_the_reused_units_values_from_the_tree_the_first_remembered(seeded):
    cluster, previous, k2, v2, hashed = seeded
    assert recalled_tree(previous) is not None
    fetched = cluster.fetch(k2)
    assert file_digest(fetched) == file_digest(v2)
    assert hashed == []  # no unit of the previous version was hashed again
    assert cluster.s3.last_transfer.reused_bytes > 0.9 * v2.stat().st_size


def test_a_previous_version_changed_since_its_tree_was_remembered_is_hashed_and_its_damage_downloaded(seeded):
    cluster, previous, k2, v2, hashed = seeded
    os.chmod(previous, 0o644)
    with open(previous, "r+b") as handle:  # the same size, other bytes in a reused unit: the stamp moves
        handle.seek(MiB)
        handle.write(b"\xff" * 4096)
    fetched = cluster.fetch(k2)
    assert fetched.read_bytes() == v2.read_bytes()


def test_a_tree_whose_values_lie_costs_a_rehash_never_other_bytes(seeded):
    """A tree of the previous version's stamp whose values are not its units' (a cache this user
    damaged): the digest made from them is not the record's, and the file is hashed whole."""
    cluster, previous, k2, v2, hashed = seeded
    digest, cvs = recalled_tree(previous)
    st = os.stat(previous)
    assert treecache.remember(previous, (st.st_dev, st.st_ino), digest, bytes(len(cvs)))
    fetched = cluster.fetch(k2)
    assert fetched.read_bytes() == v2.read_bytes() and file_digest(fetched) == file_digest(v2)


def test_a_tree_is_neither_kept_nor_believed_for_a_file_others_can_write(seeded, monkeypatch):
    cluster, previous, k2, v2, hashed = seeded
    os.chmod(previous, 0o664)
    st = os.stat(previous)
    values = bytes(32 * (st.st_size // MiB))
    assert not treecache.remember(previous, (st.st_dev, st.st_ino), "blake3:" + "0" * 64, values)
    with monkeypatch.context() as m:  # kept as if it were this user's alone: still not believed
        m.setattr(treecache.statstamp, "others_may_write", lambda info: False)
        assert treecache.remember(previous, (st.st_dev, st.st_ino), "blake3:" + "0" * 64, values)
    assert recalled_tree(previous) is None

