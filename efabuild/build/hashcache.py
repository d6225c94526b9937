"""A stat-keyed cache of file content hashes, so an unchanged context is never read again.

Entries are keyed by workspace-relative path and valid while (size, mtime_ns, inode) match. Like git's
index, an entry whose mtime is too close to the moment it was hashed is not trusted: the file could
still change within the filesystem's timestamp granularity without its mtime moving.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

RACY_WINDOW_NS = 2_000_000_000


class HashState:
    def __init__(self, db_path: Path | None) -> None:
        self._db_path = db_path
        self._entries: dict[str, tuple[int, int, int, str]] = {}
        self._dirty: dict[str, tuple[int, int, int, str]] = {}
        if db_path is not None and db_path.exists():
            try:
                with sqlite3.connect(db_path, timeout=30) as db:
                    for path, size, mtime_ns, inode, digest in db.execute(
                        "SELECT path, size, mtime_ns, inode, digest FROM hashes"
                    ):
                        self._entries[path] = (size, mtime_ns, inode, digest)
            except sqlite3.DatabaseError:
                self._entries = {}  # a damaged cache only costs re-hashing

    def get(self, rel: str, st: os.stat_result) -> str | None:
        entry = self._entries.get(rel)
        if entry and entry[:3] == (st.st_size, st.st_mtime_ns, st.st_ino):
            return entry[3]
        return None

    def put(self, rel: str, st: os.stat_result, digest: str) -> None:
        if time.time_ns() - st.st_mtime_ns < RACY_WINDOW_NS:
            return
        entry = (st.st_size, st.st_mtime_ns, st.st_ino, digest)
        self._entries[rel] = entry
        self._dirty[rel] = entry

    def save(self) -> None:
        if not self._dirty or self._db_path is None:
            return
        self._db_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with sqlite3.connect(self._db_path, timeout=30) as db:
                db.execute(
                    "CREATE TABLE IF NOT EXISTS hashes (path TEXT PRIMARY KEY, size INTEGER, "
                    "mtime_ns INTEGER, inode INTEGER, digest TEXT)"
                )
                db.executemany(
                    "INSERT OR REPLACE INTO hashes VALUES (?, ?, ?, ?, ?)",
                    [(path, *entry) for path, entry in self._dirty.items()],
                )
        except sqlite3.Error:
            return  # unwritable cache: the next plan hashes again, nothing else is affected
        self._dirty.clear()
