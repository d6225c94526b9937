"""Leftovers of interrupted writers on a filesystem tier, found and removed by gc and make.

A temp file in tmp/ is named after its writer (host, pid, start time: fsutil.temp_name), and a
build context or a `make --check` work directory after its make (owner.owned_name); each is stale
once that process is gone from this host, or, a temp file of another host, after a day. A `make
--check` directory of an efabuild from before that naming (`check-<layer>-XXXXXXXX`) names no
owner: it is stale when it is the invoking user's, nothing in it has changed for a day and no
process of this host holds it open. A record or sidecar without its .sqsh is an interrupted
publish, a leftover only while nobody holds its key's lock. Nothing is followed or deleted through
a link. (Scratch directories outside the store: efabuild.host.scratch.)
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING

from efabuild import notices
from efabuild.errors import EfabuildError
from efabuild.refs import is_key
from efabuild.host import fsutil
from efabuild.display import shown
from efabuild.host.fsutil import UnsafeEntry
from efabuild.store.layout import PLANTED_PREFIX, RECORD_SUFFIX, SQSH_SUFFIX
from efabuild.store.lock import LockBusy
from efabuild.host.owner import Owner, owner_of, this_host
from efabuild.store.transfer import SIDECARS

if TYPE_CHECKING:
    from efabuild.store.tiers.fs import FilesystemTier

# Temp files of writers on other hosts are only judged by age.
STALE_TEMP_SECONDS = 24 * 3600
# directories a make writes into the local tier's tmp/, named by their owner: build contexts
# (efabuild.make.context) and make --check's rebuilt .sqsh (efabuild.make.check)
CONTEXT_PREFIX = "context"
CHECK_PREFIX = "check"
OWNED_DIR_PREFIXES = (CONTEXT_PREFIX, CHECK_PREFIX, PLANTED_PREFIX)
# make --check's work directory before it named its owner: tempfile.mkdtemp(prefix="check-<layer>-")
_UNOWNED_CHECK_DIR = re.compile(r"check-.+-[a-z0-9_]{8}")


def find(tier: FilesystemTier, now: float | None = None) -> list[Path]:
    """Leftovers of interrupted writers: stale temp files, build contexts and check directories
    of makes that are gone, and records without a .sqsh.

    A temp file is stale when its writer (named in the file name) is dead on this host, or
    when it is older than a day (writer on another host). A record without a .sqsh counts only
    while nobody holds its key's lock.
    """
    now = time.time() if now is None else now
    found: list[Path] = []
    try:
        with fsutil.store_dir(tier.root, "tmp") as fd:
            temps = [(name, os.stat(name, dir_fd=fd, follow_symlinks=False)) for name in os.listdir(fd)
                     if fsutil.parse_temp_owner(name) or _dir_owner(name) or _UNOWNED_CHECK_DIR.fullmatch(name)]
    except (FileNotFoundError, NotADirectoryError):
        temps = []
    except UnsafeEntry as exc:
        notices.warn(f"{tier.name} tier: skipping {exc}")
        temps = []
    for name, info in temps:
        dir_owner = _dir_owner(name)
        if dir_owner is not None:  # a make's directory: removed once the make is gone
            if stat.S_ISDIR(info.st_mode) and dir_owner.gone():
                found.append(tier.layout.tmp_dir / name)
            continue
        if _UNOWNED_CHECK_DIR.fullmatch(name):
            if _stale_unowned_dir(tier, name, now):
                found.append(tier.layout.tmp_dir / name)
            continue
        if not stat.S_ISREG(info.st_mode):
            continue  # not ours (other tools keep their own temp dirs here)
        owner = fsutil.parse_temp_owner(name)
        if owner.host == this_host():
            if owner.gone():
                found.append(tier.layout.tmp_dir / name)
        elif now - info.st_mtime > STALE_TEMP_SECONDS:
            found.append(tier.layout.tmp_dir / name)
    for key in _uncommitted_keys(tier):
        lock = tier.key_lock(key)
        try:
            lock.acquire(blocking=False)
        except LockBusy as exc:
            if isinstance(exc, UnsafeEntry):
                notices.warn(f"{tier.name} tier: skipping {exc}")
            continue
        except OSError:  # a store this user may only read (e.g. mounted read-only): not judged
            continue
        try:
            if not _exists(tier, tier.sqsh_path(key)):
                leftovers = [tier.layout.record_path(key)] + [tier.layout.object_dir(key) / (key + suffix)
                                                              for suffix in SIDECARS]
                found.extend(path for path in leftovers if _exists(tier, path))
        finally:
            lock.release()
    return found


def _dir_owner(name: str) -> Owner | None:
    return next(filter(None, (owner_of(name, prefix) for prefix in OWNED_DIR_PREFIXES)), None)


def _stale_unowned_dir(tier: FilesystemTier, name: str, now: float) -> bool:
    """An owner-less directory in tmp/: a real directory of the invoking user, nothing in it (links
    not followed) changed for STALE_TEMP_SECONDS, and no process of this host working in it."""
    try:
        with fsutil.store_dir(tier.root, "tmp", name) as fd:  # a link is refused, not followed
            info = os.fstat(fd)
            times = [info.st_mtime] + [os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mtime
                                       for entry in os.listdir(fd)]
    except (OSError, UnsafeEntry):
        return False  # gone meanwhile, or not a directory: not judged
    path = Path(os.path.realpath(tier.layout.tmp_dir)) / name
    return info.st_uid == os.geteuid() and now - max(times) > STALE_TEMP_SECONDS and not _held(path)


def _held(path: Path) -> bool:
    """Whether a process of this host has its working directory or an open file in `path`."""
    inside = str(path) + os.sep
    try:
        pids = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return False  # no /proc: the age alone decides
    for pid in pids:
        try:
            links = [os.readlink(f"/proc/{pid}/cwd")]
            links += [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue  # gone, or another user's (then not writing into this user's directory)
        if any(link == str(path) or link.startswith(inside) for link in links):
            return True
    return False


def _exists(tier: FilesystemTier, path: Path) -> bool:
    """Whether a directory entry of that name exists below the root (a link counts)."""
    try:
        with fsutil.store_dir(tier.root, *fsutil.relative_parts(tier.root, path.parent)) as fd:
            os.stat(path.name, dir_fd=fd, follow_symlinks=False)
        return True
    except (FileNotFoundError, NotADirectoryError):
        return False

def remove(tier: FilesystemTier, path: Path) -> None:
    """Remove one item find() reported, re-checking under the key's lock for records."""
    path = Path(path)
    if path.parent == tier.layout.tmp_dir and fsutil.parse_temp_owner(path.name):
        with fsutil.store_dir(tier.root, "tmp") as fd, contextlib.suppress(FileNotFoundError):
            os.unlink(path.name, dir_fd=fd)
        return
    owned, unowned = _dir_owner(path.name), _UNOWNED_CHECK_DIR.fullmatch(path.name)
    if path.parent == tier.layout.tmp_dir and (owned or unowned):
        if owned is None and not _stale_unowned_dir(tier, path.name, time.time()):
            return  # changed or opened since find() looked
        with fsutil.store_dir(tier.root, "tmp") as fd:
            shutil.rmtree(path.name, dir_fd=fd, ignore_errors=True)  # a link is not followed
        return
    key = path.name.split(".", 1)[0]
    if not is_key(key) or path.parent != tier.layout.object_dir(key):
        raise EfabuildError(f"{shown(path)}: not a leftover of this store")
    lock = tier.key_lock(key)
    try:
        lock.acquire(blocking=False)
    except LockBusy:
        return  # a publisher is back at work on it (or its lock file was planted)
    try:
        if not _exists(tier, tier.sqsh_path(key)):
            with fsutil.store_dir(tier.root, "objects", key[:2]) as fd, \
                    contextlib.suppress(FileNotFoundError):
                os.unlink(path.name, dir_fd=fd)
    finally:
        lock.release()

def _uncommitted_keys(tier: FilesystemTier) -> list[str]:
    keys: set[str] = set()
    for fanout in fsutil.fanout_dirs(tier.root):  # an unsafe objects/: keys() has said why
        try:
            with fsutil.store_dir(tier.root, "objects", fanout) as fd:
                names = set(os.listdir(fd))
        except (FileNotFoundError, NotADirectoryError, UnsafeEntry):
            continue
        for name in names:
            for suffix in (*sorted(SIDECARS, key=len, reverse=True), RECORD_SUFFIX):  # longer suffixes first
                if name.endswith(suffix):
                    key = name[: -len(suffix)]
                    if is_key(key) and key[:2] == fanout and key + SQSH_SUFFIX not in names:
                        keys.add(key)
                    break
    return sorted(keys)
