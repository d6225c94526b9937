"""What every tier of the store is: one interface the directory tier and the S3 tier implement,
so `Store` (store/tiered.py), transfers and gc treat them alike.

A tier holds artifacts by key (the `.sqsh`, its record, manifest, envelope and chunk index), and
as `names` (store/names.py) a history of keys per graph:layer. Nothing it reads is trusted: a record is checked against
its key, a copy against its record, before anything is handed on.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from efabuild.errors import EfabuildError
from efabuild.refs import check_key, short
from efabuild.store.layout import ENVELOPE_SUFFIX

if TYPE_CHECKING:
    from efabuild.chunks.cdc import ChunkIndex
    from efabuild.store.chunked.assembly import Seed
    from efabuild.store.names import Names
    from efabuild.store.record import ArtifactRecord

S3_TIER = "s3"  # the S3 tier's role; a filesystem tier's is its config's ("local", "shared")

# what a publish did on a tier
PUBLISHED = "published"
REUSED = "reused"  # the tier had an intact copy already (another writer's, or ours)
REPAIRED = "repaired"  # a damaged copy was replaced


class Tier(abc.ABC):
    """One place artifacts are kept, as objects by key: `name` is the tier's role (local, shared or
    s3). Eight methods; what each tier adds (a path, a lock, a download) is its own."""

    name: str
    names: Names  # its graph:layer histories and platform indexes, apart from its objects

    # ---- artifacts
    @abc.abstractmethod
    def has(self, key: str) -> bool:
        """Whether a record for `key` is here (its copy is not checked)."""

    @abc.abstractmethod
    def record(self, key: str) -> ArtifactRecord | None:
        """The checked record of `key`, None when absent."""

    @abc.abstractmethod
    def sidecar(self, key: str, suffix: str) -> bytes | None:
        """A file stored beside a committed `.sqsh` by its suffix (MANIFEST_SUFFIX, ENVELOPE_SUFFIX,
        INDEX_SUFFIX), read bounded by what that kind may hold; None when absent."""

    @abc.abstractmethod
    def write_sidecar(self, key: str, suffix: str, data: bytes) -> None:
        """Replace a sidecar of a committed object whole, seen whole or not at all. Only the signed
        statement changes after a publish (a signature added): any other suffix is a ValueError,
        the manifest and the chunk index being bound to the record."""

    @abc.abstractmethod
    def describe(self, key: str) -> str:
        """Where `key`'s copy is, for messages: a path or an s3:// URL."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[ArtifactRecord]:
        """The records of the committed artifacts whose key starts with `prefix`, by key; one whose
        record cannot be read is skipped with a warning."""

    @abc.abstractmethod
    def publish(self, key: str, sqsh: str | Path, record: ArtifactRecord, manifest: bytes | None = None, *,
                show_progress: bool | None = None, envelope: bytes | None = None,
                sidecars: Mapping[str, bytes] | None = None, index: ChunkIndex | None = None,
                locked: bool = False) -> str:
        """Store `sqsh` under `key`: PUBLISHED, REUSED or REPAIRED. `show_progress` None: the
        tier's own choice. `locked`: the caller holds the key's lock already (a cold fetch)."""

    @abc.abstractmethod
    def delete(self, key: str) -> None: ...


class RemoteTier(Tier):
    """A tier the store fetches from (S3; or any other object store): read by downloading an
    artifact into a new file on a filesystem tier, never by path (a job opens a path)."""

    # what this node holds that can seed a chunked download of a name (store/chunked/seeds.py)
    seed_provider: Callable[[str], tuple[Seed, ...]] | None = None
    last_fetched: tuple[int, int] | None = None  # (device, inode) of the file the last download checked
    last_tree: tuple[str, bytes] | None = None  # its digest and units' values, where the download hashed them

    @abc.abstractmethod
    def download(self, key: str, dest: Path, record: ArtifactRecord, *, show_progress: bool | None = None,
                 seeds: tuple[Seed, ...] = ()) -> ChunkIndex | None:
        """Write `key`'s bytes into the new file `dest` (transfer.fetch_into), checked against
        `record` before anyone may see it (else removed); the chunk index it was assembled by,
        if any."""


def check_rewritable(suffix: str) -> None:
    if suffix != ENVELOPE_SUFFIX:
        raise ValueError(f"a stored {suffix} is never rewritten: only the signed statement is")


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
