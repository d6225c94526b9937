"""Remembers successful full verifications, so a job start that finds one pays a few stats.

An entry binds a verification to the stat stamps (device, inode, size, mtime_ns, ctime_ns) of
the `.sqsh`, its record and its signed statement, and to the trust policy's digest. Any write,
truncate, chmod, chown, utime or rename changes one of them — the kernel sets ctime to the current
time on each, and no system call lets a non-root user set it back — so an unchanged stamp means
unchanged bytes, and a changed one forces a full verification. As with git's racy index, nothing
is cached while a file's ctime is within 2 s of the verification (Lustre keeps whole seconds, so
a write in the same second could leave the stamp as it was), or within 60 s for a file someone
else can write: its owner, holding it mapped writable, can write a dirty page again unseen until
the kernel writes it back (statstamp.MAPPED_WINDOW_NS).

Entries live per user (`$XDG_CACHE_HOME/efabuild/verified`, 0700) or root's
(`/var/cache/efabuild/verified`, readable by all, written by root only); `$EFABUILD_VERIFY_CACHE`
overrides the user's own directory. An entry is believed only in a directory owned by the
reader (or root's), owned by the same user and writable by nobody else: one planted by another
user is ignored. Stdlib only, no hashing: this is the fast path of `lookup --require-signature`
and of the Pyxis importer's `verify = true` (kind "digest": the `.sqsh` against its record's blake3).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from pathlib import Path

from efabuild.host import statstamp
from efabuild.host.fsutil import replace_owned
from efabuild.host.usercache import CACHE_ENV, ROOT_CACHE, own_dir  # noqa: F401 - CACHE_ENV: callers set it here
from efabuild.host.usercache import make_dir, open_trusted, pinned

RACY_SECONDS = statstamp.RACY_WINDOW_NS / 1e9
FORMAT = "efabuild.verified/v1"
MAX_ENTRY_BYTES = 64 << 10


def stamp(path: Path) -> list[int] | None:
    """[dev, ino, size, mtime_ns, ctime_ns] of a file (not following a final symlink); None if absent."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return list(statstamp.stamp(st))


def take_stamps(paths: dict[str, Path]) -> dict[str, list[int] | None]:
    return {name: stamp(path) for name, path in paths.items()}


def _entry_name(sqsh: Path, kind: str = "") -> str:
    # a digest check and a signature check of one file are entries of their own: neither evicts the other
    name = os.fsencode(os.path.abspath(sqsh)) + (b"\0" + kind.encode() if kind else b"")
    return hashlib.sha256(name).hexdigest()[:40] + ".json"


def _read_entry(directory: Path, owner: int, name: str) -> dict | None:
    dir_fd = open_trusted(directory, owner)
    if dir_fd is None:
        return None
    try:
        # a FIFO at the name is not waited on: the fstat below passes it over
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    finally:
        os.close(dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != owner or st.st_mode & 0o022:
            return None  # planted by someone else, or writable by someone else
        data = os.read(fd, MAX_ENTRY_BYTES)
    finally:
        os.close(fd)
    try:
        entry = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return entry if isinstance(entry, dict) and entry.get("format") == FORMAT else None


def _expected(key: str, stamps: dict[str, list[int] | None], policy_digest: str) -> dict:
    return {"format": FORMAT, "key": key, "stamps": stamps, "policy": policy_digest}


def is_verified(sqsh: Path, key: str, stamps: dict[str, list[int] | None], policy_digest: str,
                environ: dict[str, str] | None = None, *, kind: str = "") -> bool:
    """True when this user's (or root's) cache holds a verification of exactly these stamps.

    `kind` names what was verified when it is not the signature ("digest": the record's blake3);
    `policy_digest` is then what the check was against (the digest itself)."""
    if any(value is None for value in stamps.values()):
        return False
    expected = _expected(key, stamps, policy_digest)
    name = _entry_name(sqsh, kind)
    mine = own_dir(environ)
    candidates = [(mine, os.geteuid())]
    if mine != ROOT_CACHE and os.geteuid() != 0:
        candidates.append((ROOT_CACHE, 0))
    for directory, owner in candidates:
        entry = _read_entry(directory, owner, name)
        if entry is not None and {k: entry.get(k) for k in expected} == expected:
            return True
    return False


def _others_may_write(paths: dict[str, Path]) -> bool:
    try:
        return any(statstamp.others_may_write(os.lstat(path)) for path in paths.values())
    except OSError:
        return True


def remember(sqsh: Path, key: str, paths: dict[str, Path], stamps: dict[str, list[int] | None],
             policy_digest: str, started: float, environ: dict[str, str] | None = None, *,
             kind: str = "") -> bool:
    """Record a full verification that began at `started` (time.time()); False when not cached.

    `stamps` were taken before the verification read the files; they are taken again here, and
    nothing is cached if a file changed meanwhile or its ctime is too recent to be trusted."""
    if any(value is None for value in stamps.values()):
        return False
    if take_stamps(paths) != stamps:
        return False  # changed while it was being verified
    # settled when the verification began and now (a clock set back meanwhile must not pass); a
    # file someone else can write, longer: they may hold it mapped writable (statstamp)
    now_ns = int(min(started, time.time()) * 1e9)
    window = statstamp.MAPPED_WINDOW_NS if _others_may_write(paths) else statstamp.RACY_WINDOW_NS
    if not all(statstamp.settled(value, now_ns, window) for value in stamps.values()):
        return False
    directory = own_dir(environ)
    owner = os.geteuid()
    if not make_dir(directory, environ):
        return False
    # someone else's directory, or open to others: never written into
    data = json.dumps(_expected(key, stamps, policy_digest), sort_keys=True).encode()
    return _write(directory, owner, _entry_name(sqsh, kind), data)


def content_verified(name: str, content: str, policy_digest: str, environ: dict[str, str] | None = None) -> bool:
    """True when this user's (or root's) cache holds a verification of bytes whose sha256 is
    `content` (a platform index and its envelope, read and hashed by the caller: small, so no
    stamps are needed) under `policy_digest`."""
    expected = _expected(content, {}, policy_digest)
    mine = own_dir(environ)
    candidates = [(mine, os.geteuid())] + ([(ROOT_CACHE, 0)] if mine != ROOT_CACHE and os.geteuid() != 0 else [])
    for directory, owner in candidates:
        entry = _read_entry(directory, owner, _entry_name(Path(name), "content"))
        if entry is not None and {k: entry.get(k) for k in expected} == expected:
            return True
    return False


def remember_content(name: str, content: str, policy_digest: str, environ: dict[str, str] | None = None) -> bool:
    """Record a verification of the bytes whose sha256 is `content` (see content_verified)."""
    directory, owner = own_dir(environ), os.geteuid()
    if not make_dir(directory, environ):
        return False
    data = json.dumps(_expected(content, {}, policy_digest), sort_keys=True).encode()
    return _write(directory, owner, _entry_name(Path(name), "content"), data)


def _write(directory: Path, owner: int, name: str, data: bytes) -> bool:
    """The entry `name` written through the descriptor of the directory found trusted, never by its
    name again (usercache.open_trusted); False when it is not."""
    dir_fd = open_trusted(directory, owner)
    if dir_fd is None:
        return False
    try:
        replace_owned(pinned(dir_fd) / name, data, 0o644 if directory == ROOT_CACHE else 0o600, temp_prefix=".entry")
    except OSError:
        return False
    finally:
        os.close(dir_fd)
    return True
