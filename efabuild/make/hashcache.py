"""A stat-keyed cache of file content hashes, so an unchanged context is never read again.

Entries are keyed by workspace-relative path and valid while the file's stat stamp (device, inode,
size, mtime, ctime) is the one it was hashed with, by the rule every cache of efabuild keeps
(host/statstamp.py): a stamp too close to the moment it was hashed is not kept.

The cache is one file read whole on every plan and laid out so that reading it is C work (10k
rows read one by one from SQLite cost more than the rest of a no-op plan): the stamps as one array
of unsigned 64-bit integers (the five stamp fields of each entry), then the paths and digests as
NUL-separated text (a path cannot hold NUL). A walk compares a file's lstat with the cached
integers as they are: formatting them as text for every file, as the cache's first layout needed,
cost more than reading the whole file. It is replaced atomically; two makes saving at once lose
one's new entries, which only costs hashing those files again.
"""

from __future__ import annotations

import array
import os
import sys
from pathlib import Path

from efabuild.errors import EfabuildError
from efabuild.host import statstamp
from efabuild.host.fsutil import only_writable_by, open_regular, replace_owned

# a cache of another layout or byte order (a store shared with other machines) reads as none
HEADER = f"efabuild.hashes/v3 {sys.byteorder}\n".encode()
END = b"\0end"  # a file cut short lacks its END
MAX_BYTES = 1 << 30  # about 8M entries: past that the file is not ours
_COUNT = 8  # bytes of the entry count after the header
_FIELDS = 5  # the stamp's integers per entry


class HashState:
    def __init__(self, path: Path | None, below: Path | None = None) -> None:
        """`below`: the store's root, trusted as it is; between it and `path` no link is followed
        when saving (by default `path`'s own directory is trusted)."""
        self._path = path
        self._below = below
        self._entries: dict[str, tuple[int, int, int, int, int, str]] = _load(path) if path is not None else {}
        self._dirty = False
        # for a walk of many files, which compares in its own loop: `lookup(rel)` is the cached
        # (*stamp, digest), valid while statstamp.matches(entry, the file's lstat)
        self.lookup = self._entries.get

    def get(self, rel: str, st: os.stat_result) -> str | None:
        entry = self._entries.get(rel)
        if entry is not None and statstamp.matches(entry, st):
            return entry[_FIELDS]
        return None

    def put(self, rel: str, st: os.stat_result, digest: str) -> None:
        stamp = statstamp.stamp(st)
        if "\0" in rel or not statstamp.settled(stamp):
            return
        self._entries[rel] = (*stamp, digest)
        self._dirty = True

    def save(self) -> None:
        if not self._dirty or self._path is None:
            return
        stamps = array.array("Q")
        text = []
        for rel, entry in self._entries.items():
            stamps.extend(entry[:_FIELDS])
            text += (rel, entry[_FIELDS])
        data = b"".join((HEADER, len(self._entries).to_bytes(_COUNT, "little"), stamps.tobytes(),
                         "\0".join(text).encode("utf-8", "surrogateescape"), END))
        try:
            _replace(self._path, data, self._below)
        except (OSError, EfabuildError):  # unwritable, or a link in the way: the next plan hashes again
            return
        self._dirty = False


def _load(path: Path) -> dict[str, tuple[int, int, int, int, int, str]]:
    """The cached entries; none when the file is missing, damaged, not a regular file, or not
    written by this user (a damaged cache only costs re-hashing). The local store may sit on a
    shared path: a cache another user wrote could pair a changed file's stamp with its old digest."""
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
    return _parse(data)


def _parse(data: bytes) -> dict[str, tuple[int, int, int, int, int, str]]:
    if not data.startswith(HEADER) or not data.endswith(END) or len(data) < len(HEADER) + _COUNT + len(END):
        return {}
    count = int.from_bytes(data[len(HEADER):len(HEADER) + _COUNT], "little")
    stamps_end = len(HEADER) + _COUNT + 8 * _FIELDS * count
    if stamps_end > len(data) - len(END):
        return {}
    stamps = array.array("Q")
    stamps.frombytes(data[len(HEADER) + _COUNT:stamps_end])
    text = data[stamps_end:-len(END)].decode("utf-8", "surrogateescape")
    fields = text.split("\0") if count else []
    if len(fields) != 2 * count:
        return {}
    numbers = stamps.tolist()
    return dict(zip(fields[0::2], zip(*(numbers[i::_FIELDS] for i in range(_FIELDS)), fields[1::2])))


def _replace(path: Path, data: bytes, below: Path | None) -> None:
    # made as needed; a make killed mid-write leaves a temp the next save removes
    replace_owned(path, data, 0o644, below=below or path.parent)
