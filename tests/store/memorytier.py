"""A remote tier held in memory, written only against the store's interfaces (`RemoteTier` in
efabuild/store/tiers/base.py, `Names` in efabuild/store/names.py): if a store made of it works,
a new object store (another cloud's, a cluster's own) needs nothing else.

It keeps what a tier is given, as bytes, and trusts none of it on the way out: a download checks
the bytes against the record through `fetch_into`, as S3's does.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path

from efabuild.chunks.cdc import ChunkIndex
from efabuild.errors import EfabuildError
from efabuild.refs import check_key, short
from efabuild.store.layout import ENVELOPE_SUFFIX, INDEX_SUFFIX, MANIFEST_SUFFIX
from efabuild.store.record import ArtifactRecord
from efabuild.store.tiers.base import PUBLISHED, REUSED, RemoteTier, check_publish_input, check_rewritable
from efabuild.store.transfer import fetch_into


class MemoryNames:
    """`Names` over two dicts: a name's history, and platform indexes by their sha256."""

    def __init__(self, tier: str) -> None:
        self.tier = tier
        self.histories: dict[str, list[dict]] = {}
        self.indexes: dict[str, tuple[bytes, bytes | None]] = {}

    def read(self, name: str) -> list[dict]:
        return [dict(entry) for entry in self.histories.get(name, [])]

    def append(self, name: str, key: str, when: str | None = None, via: str | None = None,
               index: str | None = None) -> bool:
        history = self.histories.setdefault(name, [])
        if history and history[-1]["key"] == key and history[-1].get("index") == index:
            return False
        entry = {"key": check_key(key), "time": when or "2026-01-01T00:00:00.000000Z"}
        entry.update({field: value for field, value in (("via", via), ("index", index)) if value})
        history.append(entry)
        return True

    def drop(self, name: str, keys: set[str]) -> None:
        history = self.histories.get(name, [])
        self.histories[name] = [e for e in history[:-1] if e["key"] not in keys] + history[-1:]

    def tips(self) -> dict[str, tuple[str, str | None]]:
        return {name: (h[-1]["key"], h[-1].get("index")) for name, h in self.histories.items() if h}

    def read_index(self, digest: str) -> tuple[bytes | None, bytes | None]:
        return self.indexes.get(digest, (None, None))

    def write_index(self, digest: str, data: bytes, envelope: bytes | None) -> None:
        self.indexes[digest] = (data, envelope)

    def index_url(self, digest: str) -> str:
        return f"memory://{self.tier}/indexes/{digest}"


class MemoryTier(RemoteTier):
    """Objects by key: {key: {suffix: bytes}}, the record under ".json" (the commit point)."""

    def __init__(self, name: str = "memory") -> None:
        self.name = name
        self.names = MemoryNames(name)
        self.objects: dict[str, dict[str, bytes]] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"memory://{self.name}"

    def has(self, key: str) -> bool:
        return ".json" in self.objects.get(check_key(key), {})

    def record(self, key: str) -> ArtifactRecord | None:
        data = self.objects.get(check_key(key), {}).get(".json")
        return None if data is None else ArtifactRecord.from_json(data, self.describe(key))

    def sidecar(self, key: str, suffix: str) -> bytes | None:
        return self.objects.get(check_key(key), {}).get(suffix) if self.has(key) else None

    def write_sidecar(self, key: str, suffix: str, data: bytes) -> None:
        check_rewritable(suffix)
        if not self.has(key):
            raise EfabuildError(f"{self.name} tier has no artifact {short(key)}")
        self.objects[key][suffix] = bytes(data)

    def describe(self, key: str) -> str:
        return f"{self!r}/{key}.sqsh"

    def list(self, prefix: str = "") -> list[ArtifactRecord]:
        keys = sorted(key for key in list(self.objects) if key.startswith(prefix) and self.has(key))
        return [record for key in keys if (record := self.record(key)) is not None]

    def publish(self, key: str, sqsh: str | os.PathLike[str], record: ArtifactRecord, manifest: bytes | None = None,
                *, show_progress: bool | None = None, envelope: bytes | None = None,
                sidecars: Mapping[str, bytes] | None = None, index: ChunkIndex | None = None,
                locked: bool = False) -> str:
        sqsh = Path(sqsh)
        check_publish_input(key, sqsh, record)
        if manifest is not None and record.manifest_digest is None:
            raise EfabuildError("publish: a manifest was given but the record has no manifest_digest")
        with self._lock:  # one writer commits a key; the next finds it and keeps what is there
            if self.has(key):
                return REUSED
            stored = {".sqsh": sqsh.read_bytes(), **{s: d for s, d in (sidecars or {}).items() if s != INDEX_SUFFIX}}
            stored.update({s: d for s, d in ((MANIFEST_SUFFIX, manifest), (ENVELOPE_SUFFIX, envelope)) if d is not None})
            stored[".json"] = record.to_json()  # last: the commit
            self.objects[key] = stored
        return PUBLISHED

    def delete(self, key: str) -> None:
        self.objects.pop(check_key(key), None)

    def download(self, key: str, dest: Path, record: ArtifactRecord, *, show_progress: bool | None = None,
                 seeds: tuple = ()) -> ChunkIndex | None:
        data = self.objects.get(check_key(key), {}).get(".sqsh")
        if data is None:
            raise EfabuildError(f"{self.describe(key)}: gone")

        def fill(fd: int) -> None:
            view = memoryview(data)[: record.size]  # no more than the record claims is written
            while view:
                view = view[os.write(fd, view):]

        self.last_fetched = fetch_into(self.name, dest, record, self.describe(key), fill)
        self.last_tree = None
        return None
