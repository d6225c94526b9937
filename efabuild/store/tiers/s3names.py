"""The S3 tier's names (store/names.py). A name's history is one object per entry, refs/<graph>/<layer>/<time>.<key>,
so concurrent appends never overwrite each other (a filesystem tier rewrites one file under a
lock instead; both answer the same calls). An entry is empty, or holds the sha256 of the name's
platform index (platforms/<d[:2]>/<d>.json, beside its DSSE envelope <d>.dsse.json), which a
reader that knows no index ignores: it takes the key, the first platform's.
"""

from __future__ import annotations

from efabuild.errors import EfabuildError
from efabuild.refs import check_key, is_key, split_name
from efabuild.store.layout import (PLATFORM_ENVELOPE_LIMIT, PLATFORM_ENVELOPE_SUFFIX, PLATFORM_INDEX_LIMIT,
                                   PLATFORM_INDEX_SUFFIX)
from efabuild.store.record import utc_now
from efabuild.store.s3client import S3Bucket

# entries one name's history is listed to: far more than gc leaves (and 100 LIST pages), so that
# a history flooded with objects is one error, not minutes and gigabytes of listing per lookup
MAX_ENTRIES = 100_000


class S3Names:
    """Over an S3Bucket's `_walk`, `_list`, `_get_bytes`, `_put_new` and `_delete_object`."""

    def __init__(self, bucket: S3Bucket) -> None:
        self.bucket = bucket

    def _refs_prefix(self, name: str) -> str:
        graph, layer = split_name(name)
        return self.bucket._path("refs", graph, layer) + "/"

    def read(self, name: str) -> list[dict]:
        prefix = self._refs_prefix(name)
        entries, sizes = [], {}
        for item in self.bucket._walk(prefix, most=MAX_ENTRIES):
            when, _, key = item["Key"][len(prefix):].rpartition(".")
            if is_key(key) and when:
                entries.append({"key": key, "time": when})
                sizes[(when, key)] = item.get("Size") or 0
        entries.sort(key=lambda e: e["time"])
        if entries and sizes[(entries[-1]["time"], entries[-1]["key"])]:  # only the newest is asked for
            entries[-1]["index"] = self._entry_index(prefix + f"{entries[-1]['time']}.{entries[-1]['key']}")
        return entries

    def _entry_index(self, path: str) -> str:
        body = self.bucket._get_bytes(path, limit=128) or b""
        digest = body.decode("ascii", "replace").strip()
        if not is_key(digest):
            raise EfabuildError(f"{self.bucket.url(path)}: names no platform index (not 64 hex characters)")
        return digest

    def append(self, name: str, key: str, when: str | None = None, via: str | None = None,  # noqa: ARG002
                   index: str | None = None) -> bool:
        # `via` is for copies of S3's entries on the other tiers; S3 is the authority of its own
        check_key(key)
        history = self.read(name)
        if history and history[-1]["key"] == key and history[-1].get("index") == index:
            return False
        path = self._refs_prefix(name) + f"{when or utc_now()}.{key}"
        self.bucket._put_new(path, (check_key(index) + "\n").encode() if index else b"")
        return True

    def _platform_path(self, digest: str, suffix: str) -> str:
        return self.bucket._path("platforms", digest[:2], digest + suffix)

    def write_index(self, digest: str, data: bytes, envelope: bytes | None) -> None:
        """Store an index (by its sha256: written once, never replaced) and its envelope, envelope first."""
        check_key(digest)
        if envelope is not None:
            self.bucket._put_new(self._platform_path(digest, PLATFORM_ENVELOPE_SUFFIX), envelope)
        self.bucket._put_new(self._platform_path(digest, PLATFORM_INDEX_SUFFIX), data)

    def read_index(self, digest: str) -> tuple[bytes | None, bytes | None]:
        """(the index named by `digest`, its envelope), each None when absent; bounded reads."""
        check_key(digest)
        data = self.bucket._get_bytes(self._platform_path(digest, PLATFORM_INDEX_SUFFIX), limit=PLATFORM_INDEX_LIMIT)
        if data is None:
            return None, None
        return data, self.bucket._get_bytes(self._platform_path(digest, PLATFORM_ENVELOPE_SUFFIX),
                                     limit=PLATFORM_ENVELOPE_LIMIT)

    def index_url(self, digest: str) -> str:
        return self.bucket.url(self._platform_path(digest, PLATFORM_INDEX_SUFFIX))

    def tips(self) -> dict[str, tuple[str, str | None]]:
        """Every name's current key and platform index, from one listing of refs/ streamed page
        by page (not a listing per name), and a GET of each newest entry that names an index."""
        prefix = self.bucket._path("refs") + "/"
        newest: dict[str, tuple[str, str, int, str]] = {}
        for item in self.bucket._walk(prefix):
            parts = item["Key"][len(prefix):].split("/")
            when, _, key = parts[-1].rpartition(".")
            if len(parts) == 3 and is_key(key) and when:
                name = f"{parts[0]}:{parts[1]}"
                entry = (when, key, item.get("Size") or 0, item["Key"])
                newest[name] = max(newest.get(name, entry), entry)
        return {name: (key, self._entry_index(path) if size else None)
                for name, (_, key, size, path) in newest.items()}

    def drop(self, name: str, keys: set[str]) -> None:
        prefix = self._refs_prefix(name)
        entries = sorted(self.bucket._list(prefix, most=MAX_ENTRIES), key=lambda item: item["Key"])  # "<time>.<key>": oldest first
        for item in entries[:-1]:  # the newest stays: see FsNames.drop
            if item["Key"].rpartition(".")[2] in keys:
                self.bucket._delete_object(item["Key"])
