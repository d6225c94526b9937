"""Putting artifacts on a router's tiers: publish an export to every tier, point a name at a
key, copy a key between tiers (`complete`, verified from a good copy), and repair or withdraw a
copy a check found damaged. Every copy goes through store/transfer.py, which verifies its source.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from efabuild import notices
from efabuild.chunks.cdc import ChunkError, ChunkIndex, chunk_file
from efabuild.errors import EfabuildError
from efabuild.host.digest import bytes_digest
from efabuild.refs import check_key
from efabuild.store.chunked import seeds
from efabuild.store.config import store_config_text
from efabuild.store.record import ArtifactRecord
from efabuild.store.router import Router
from efabuild.store.tiers.base import PUBLISHED, REPAIRED, REUSED, S3_TIER
from efabuild.store.tiers.fs import FilesystemTier
from efabuild.store.transfer import DamagedCopy, send, verified_copy

if TYPE_CHECKING:
    from efabuild.store.tiers.base import Tier
    from efabuild.store.transfer import Copy


def publish(store: Router, key: str, sqsh: str | os.PathLike[str], record: ArtifactRecord,
            manifest: bytes | None = None, *, envelope: bytes | None = None,
            index: ChunkIndex | None = None) -> dict[str, str]:
    """Store an exported .sqsh in every tier and point its name at it (a name with a platform
    index moves only when `publish_index` names the new key of each platform): {tier name:
    "published" | "reused" | "repaired"}. `record.manifest_digest` is set from `manifest`;
    `envelope` is the signed statement, stored beside it; `index` the chunk index the export
    cut it into (kept beside it; S3 sends from it what `send_ahead` did not). Interrupted, it
    leaves every tier without the object or with all of it, never a part; run again, it ends the job."""
    check_key(key)
    index = _cut(store, sqsh, record, index)
    if index is not None:  # the record names its index: a lazy mount trusts its ids from the first read
        record = record._replace(chunks=index.identity())
    if manifest is not None:
        record = record._replace(manifest_digest=bytes_digest(manifest))
    elif record.manifest_digest is not None:
        record = record._replace(manifest_digest=None)  # no manifest stored with it
    # The export goes to the local tier first (a link, no copy); the other tiers copy what the
    # local tier then holds (it may have kept an earlier identical export), which publish has
    # just written or re-hashed: trusted, not hashed again.
    first, others = store.local_tier, [t for t in store.tiers(remote=True) if t is not store.local_tier]
    results = {first.name: first.publish(key, Path(sqsh), record, manifest, show_progress=store.show_progress,
                                         envelope=envelope, index=index)}
    store.damaged.get(key, set()).discard(first.name)
    with verified_copy(key, first, first, trusted=True, index=index) as copy:
        for target in others:
            results[target.name] = _send(store, copy, target)
    # the name asked for: identical inputs in two graphs share one object under two names
    _record_names(store, record.name, key, [first, *others], record.platform)
    return results


def _cut(store: Router, sqsh: str | os.PathLike[str], record: ArtifactRecord,
         index: ChunkIndex | None) -> ChunkIndex | None:
    """The chunk index the record will name: the export's, else the S3 tier's cut of the file
    made here (its publish then reads only the chunks the bucket lacks); None when no tier stores
    chunks. An index of other bytes than the record's, or another than the record names, is refused."""
    if index is None and store.s3 is not None and store.s3.chunked:
        index = chunk_file(sqsh, chunking=store.s3.chunking)
    if index is None:
        return None
    if index.digest != record.digest:
        raise EfabuildError(f"{sqsh}: chunk index of {index.digest}, its record says {record.digest}; not published")
    if record.chunks is not None and record.chunks != index.identity():
        raise EfabuildError(f"{sqsh}: the record names chunk index {record.chunks}, not the export's; not published")
    return index


def complete(store: Router, key: str) -> dict[str, str] | None:
    """Copy `key` from a tier holding a good copy into the tiers lacking it, and repair damaged
    copies from it. None when no tier holds a good copy: then it must be exported (and
    publishing the export replaces the damaged copies). Saves a re-export when a filesystem
    tier holds it, or S3 in chunks (see `held`). Filesystem tiers are tried first: an S3
    source costs a download."""
    check_key(key)
    holders = [tier for tier in store.tiers(remote=True) if tier.has(key)]
    if not any(isinstance(tier, FilesystemTier) for tier in holders) and not (
            holders and store.chunked_on_remote(key)):
        return None  # only S3 has it, whole: exporting again costs no more than the download
    lacking = [tier for tier in store.tiers(remote=True) if tier not in holders]
    known_bad = store.damaged.get(key, set())
    for source in [t for t in holders if t.name not in known_bad]:  # a stat or S3's check found the others bad
        reached = False
        try:
            with verified_copy(key, source, store.local_tier) as copy:
                reached, damaged = True, store.damaged.get(key, set())
                results = {t.name: REUSED for t in holders if t.name not in damaged}
                for target in lacking + [t for t in holders if t.name in damaged]:
                    results[target.name] = _send(store, copy, target)
                _record_names(store, copy.record.name, key, store.tiers(remote=True),  # as publish does
                                   copy.record.platform)
                return results
        except (DamagedCopy, ChunkError) as exc:
            if not isinstance(exc, DamagedCopy) and (reached or source is not store.remote):
                raise  # a chunk failing on its way out, not in the source
            _source_failed(store, key, source.name, exc)
    return None


def _send(store: Router, copy: Copy, target: Tier) -> str:
    """One verified copy onto one tier, replacing a copy found damaged there."""
    damaged = store.damaged.get(copy.key, set())
    repairing = target.name in damaged
    if repairing and target is store.s3 and _repaired_chunks(store, copy, target):
        return REPAIRED
    if repairing and target is store.remote:
        target.delete(copy.key)  # a remote tier keeps the first object written under a key: make room
    outcome = send(copy, target, show_progress=store.show_progress)
    if target is store.s3:
        seeds.keep_beside_copies(store.fs_tiers, copy.key, target.last_index)
    if repairing:
        damaged.discard(target.name)
        outcome = REPAIRED if outcome == PUBLISHED else outcome
    return outcome


def _record_names(store: Router, name: str, key: str, tiers: list, platform: str | None = None) -> None:
    for tier in tiers:
        if platform is None or not _indexed(tier, name):  # a name with a platform index moves by its index
            tier.names.append(name, key)
        if isinstance(tier, FilesystemTier) and store.s3_settings is not None:
            tier.write_config(store_config_text(store.s3_settings))


def name(store: Router, name: str, key: str) -> None:
    """Point `name` (graph:layer) at an artifact the store already holds, in every tier; one
    platform's artifact leaves a name that has a platform index as it is (see publish)."""
    check_key(key)
    record = store.record(key)
    platform = record.platform if record is not None else None
    for tier in store.tiers(remote=True):
        if platform is None or not _indexed(tier, name):
            tier.names.append(name, key)


def send_ahead(store: Router, name: str, sqsh: str | os.PathLike[str],
               index: ChunkIndex):  # noqa: ANN201 - Future | None
    """Start sending the chunks of an exported `sqsh` S3 lacks before its record exists: S3Tier.send_ahead."""
    return None if store.s3 is None else store.s3.send_ahead(name, sqsh, index)


def withdraw_damaged(store: Router, key: str, tier: FilesystemTier, problem: str) -> str:
    """A check (make's of an ancestor) found `tier`'s copy of `key` other bytes than its record
    names: repaired from another tier's good copy where one is, else withdrawn (deleted under
    the key's lock), so that no later make builds on it and no lookup hands it out; the next
    make exports it again. What was done, for make's line."""
    store.damaged.setdefault(key, set()).add(tier.name)
    try:
        repaired = complete(store, key)
    except EfabuildError:
        repaired = None
    if repaired is not None and repaired.get(tier.name) in ("repaired", "published"):
        notices.warn(f"{problem}; repaired from a good copy")
        return "repaired from another tier"
    with tier.key_lock(key):
        tier.delete(key)
    notices.warn(f"{problem}; no tier holds a good copy: withdrawn, the next make exports it again")
    return "withdrawn"


def _source_failed(store: Router, key: str, tier: str, problem: Exception) -> None:
    """`complete` found `tier`'s copy of `key` bad as it copied it. A chunk of S3 failing its id
    (or gone) although the quick check passed: every chunk is read (a deep check) so that the
    repair stores again each one that fails, not just the first the fetch met."""
    notices.warn(f"{problem}; not copied from there")
    store.damaged.setdefault(key, set()).add(tier)
    if tier == S3_TIER and store.s3 is not None and not isinstance(problem, DamagedCopy):
        store.s3_health(key, deep=True)


def _repaired_chunks(store: Router, copy: Copy, target: Tier) -> bool:
    """Store again from `copy` the chunks S3's check found missing or damaged, when only they
    are wrong (its index and record stand); False when the artifact must be published anew."""
    from efabuild.store.chunked import health

    found = store.s3_checked.get(copy.key)
    if found is None or not found.chunks_only:
        return False
    health.repair(target, copy.key, copy.sqsh, found)
    store.damaged.get(copy.key, set()).discard(target.name)
    del store.s3_checked[copy.key]
    return True


def _indexed(tier: Tier, name: str) -> bool:
    """Whether `name`'s newest entry on `tier` names a platform index: then one platform's artifact
    published alone leaves the name as it is (an arm64 node must not get it on amd64's behalf, nor
    the other way round) until the make publishes the index naming it."""
    history = tier.names.read(name)
    return bool(history) and "index" in history[-1]
