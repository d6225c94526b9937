"""Where root keeps what it checked: never a place a job user's $EFABUILD_VERIFY_CACHE names that
root has not opened and checked without following a link, and never a directory root creates there.

Root runs in job users' environments (a prolog, an admin's lookup): with the variable naming a path
under a root-owned directory (/etc/nologin, whose existence stops logins), a lookup that fetched
from S3 created it and wrote trees/ in it. These tests need root (CI's user); as another user the
variable names the user's own space, created as before."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from efabuild.host import treecache, usercache
from efabuild.signing import verifycache
from tests.kits.storekit import cache_dir

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="root's rule, and chown to another user: run as root (CI is)")


def test_a_users_cache_is_under_xdg_cache_home_and_the_variable_overrides_it(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 4321)
    assert usercache.own_dir({"XDG_CACHE_HOME": "/xdg", "HOME": "/home/u"}) == Path("/xdg/efabuild/verified")
    monkeypatch.setenv("HOME", "/home/u")
    assert usercache.own_dir({}) == Path("/home/u/.cache/efabuild/verified")
    assert usercache.own_dir({usercache.CACHE_ENV: "/elsewhere", "XDG_CACHE_HOME": "/xdg"}) == Path("/elsewhere")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert usercache.own_dir({"XDG_CACHE_HOME": "/xdg"}) == usercache.ROOT_CACHE


def _settled(tmp_path: Path) -> tuple[Path, dict, dict]:
    sqsh = tmp_path / "a.sqsh"
    sqsh.write_bytes(os.urandom(4096))
    os.chmod(sqsh, 0o644)
    old = time.time() - 3600
    os.utime(sqsh, (old, old))
    paths = {"sqsh": sqsh}
    return sqsh, paths, verifycache.take_stamps(paths)


@pytest.fixture(autouse=True)
def _clock_past_the_racy_window(monkeypatch) -> None:
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + verifycache.RACY_SECONDS + 1)


def _remembers(directory: Path, tmp_path: Path) -> bool:
    sqsh, paths, stamps = _settled(tmp_path)
    environ = {usercache.CACHE_ENV: str(directory)}
    wrote = verifycache.remember(sqsh, "ab" * 32, paths, stamps, "policy", time.time(), environ=environ)
    st = os.stat(sqsh)
    kept = treecache.remember(sqsh, (st.st_dev, st.st_ino), "blake3:" + "cd" * 32, b"", environ=environ)
    return wrote and kept


def test_root_creates_no_directory_a_variable_names(tmp_path):
    etc = tmp_path / "etc"  # root's, 0755, as /etc is
    etc.mkdir(mode=0o755)
    assert not _remembers(etc / "nologin", tmp_path)
    assert not (etc / "nologin").exists()
    assert not usercache.make_dir(etc / "nologin", {usercache.CACHE_ENV: str(etc / "nologin")})


def test_root_uses_a_directory_of_its_own_the_variable_names_and_makes_trees_in_it(tmp_path):
    mine = cache_dir(tmp_path / "verified")
    assert _remembers(mine, tmp_path)
    assert (mine / "trees").is_dir() and len(list(mine.glob("*.json"))) == 1


@pytest.mark.parametrize("how", ["a link on the way", "a link at the end", "open to others on the way",
                                 "another user's on the way"])
def test_root_never_reaches_its_directory_through_a_link_or_a_directory_others_can_change(tmp_path, how):
    real = cache_dir(tmp_path / "real" / "verified")
    if how == "a link on the way":
        (tmp_path / "via").symlink_to(tmp_path / "real")
        named = tmp_path / "via" / "verified"
    elif how == "a link at the end":
        (tmp_path / "direct").symlink_to(real)
        named = tmp_path / "direct"
    elif how == "open to others on the way":
        os.chmod(tmp_path / "real", 0o777)  # not sticky: anyone may rename verified/ away and plant theirs
        named = real
    else:
        os.chown(tmp_path / "real", 65534, 65534)  # nobody's: they may swap what lies below
        named = real
    assert not _remembers(named, tmp_path)
    assert list(real.iterdir()) == []


def test_a_users_directory_is_opened_without_following_a_link_at_its_name(tmp_path):
    """open_trusted for a user's directory: a link at its name is not followed, even to a directory
    that user owns (the link could be turned elsewhere once checked)."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    os.chown(real, 4321, 4321)
    (tmp_path / "link").symlink_to(real)
    fd = usercache.open_trusted(real, 4321)
    assert fd is not None
    os.close(fd)
    assert usercache.open_trusted(tmp_path / "link", 4321) is None
