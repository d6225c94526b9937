"""A stat-keyed cache of file content hashes, so an unchanged context is never read again.

Entries are keyed by workspace-relative path and valid while (size, mtime_ns, inode) match. Like git's
index, an entry whose mtime is too close to the moment it was hashed is not trusted: the file could
still change within the filesystem's timestamp granularity without its mtime moving.

The cache is one file of NUL-separated fields (a path cannot hold NUL), read whole on every plan:
splitting it is C work, where reading as many rows from SQLite cost more than the rest of a
no-op plan's own work on a 10k-file context. It is replaced atomically; two makes saving at once
lose one's new entries, which only costs hashing those files again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

RACY_WINDOW_NS = 2_000_000_000
HEADER, END = "efabuild.hashes/v1", "end"  # a file cut short lacks its END
MAX_BYTES = 1 << 30  # about 8M entries: past that the file is not ours


class HashState:
    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._entries: dict[str, tuple[str, str]] = _load(path) if path is not None else {}
        self._dirty = False
        # for a walk of many files, which compares in its own loop: `lookup(rel)` is the cached
        # (stamp, digest), valid while `stamp(st)` of the file's lstat equals its stamp
        self.lookup = self._entries.get
        self.stamp = _stamp

    def get(self, rel: str, st: os.stat_result) -> str | None:
        entry = self._entries.get(rel)
        if entry and entry[0] == _stamp(st):
            return entry[1]
        return None

    def put(self, rel: str, st: os.stat_result, digest: str) -> None:
        if time.time_ns() - st.st_mtime_ns < RACY_WINDOW_NS or "\0" in rel:
            return
        self._entries[rel] = (_stamp(st), digest)
        self._dirty = True

    def save(self) -> None:
        if not self._dirty or self._path is None:
            return
        fields = [HEADER]
        for rel, (stamp, digest) in self._entries.items():
            fields += (rel, stamp, digest)
        fields.append(END)
        try:
            _replace(self._path, "\0".join(fields).encode("utf-8", "surrogateescape"))
        except OSError:
            return  # unwritable cache: the next plan hashes again, nothing else is affected
        self._dirty = False


def _stamp(st: os.stat_result) -> str:
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


def _load(path: Path) -> dict[str, tuple[str, str]]:
    """The cached entries; none when the file is missing, damaged, not a regular file, or not
    written by this user (a damaged cache only costs re-hashing). The local store may sit on a
    shared path: a cache another user wrote could pair a changed file's stamp with its old digest."""
    from efabuild.store.fsutil import only_writable_by, open_regular

    fd = open_regular(path)
    if fd is None:
        return {}
    try:
        st = os.fstat(fd)
        if st.st_size > MAX_BYTES or not only_writable_by(st, {os.geteuid()}):
            return {}
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError:
        return {}
    finally:
        os.close(fd)
    fields = data.decode("utf-8", "surrogateescape").split("\0")
    if fields[0] != HEADER or fields[-1] != END or len(fields) % 3 != 2:
        return {}
    del fields[-1]
    return dict(zip(fields[1::3], zip(fields[2::3], fields[3::3])))


def _replace(path: Path, data: bytes) -> None:
    from efabuild.store.owner import replace_owned  # only when saving: a no-op plan never does

    path.parent.mkdir(parents=True, exist_ok=True)
    replace_owned(path, data, 0o644)  # a make killed mid-write leaves a temp the next save removes
