"""Copies between tiers and fetches into one (store/transfer.py): what is checked is what is kept."""

from __future__ import annotations

import os

import pytest

from efabuild.store import transfer
from efabuild.store.transfer import DamagedCopy, fetch_into
from tests.kits.storekit import key_for, record_for


def test_a_fetch_checks_the_file_it_wrote_not_whatever_another_user_renamed_to_its_name(tmp_path, monkeypatch):
    """A whole object with other bytes than its record's: in a shared tier's tmp/ (the group may
    rename there) a file with the record's bytes is put at the fetch's name while it is checked,
    and the fetched file put back after. The fetch must refuse it, not report its inode as checked
    (the Pyxis importer then skips hashing that inode)."""
    good = tmp_path / "good.sqsh"
    good.write_bytes(os.urandom(50_000))
    record = record_for(key_for("swapped"), "ngc-efa:user", good)
    dest = tmp_path / "tmp" / "fetching.sqsh"
    dest.parent.mkdir()
    aside, planted = tmp_path / "aside", tmp_path / "planted"
    real_digest = transfer.file_digest

    def swapped_while_hashed(path):  # noqa: ANN001, ANN202
        if os.fspath(path) != os.fspath(dest):
            return real_digest(path)
        os.rename(dest, aside)
        os.link(good, planted)
        os.rename(planted, dest)
        try:
            return real_digest(path)
        finally:
            os.rename(aside, dest)

    monkeypatch.setattr(transfer, "file_digest", swapped_while_hashed)

    def fill(fd: int) -> None:
        os.pwrite(fd, os.urandom(record.size), 0)

    with pytest.raises(DamagedCopy, match="its record says"):
        fetch_into("s3", dest, record, "s3://bucket/x.sqsh", fill)
    assert not dest.exists()
