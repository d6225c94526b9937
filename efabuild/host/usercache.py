"""Where this user's caches of what was checked live, and when such a directory is believed.

This user's (`$XDG_CACHE_HOME/efabuild/verified`, 0700) or root's (`/var/cache/efabuild/verified`,
readable by all, written by root only); `$EFABUILD_VERIFY_CACHE` overrides the user's own. The
verification cache (signing/verifycache.py) keeps its entries there, the trees of fetched files
(host/treecache.py) in `trees/` below it.

Root runs in job users' environments (a prolog, an admin's lookup), so for root the variable may
name a place a user chose: a directory of root's is then opened from `/` one component at a time,
never through a link, each component root's and writable by no one else, and root creates none of
the variable's directories (only `trees/` inside one that passed, and its own /var/cache one).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

CACHE_ENV = "EFABUILD_VERIFY_CACHE"
ROOT_CACHE = Path("/var/cache/efabuild/verified")


def own_dir(environ: dict[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    if environ.get(CACHE_ENV):
        return Path(environ[CACHE_ENV])
    if os.geteuid() == 0:
        return ROOT_CACHE
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "efabuild" / "verified"


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def make_dir(directory: Path, environ: dict[str, str] | None = None) -> bool:
    """Create `directory` (this user's cache directory or `trees/` in it) when missing: a user's
    with its parents (their own space), root's only where no user's variable named the place
    (/var/cache/efabuild/verified and its trees/, or trees/ in a directory root's walk trusts)."""
    if os.geteuid() != 0:
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            return False
        return True
    own = own_dir(environ)
    if directory in (ROOT_CACHE, ROOT_CACHE / "trees"):
        creatable = len(directory.parts)  # below /var/cache, root's own: made as needed
    elif directory == own / "trees":
        creatable = 1  # in the variable's directory, once it passed the walk
    else:
        creatable = 0
    fd = _walk_root_owned(directory, creatable)
    if fd is None:
        return False
    os.close(fd)
    return True


def _walk_root_owned(directory: Path, creatable: int = 0) -> int | None:
    """`directory` opened from / one component at a time without following a link, each one root's
    and writable by no one else (the last one as trusted_info says); the last `creatable` components
    made when missing. None when any step fails."""
    if not directory.is_absolute() or ".." in directory.parts:
        return None
    parts = directory.parts[1:]
    try:
        fd = os.open("/", _DIR_FLAGS)
    except OSError:
        return None
    for index, part in enumerate(parts):
        try:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if index < len(parts) - creatable:
                    raise
                os.mkdir(part, 0o755 if Path("/", *parts[:index + 1]) in (ROOT_CACHE, ROOT_CACHE.parent)
                         else 0o700, dir_fd=fd)
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
        except OSError:
            os.close(fd)
            return None
        os.close(fd)
        fd = child
        st = os.fstat(fd)
        last = index == len(parts) - 1
        # a sticky directory open to all (/tmp) is passed: no one else can rename or remove root's entry in it
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX) \
                or (last and not trusted_info(st, directory, 0)):
            os.close(fd)
            return None
    return fd


def trusted_dir(directory: Path, owner: int) -> bool:
    """Owned by `owner`; 0700 for a user's, root's shared one open for reading only."""
    try:
        st = os.lstat(directory)
    except OSError:
        return False
    return trusted_info(st, directory, owner)


def open_trusted(directory: Path, owner: int) -> int | None:
    """A descriptor of `directory`, opened without following a link there, once trusted_dir()
    holds for what was opened; None otherwise. Entries are read and written through it: a job
    user's `$EFABUILD_VERIFY_CACHE` (root's, too, when root runs in their environment) may lie
    below a link of theirs that they point elsewhere once the directory was checked; a directory
    of root's is walked to from / (_walk_root_owned)."""
    if owner == 0:
        return _walk_root_owned(Path(directory))
    try:
        fd = os.open(directory, _DIR_FLAGS)
    except OSError:
        return None
    if trusted_info(os.fstat(fd), directory, owner):
        return fd
    os.close(fd)
    return None


def pinned(dir_fd: int) -> Path:
    """A path to the very directory open as `dir_fd`."""
    return Path(f"/proc/self/fd/{dir_fd}")


def trusted_info(st: os.stat_result, directory: Path, owner: int) -> bool:
    """trusted_dir() of the directory `directory` whose stat (an open descriptor's) is `st`."""
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != owner:
        return False
    return not st.st_mode & (0o022 if directory == ROOT_CACHE else 0o077)
