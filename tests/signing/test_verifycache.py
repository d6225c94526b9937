"""The verification cache (signing/verifycache.py) on real files: what it remembers, and when not.

The paths through `lookup --require-signature` and the importer are in tests/signing/test_sign.py.
"""

from __future__ import annotations

import time

from efabuild.signing import verifycache
from tests.kits.storekit import key_for


def test_a_verification_begun_within_the_racy_window_of_a_change_is_not_remembered(tmp_path, monkeypatch):
    """Slip: only the clock at the end is held against the files' ctimes. A verification that began
    less than 2 s after a file last changed may have read bytes that a second write in the same
    timestamp tick (whole seconds on Lustre) replaced without moving the stamp; remembered, the
    next lookup would start those bytes unverified."""
    key = key_for("racy")
    sqsh = tmp_path / f"{key}.sqsh"
    sqsh.write_bytes(b"squashfs bytes")
    paths = {"sqsh": sqsh}
    # the change is now older than the window: the clock is moved forward rather than waited for
    # (no call sets a ctime back)
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + verifycache.RACY_SECONDS + 0.1)
    stamps = verifycache.take_stamps(paths)
    changed = stamps["sqsh"][4] / 1e9
    environ = {verifycache.CACHE_ENV: str(tmp_path / "verified")}
    assert not verifycache.remember(sqsh, key, paths, stamps, "policy", started=changed + 1, environ=environ)
    assert not verifycache.is_verified(sqsh, key, stamps, "policy", environ=environ)
    # begun well after the change: remembered, and found again
    assert verifycache.remember(sqsh, key, paths, stamps, "policy", started=changed + 2.5, environ=environ)
    assert verifycache.is_verified(sqsh, key, stamps, "policy", environ=environ)


def test_a_digest_check_and_a_signature_check_of_one_file_keep_their_own_entries(tmp_path, monkeypatch):
    """Slip: both kinds under the file's one entry name. An importer with `verify = true` and
    `require_signature = true` would replace one entry with the other on every start, and so
    re-read the whole file every time."""
    key = key_for("kinds")
    sqsh = tmp_path / f"{key}.sqsh"
    sqsh.write_bytes(b"squashfs bytes")
    paths = {"sqsh": sqsh}
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + verifycache.RACY_SECONDS + 0.1)
    stamps = verifycache.take_stamps(paths)
    environ = {verifycache.CACHE_ENV: str(tmp_path / "verified")}
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

    key = key_for("fifo")
    sqsh = tmp_path / f"{key}.sqsh"
    sqsh.write_bytes(b"squashfs bytes")
    paths = {"sqsh": sqsh}
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + verifycache.RACY_SECONDS + 0.1)
    stamps = verifycache.take_stamps(paths)
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
    import os

    key = key_for("mapped")
    sqsh = tmp_path / f"{key}.sqsh"
    sqsh.write_bytes(b"squashfs bytes")
    sqsh.chmod(0o666)  # or another user's file in a shared tier
    paths = {"sqsh": sqsh}
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 120)
    stamps = verifycache.take_stamps(paths)
    changed = stamps["sqsh"][4] / 1e9
    environ = {verifycache.CACHE_ENV: str(tmp_path / "verified")}
    assert not verifycache.remember(sqsh, key, paths, stamps, "policy", started=changed + 10, environ=environ)
    assert not verifycache.is_verified(sqsh, key, stamps, "policy", environ=environ)
    assert verifycache.remember(sqsh, key, paths, stamps, "policy", started=changed + 61, environ=environ)
    assert verifycache.is_verified(sqsh, key, stamps, "policy", environ=environ)
