"""The verification cache (signing/verifycache.py) on real files: what it remembers, and when not.

The paths through `lookup --require-signature` and the importer are in tests/signing/test_sign.py.
"""

from __future__ import annotations

import time

from efabuild.signing import verifycache
from tests.kits.storekit import cache_dir
from tests.kits.storekit import key_for, swap_link_during_writes


def _remembered_only_from(tmp_path, monkeypatch, name: str, *, ahead: float, too_soon: float, late_enough: float,
                          mode: int | None = None) -> None:
    """A verification begun `too_soon` s after the file's last change is not remembered, one begun
    `late_enough` s after it is, and found again; the clock moved `ahead` s (no call sets a ctime
    back); `mode`: the file's (0o666: as another user's file in a shared tier)."""
    key = key_for(name)
    sqsh = tmp_path / f"{key}.sqsh"
    sqsh.write_bytes(b"squashfs bytes")
    if mode is not None:
        sqsh.chmod(mode)
    paths = {"sqsh": sqsh}
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + ahead)
    stamps = verifycache.take_stamps(paths)
    changed = stamps["sqsh"][4] / 1e9
    environ = {verifycache.CACHE_ENV: str(cache_dir(tmp_path / "verified"))}
    assert not verifycache.remember(sqsh, key, paths, stamps, "policy", started=changed + too_soon, environ=environ)
    assert not verifycache.is_verified(sqsh, key, stamps, "policy", environ=environ)
    assert verifycache.remember(sqsh, key, paths, stamps, "policy", started=changed + late_enough, environ=environ)
    assert verifycache.is_verified(sqsh, key, stamps, "policy", environ=environ)


def test_a_verification_begun_within_the_racy_window_of_a_change_is_not_remembered(tmp_path, monkeypatch):
    """Slip: only the clock at the end is held against the files' ctimes. A verification that began
    less than 2 s after a file last changed may have read bytes that a second write in the same
    timestamp tick (whole seconds on Lustre) replaced without moving the stamp; remembered, the
    next lookup would start those bytes unverified."""
    # the change is now older than the window: the clock is moved forward rather than waited for
    # (no call sets a ctime back)
    _remembered_only_from(tmp_path, monkeypatch, "racy", ahead=verifycache.RACY_SECONDS + 0.1, too_soon=1,
                          late_enough=2.5)


def _settled_file(tmp_path, monkeypatch, name: str):  # noqa: ANN001, ANN202
    """(key, its .sqsh, the paths, their stamps) of a file whose stamps have settled: the clock
    moved past the racy window."""
    key = key_for(name)
    sqsh = tmp_path / f"{key}.sqsh"
    sqsh.write_bytes(b"squashfs bytes")
    paths = {"sqsh": sqsh}
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + verifycache.RACY_SECONDS + 0.1)
    return key, sqsh, paths, verifycache.take_stamps(paths)


def test_a_digest_check_and_a_signature_check_of_one_file_keep_their_own_entries(tmp_path, monkeypatch):
    """Slip: both kinds under the file's one entry name. An importer with `verify = true` and
    `require_signature = true` would replace one entry with the other on every start, and so
    re-read the whole file every time."""
    key, sqsh, paths, stamps = _settled_file(tmp_path, monkeypatch, "kinds")
    environ = {verifycache.CACHE_ENV: str(cache_dir(tmp_path / "verified"))}
    started = time.time()
    assert verifycache.remember(sqsh, key, paths, stamps, "policy", started, environ=environ)
    assert verifycache.remember(sqsh, key, paths, stamps, "blake3:00", started, environ=environ, kind="digest")
    assert verifycache.is_verified(sqsh, key, stamps, "policy", environ=environ)
    assert verifycache.is_verified(sqsh, key, stamps, "blake3:00", environ=environ, kind="digest")
    # neither answers for the other
    assert not verifycache.is_verified(sqsh, key, stamps, "policy", environ=environ, kind="digest")
    assert not verifycache.is_verified(sqsh, key, stamps, "blake3:00", environ=environ)


def test_an_entry_that_is_a_fifo_is_a_miss_not_a_hang(tmp_path, monkeypatch):
    """A FIFO at an entry's name (made by hand, or left by a tool run as this user) held every job
    start of that image in open() until someone wrote to it; it is passed over and replaced."""
    import os

    key, sqsh, paths, stamps = _settled_file(tmp_path, monkeypatch, "fifo")
    cache = tmp_path / "verified"
    cache.mkdir(mode=0o700)
    os.mkfifo(cache / verifycache._entry_name(sqsh, "digest"), 0o600)
    environ = {verifycache.CACHE_ENV: str(cache)}
    assert not verifycache.is_verified(sqsh, key, stamps, "blake3:00", environ=environ, kind="digest")
    assert verifycache.remember(sqsh, key, paths, stamps, "blake3:00", time.time(), environ=environ, kind="digest")
    assert verifycache.is_verified(sqsh, key, stamps, "blake3:00", environ=environ, kind="digest")


def test_a_file_someone_else_can_write_is_remembered_only_once_no_page_of_it_can_be_dirty(tmp_path, monkeypatch):
    """Its owner, holding it mapped writable, writes a dirty page again without moving its stamp
    until the kernel writes the page back (30 s + 5 s by default): a verification remembered 2 s
    after their last change would let a job start bytes changed since, unverified."""
    _remembered_only_from(tmp_path, monkeypatch, "mapped", ahead=120, too_soon=10, late_enough=61, mode=0o666)


def test_a_directory_swapped_after_its_check_is_not_written(tmp_path, monkeypatch):
    """Slip: the directory checked by its name, then written by its name. Root verifying with a job
    user's `$EFABUILD_VERIFY_CACHE` below a link of theirs wrote its entry into their directory
    once they pointed the link there after the check."""
    real, theirs = tmp_path / "real", tmp_path / "theirs"
    real.mkdir()
    (theirs / "verified").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(real)
    key, sqsh, paths, stamps = _settled_file(tmp_path, monkeypatch, "swapped")
    environ = {verifycache.CACHE_ENV: str(link / "verified")}
    swap_link_during_writes(monkeypatch, verifycache, link, real, theirs)
    verifycache.remember(sqsh, key, paths, stamps, "policy", time.time(), environ=environ)
    verifycache.remember_content("index", "ab" * 32, "policy", environ=environ)
    assert list((theirs / "verified").iterdir()) == []


def test_a_file_changed_while_it_was_verified_is_not_remembered(tmp_path, monkeypatch):
    """The stamps taken before the read are taken again before the entry is written: a file
    replaced during the check (its stamps moved) would otherwise be remembered as verified with the
    stamps of the bytes that were read, and the next lookup would hand out the new ones unread."""
    key, sqsh, paths, stamps = _settled_file(tmp_path, monkeypatch, "changed")
    environ = {verifycache.CACHE_ENV: str(cache_dir(tmp_path / "verified"))}
    sqsh.write_bytes(b"other bytes, same size?")  # written while the verification read the old ones
    assert not verifycache.remember(sqsh, key, paths, stamps, "policy", time.time(), environ=environ)
    assert list((tmp_path / "verified").iterdir()) == []
