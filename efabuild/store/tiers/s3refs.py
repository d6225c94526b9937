"""A name's history on the S3 tier: one empty object per entry, refs/<graph>/<layer>/<time>.<key>,
so concurrent appends never overwrite each other (a filesystem tier rewrites one file under a
lock instead; both answer the same calls).
"""

from __future__ import annotations

from efabuild.refs import check_key, is_key, split_name
from efabuild.store.record import utc_now

# entries one name's history is listed to: far more than gc leaves (and 100 LIST pages), so that
# a history flooded with objects is one error, not minutes and gigabytes of listing per lookup
MAX_ENTRIES = 100_000


class S3Refs:
    """The ref calls of the S3 tier, over an S3Bucket's `_list`, `_put_new`, `_delete_object`."""

    def _refs_prefix(self, name: str) -> str:
        graph, layer = split_name(name)
        return self._path("refs", graph, layer) + "/"

    def read_refs(self, name: str) -> list[dict]:
        prefix = self._refs_prefix(name)
        entries = []
        for item in self._walk(prefix, most=MAX_ENTRIES):
            when, _, key = item["Key"][len(prefix):].rpartition(".")
            if is_key(key) and when:
                entries.append({"key": key, "time": when})
        return sorted(entries, key=lambda e: e["time"])

    def append_ref(self, name: str, key: str, when: str | None = None, via: str | None = None) -> bool:  # noqa: ARG002
        # `via` is for copies of S3's entries on the other tiers; S3 is the authority of its own
        check_key(key)
        history = self.read_refs(name)
        if history and history[-1]["key"] == key:
            return False
        path = self._refs_prefix(name) + f"{when or utc_now()}.{key}"
        self._put_new(path, b"")
        return True

    def ref_heads(self) -> dict[str, str]:
        """Every name's current key (its newest entry, as read_refs orders them), from one
        listing of refs/ streamed page by page: not a listing per name."""
        prefix = self._path("refs") + "/"
        newest: dict[str, tuple[str, str]] = {}
        for item in self._walk(prefix):
            parts = item["Key"][len(prefix):].split("/")
            when, _, key = parts[-1].rpartition(".")
            if len(parts) == 3 and is_key(key) and when:
                name = f"{parts[0]}:{parts[1]}"
                newest[name] = max(newest.get(name, (when, key)), (when, key))
        return {name: key for name, (_, key) in newest.items()}

    def drop_ref_entries(self, name: str, keys: set[str]) -> None:
        prefix = self._refs_prefix(name)
        entries = sorted(self._list(prefix, most=MAX_ENTRIES), key=lambda item: item["Key"])  # "<time>.<key>": oldest first
        for item in entries[:-1]:  # the newest stays: see FilesystemTier.drop_ref_entries
            if item["Key"].rpartition(".")[2] in keys:
                self._delete_object(item["Key"])
