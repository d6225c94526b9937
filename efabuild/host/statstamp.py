"""The one rule by which a file's stat stands in for its bytes: every cache that skips reading an
unchanged file (the context hash cache, the verification cache) uses it.

A stamp is (device, inode, size, mtime_ns, ctime_ns) from lstat. Any write, truncate, chmod, chown,
utime or rename moves ctime to the current time, and no system call lets a non-root user set it
back, so an unchanged stamp means unchanged bytes. As with git's racy index, a stamp is trusted
only once it has settled: a file changed within RACY_WINDOW_NS of the moment it was read could
change again within the filesystem's timestamp granularity without its stamp moving (Lustre keeps
whole seconds); a stamp of a file someone else can write, once MAPPED_WINDOW_NS has passed.
"""

from __future__ import annotations

import os
import time

RACY_WINDOW_NS = 2_000_000_000
# Writes through a shared writable mapping are the exception to "any write moves ctime": only the
# first write to a clean page does, and a page stays dirty (writable again unseen) until written
# back, within vm.dirty_expire_centisecs + vm.dirty_writeback_centisecs (30 s + 5 s by default).
# A file that someone else can write is trusted by its stamp only once it has settled this long.
MAPPED_WINDOW_NS = 60_000_000_000
_LIMIT = 1 << 64  # stamps are stored as unsigned 64-bit integers
clock_ns = time.time_ns  # what `now` is; tests move it rather than wait out the window


def stamp(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def matches(cached: tuple, st: os.stat_result) -> bool:
    """Whether `cached`'s first five fields are `st`'s stamp (compared without making a tuple:
    a context walk does this for every file)."""
    return (cached[3] == st.st_mtime_ns and cached[2] == st.st_size and cached[1] == st.st_ino
            and cached[4] == st.st_ctime_ns and cached[0] == st.st_dev)


def settled(values: tuple[int, ...] | list[int], now_ns: int | None = None, window_ns: int = RACY_WINDOW_NS) -> bool:
    """Whether a stamp may be cached: its times lie at least `window_ns` before `now_ns` (default
    the clock now), and every field fits 64 bits (a file dated before 1970 is never cached)."""
    if not all(0 <= n < _LIMIT for n in values):
        return False
    now_ns = clock_ns() if now_ns is None else now_ns
    return now_ns - max(values[3], values[4]) >= window_ns


def others_may_write(st: os.stat_result) -> bool:
    """Whether anyone but this user could change (or truncate) the file: not theirs, or open to
    the group or others."""
    return st.st_uid != os.geteuid() or bool(st.st_mode & 0o022)
