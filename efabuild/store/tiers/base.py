"""What every tier of the store is: one interface the directory tier and the S3 tier implement,
so `Store` (store/tiered.py), transfers and gc treat them alike.

A tier holds artifacts by key (the `.sqsh`, its record, manifest, envelope and chunk index) and
names (a history of keys per graph:layer). Nothing it reads is trusted: a record is checked against
its key, a copy against its record, before anything is handed on.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from efabuild.errors import EfabuildError
from efabuild.platforms import parse_index
from efabuild.refs import check_key, short

if TYPE_CHECKING:
    from efabuild.chunks.cdc import ChunkIndex
    from efabuild.store.record import ArtifactRecord

# what a publish did on a tier
PUBLISHED = "published"
REUSED = "reused"  # the tier had an intact copy already (another writer's, or ours)
REPAIRED = "repaired"  # a damaged copy was replaced


class Tier(abc.ABC):
    """One place artifacts are kept. `name` is the tier's role: local, shared or s3."""

    name: str

    # ---- artifacts
    @abc.abstractmethod
    def has(self, key: str) -> bool:
        """Whether a record for `key` is here (its copy is not checked)."""

    @abc.abstractmethod
    def record(self, key: str) -> ArtifactRecord | None:
        """The checked record of `key`, None when absent."""

    @abc.abstractmethod
    def manifest(self, key: str) -> bytes | None: ...

    @abc.abstractmethod
    def sidecar(self, key: str, suffix: str) -> bytes | None: ...

    @abc.abstractmethod
    def envelope(self, key: str) -> bytes | None: ...

    @abc.abstractmethod
    def write_envelope(self, key: str, envelope: bytes) -> None: ...

    @abc.abstractmethod
    def chunk_index(self, key: str) -> ChunkIndex | None: ...

    @abc.abstractmethod
    def describe(self, key: str) -> str:
        """Where `key`'s copy is, for messages: a path or an s3:// URL."""

    @abc.abstractmethod
    def list(self) -> list[ArtifactRecord]: ...

    @abc.abstractmethod
    def resolve_prefix(self, prefix: str) -> list[str]: ...

    @abc.abstractmethod
    def publish(self, key: str, sqsh: str | Path, record: ArtifactRecord, manifest: bytes | None = None, *,
                show_progress: bool | None = None, envelope: bytes | None = None,
                sidecars: Mapping[str, bytes] | None = None, index: ChunkIndex | None = None,
                locked: bool = False) -> str:
        """Store `sqsh` under `key`: PUBLISHED, REUSED or REPAIRED. `show_progress` None: the
        tier's own choice. `locked`: the caller holds the key's lock already (a cold fetch)."""

    @abc.abstractmethod
    def delete(self, key: str) -> None: ...

    # ---- names
    @abc.abstractmethod
    def read_refs(self, name: str) -> list[dict]: ...

    @abc.abstractmethod
    def append_ref(self, name: str, key: str, when: str | None = None, via: str | None = None,
                   index: str | None = None) -> bool:
        """Add `key` to `name`'s history unless it is its newest entry; `via` names the tier an
        entry was copied from (a fetch); `index`, the sha256 of the platform index the entry
        stands for (its key is that index's first platform's)."""

    @abc.abstractmethod
    def drop_ref_entries(self, name: str, keys: set[str]) -> None: ...

    @abc.abstractmethod
    def ref_tips(self) -> dict[str, tuple[str, str | None]]:
        """Every name -> (its newest entry's key, the sha256 of the platform index that entry
        names, or None), read in one pass: a co-tenant can make names by the thousand."""

    def ref_heads(self) -> dict[str, str]:
        """Every name with its newest key."""
        return {name: key for name, (key, _) in self.ref_tips().items()}

    # ---- platform indexes (a name built for several platforms: platform -> key)
    def ref_indexes(self) -> dict[str, str]:
        """Every name whose newest entry names a platform index -> its sha256."""
        return {name: index for name, (_, index) in self.ref_tips().items() if index}

    @abc.abstractmethod
    def read_platform_index(self, digest: str) -> tuple[bytes | None, bytes | None]:
        """(the index named by `digest`, its envelope), each None when absent; bounded reads."""

    @abc.abstractmethod
    def write_platform_index(self, digest: str, data: bytes, envelope: bytes | None) -> None: ...

    @abc.abstractmethod
    def platform_url(self, digest: str) -> str:
        """Where an index is, for messages."""

    def platform_index(self, digest: str) -> tuple[dict | None, bytes | None]:
        """(the index `digest` names, checked against its sha256 and fields, its envelope); (None,
        None) when this tier lacks it; EfabuildError when it is not an intact index."""
        data, envelope = self.read_platform_index(digest)
        if data is None:
            return None, None
        return parse_index(data, digest, self.platform_url(digest)), envelope

    # ---- what interrupted writers left
    @abc.abstractmethod
    def debris(self, now: float | None = None) -> list[str]:
        """Leftovers of interrupted writers, each as `remove_debris` takes it; `now` (seconds
        since the epoch) overrides the tier's clock."""

    @abc.abstractmethod
    def remove_debris(self, item: str) -> None: ...


def check_publish_input(key: str, sqsh: Path, record: ArtifactRecord) -> None:
    """A publish stores only a file that is what its record says, under the record's own key."""
    check_key(key)
    record.check()
    if record.key != key:
        raise EfabuildError(f"publish: record is for {short(record.key)}, not {short(key)}")
    try:
        size = sqsh.stat().st_size
    except FileNotFoundError:
        raise EfabuildError(f"publish: {sqsh}: no such file") from None
    if size != record.size:
        raise EfabuildError(f"publish: {sqsh} has {size} bytes, its record says {record.size}")
