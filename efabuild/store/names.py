"""Names apart from objects, as git keeps its refs apart from its object database.

A name (graph:layer) has a history of keys, newest last; an entry may name a platform index (the
sha256 of a JSON object platform -> key, for a layer built for several platforms), kept by the
names beside the entries that point at it. Each tier holds its names in a `Names` of its own (a
file per name rewritten under a lock on a filesystem, an object per entry on S3), as `tier.names`;
the objects a name points at are the tier's. Nothing read here is trusted: an entry's key and an
index's fields are checked where they are used.
"""

from __future__ import annotations

from typing import Protocol

from efabuild.platforms import parse_index


class Names(Protocol):
    """One tier's names."""

    def read(self, name: str) -> list[dict]:
        """`name`'s history, oldest first: {"key", "time"} and, where set, "via" and "index"."""

    def append(self, name: str, key: str, when: str | None = None, via: str | None = None,
               index: str | None = None) -> bool:
        """Make `key` the newest entry of `name` unless it is already (False then); `via` names the
        tier an entry was copied from (a fetch); `index`, the sha256 of the platform index the entry
        stands for (its key is that index's first platform's)."""

    def drop(self, name: str, keys: set[str]) -> None:
        """Remove the entries of `keys` from `name`'s history, its newest entry always kept."""

    def tips(self) -> dict[str, tuple[str, str | None]]:
        """Every name -> (its newest entry's key, the platform index that entry names, or None),
        read in one pass: a co-tenant can make names by the thousand."""

    def read_index(self, digest: str) -> tuple[bytes | None, bytes | None]:
        """(the platform index named by `digest`, its envelope), each None when absent; bounded reads."""

    def write_index(self, digest: str, data: bytes, envelope: bytes | None) -> None:
        """Store an index by its sha256, its envelope first: an index seen has its signature."""

    def index_url(self, digest: str) -> str:
        """Where an index is, for messages."""


def platform_index(names: Names, digest: str) -> tuple[dict | None, bytes | None]:
    """(the index `digest` names, checked against its sha256 and fields, its envelope); (None, None)
    when these names lack it; EfabuildError when it is not an intact index."""
    data, envelope = names.read_index(digest)
    if data is None:
        return None, None
    return parse_index(data, digest, names.index_url(digest)), envelope
