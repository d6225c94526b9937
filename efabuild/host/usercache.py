"""Where this user's caches of what was checked live, and when such a directory is believed.

This user's (`$XDG_CACHE_HOME/efabuild/verified`, 0700) or root's (`/var/cache/efabuild/verified`,
readable by all, written by root only); `$EFABUILD_VERIFY_CACHE` overrides the user's own. The
verification cache (signing/verifycache.py) keeps its entries there, the trees of fetched files
(host/treecache.py) in `trees/` below it.
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
    below a link of theirs that they point elsewhere once the directory was checked."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
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
