"""A filesystem tier's names (store/names.py): one JSON file per name under refs/, rewritten
atomically under the name's lock, and the platform indexes under platforms/, written atomically,
read bounded and never through a link."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from efabuild import notices
from efabuild.errors import EfabuildError
from efabuild.host import fsutil
from efabuild.refs import check_key
from efabuild.store.layout import Layout
from efabuild.store.lock import FileLock, note_waiting
from efabuild.store.record import utc_now

MAX_REF_HISTORY = 1000


class FsNames:
    def __init__(self, root: Path, layout: Layout, tier: str) -> None:
        self.root, self.layout, self.tier = root, layout, tier

    def read(self, name: str) -> list[dict]:
        """History of `name`; [] with a warning when its ref file is damaged or planted, so that
        one bad file does not stop gc for every other name."""
        try:
            return self.layout.read_refs(name)
        except EfabuildError as exc:
            notices.warn(f"{self.tier} tier: skipping {exc}")
            return []

    def append(self, name: str, key: str, when: str | None = None, via: str | None = None,
               index: str | None = None) -> bool:
        """`via="s3"` marks an entry copied from the S3 tier's names by a fetch: S3 stays the
        authority for that name."""
        check_key(key)
        with FileLock(self.layout.ref_lock_path(name), on_wait=note_waiting, root=self.root):
            history = self.layout.read_refs(name)
            if history and history[-1]["key"] == key and history[-1].get("index") == index:
                return False
            entry = {"key": key, "time": when or utc_now()}
            if via:
                entry["via"] = via
            if index:
                entry["index"] = check_key(index)
            history.append(entry)
            self._write(name, history[-MAX_REF_HISTORY:])
            return True

    def drop(self, name: str, keys: set[str]) -> None:
        with FileLock(self.layout.ref_lock_path(name), on_wait=note_waiting, root=self.root):
            history = self.layout.read_refs(name)
            # the newest entry stays even when its object went: a make that made it current while
            # gc ran must leave the name failing loudly, never quietly back on an older image
            kept = [entry for entry in history[:-1] if entry["key"] not in keys] + history[-1:]
            if kept == history:
                return
            if kept:
                self._write(name, kept)
            else:
                path = self.layout.ref_path(name)
                with fsutil.store_dir(self.root, "refs", path.parent.name) as fd, \
                        contextlib.suppress(FileNotFoundError):
                    os.unlink(path.name, dir_fd=fd)

    def tips(self) -> dict[str, tuple[str, str | None]]:
        return {name: (history[-1]["key"], history[-1].get("index"))
                for name in self.layout.ref_names() if (history := self.read(name))}

    def _write(self, name: str, history: list[dict]) -> None:
        data = json.dumps({"name": name, "history": history}, indent=1, sort_keys=True) + "\n"
        fsutil.atomic_write_bytes(self.layout.ref_path(name), data.encode(), self.layout.tmp_dir)

    def read_index(self, digest: str) -> tuple[bytes | None, bytes | None]:
        return self.layout.read_platform_index(digest)

    def index_url(self, digest: str) -> str:
        return str(self.layout.platform_index_path(digest))

    def write_index(self, digest: str, data: bytes, envelope: bytes | None) -> None:
        check_key(digest)
        if envelope is not None:
            fsutil.atomic_write_bytes(self.layout.platform_envelope_path(digest), envelope, self.layout.tmp_dir)
        fsutil.atomic_write_bytes(self.layout.platform_index_path(digest), data, self.layout.tmp_dir)
