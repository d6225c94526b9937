"""gc's deletion: the facts gathered from every tier, `gc.keys_to_keep` asked, the rest removed.

Everything gc deletes is deleted here: artifacts (under their key lock, re-checking that no name
has been pointed at them meanwhile), their ref entries, leftovers of interrupted writes, and then
the S3 tier's chunks (mark and sweep, s3chunks.collect).
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple, TYPE_CHECKING

from efabuild import notices
from efabuild.errors import EfabuildError, InputError
from efabuild.store.chunked import fschunks
from efabuild.store.gc import leftovers, s3leftovers
from efabuild.store.tiers.fs import FilesystemTier
from efabuild.store.gc.collect import keys_to_keep
from efabuild.store.lock import LockBusy
from efabuild.store.names import platform_index
from efabuild.store.record import ArtifactRecord
from efabuild.store.tiers.base import S3_TIER

if TYPE_CHECKING:
    from efabuild.store.tiers.base import RemoteTier, Tier


class Removal(NamedTuple):
    tier: str
    record: ArtifactRecord


class GcReport(NamedTuple):
    keep: int
    dry_run: bool
    removals: tuple[Removal, ...]  # deleted, or to delete on a dry run
    kept: tuple[str, ...]  # keys kept
    debris: tuple[tuple[str, str], ...]  # (tier, path or URL) of interrupted writes
    busy: tuple[tuple[str, str], ...] = ()  # (tier, key) skipped: in use by a publisher or fetcher
    spared: tuple[Removal, ...] = ()  # what S3 would lose if asked (a bare store's gc without --s3)
    chunks: object | None = None  # s3chunks.ChunkGc: the S3 tier's shared chunks, swept after a grace period
    # (tier, path) of the chunks lazy mounts left on a filesystem tier for other nodes, unread for a
    # week, and stale fetch claims (store/chunked/fschunks.py): a cache, reported as one count
    expired_chunks: tuple[tuple[str, str], ...] = ()
    expired_removed: int = 0  # of those, removed (one read meanwhile is kept)


def collect_garbage(tiers: list, keep: int, pins: tuple[str, ...], *, dry_run: bool, delete_remote: bool,
                    chunk_grace: float) -> GcReport:
    """Delete all but the newest `keep` keys of every name, the current ref targets and pins.

    Decided over the union of `tiers` (S3's too when it is among them), so every tier keeps the
    same keys; S3 is deleted from only with `delete_remote` (else its removals are reported as
    spared). Objects being published or fetched right now (key lock held) are skipped.
    Leftovers of interrupted writes are removed too.
    """
    if keep < 1:
        raise InputError(f"--keep must be at least 1, not {keep}")
    held = {tier.name: tier.list() for tier in tiers}
    keep_keys = keys_to_keep(held, current_targets(tiers), keep, pins)
    keep_keys |= kept_entries_platforms(tiers, keep_keys)
    doomed = tuple(Removal(tier.name, record) for tier in tiers for record in held[tier.name]
                   if record.key not in keep_keys)
    local = {tier.name for tier in tiers if isinstance(tier, FilesystemTier)}
    deleting = [tier for tier in tiers if delete_remote or tier.name in local]
    removals = tuple(r for r in doomed if r.tier in local or delete_remote)
    spared = tuple(r for r in doomed if r not in removals)
    debris = tuple((tier.name, item) for tier in deleting for item in find_debris(tier))
    expired = tuple((tier.name, str(path)) for tier in deleting if isinstance(tier, FilesystemTier)
                    for path in fschunks.expired(tier))
    report = GcReport(keep, dry_run, removals, tuple(sorted(keep_keys)), debris, spared=spared,
                      expired_chunks=expired)
    if not dry_run:
        for tier in deleting:
            if isinstance(tier, FilesystemTier) and any(t == tier.name for t, *_ in (*removals, *debris, *expired)):
                _check_writable(tier)
        by_name = {tier.name: tier for tier in tiers}
        removed = sum(fschunks.remove(by_name[name], Path(path)) for name, path in expired)
        report = report._replace(busy=remove(tiers, removals, debris), expired_removed=removed)
    s3 = next((tier for tier in deleting if tier.name == S3_TIER), None)
    if s3 is not None:
        from efabuild.store.gc.s3chunks import collect

        # after the artifacts: the chunks only they used are marked now, swept by a later gc
        report = report._replace(chunks=collect(s3.chunks, dry_run=dry_run, grace=chunk_grace))
    return report


def current_targets(tiers: list) -> set[str]:
    """The key every name currently resolves to, in any of these tiers, and every key the platform
    index of a name's newest entry names (the key of each of its platforms)."""
    keys: set[str] = set()
    for tier in tiers:
        tips = tier.names.tips()  # one listing of a tier's names
        keys.update(key for key, _ in tips.values())
        keys.update(indexed_keys(tier, {name: index for name, (_, index) in tips.items() if index}))
    return keys


def kept_entries_platforms(tiers: list, kept: set[str]) -> set[str]:
    """Every key the platform index of a kept history entry names (an entry whose own key, its
    first platform's, gc keeps), so that a name set back to that entry finds every platform. The
    filesystem tiers hold each entry's index; one unreadable is passed over with a warning (the
    current ones are checked by current_targets)."""
    keys: set[str] = set()
    for tier in tiers:
        if not isinstance(tier, FilesystemTier):
            continue
        for name in tier.layout.ref_names():
            for entry in tier.names.read(name):
                if entry["key"] not in kept or "index" not in entry:
                    continue
                try:
                    index, _ = platform_index(tier.names, entry["index"])
                    if index is not None:
                        keys.update(index["platforms"].values())
                except EfabuildError as exc:
                    notices.warn(f"{tier.name} tier: {exc}")
    return keys


def indexed_keys(tier: Tier, indexes: dict[str, str]) -> set[str]:
    """The keys the current platform indexes of this tier (`indexes`: name -> sha256) name. An
    index that cannot be read stops gc: without it, gc cannot tell which platforms' artifacts
    are still current."""
    keys: set[str] = set()
    for name, digest in indexes.items():
        index, _ = platform_index(tier.names, digest)
        if index is None:
            raise EfabuildError(f"{tier.name} tier: {name} names platform index {digest[:12]}, which is not at "
                                f"{tier.names.index_url(digest)}: gc cannot tell what it keeps")
        keys.update(index["platforms"].values())
    return keys


def _check_writable(tier: FilesystemTier) -> None:
    """One line before anything is deleted, rather than a failure halfway."""
    try:
        read_only = bool(os.statvfs(tier.root).f_flag & os.ST_RDONLY)
    except OSError as exc:
        raise EfabuildError(f"{tier.name} tier {tier.root}: {exc.strerror}; nothing deleted") from None
    if read_only:
        raise EfabuildError(f"{tier.name} tier {tier.root}: read-only file system; nothing deleted "
                            f"(run gc where the store is mounted writable)")
    if not os.access(tier.root, os.W_OK):
        raise EfabuildError(f"{tier.name} tier {tier.root}: permission denied; nothing deleted "
                            f"(run gc as a user who may write the store)")


def find_debris(tier: Tier, now: float | None = None) -> list[str]:
    """What interrupted writers left on `tier` (store/gc/leftovers.py, s3leftovers.py)."""
    if isinstance(tier, FilesystemTier):
        return [str(path) for path in leftovers.find(tier, now)]
    return s3leftovers.find(tier, now) if tier.name == S3_TIER else []  # another object store writes whole objects


def remove_debris(tier: Tier, item: str) -> None:
    if isinstance(tier, FilesystemTier):
        leftovers.remove(tier, Path(item))
    else:
        s3leftovers.remove(tier, item)


def remove(tiers: list, removals: tuple[Removal, ...], debris: tuple) -> tuple:
    """Delete what gc decided; the (tier, key) pairs skipped because a publisher or fetcher holds them."""
    by_name = {tier.name: tier for tier in tiers}
    busy = []
    gone: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for removal in removals:
        tier, key = by_name[removal.tier], removal.record.key
        deleted = _remove_fs_object(tiers, tier, key) if isinstance(tier, FilesystemTier) \
            else _remove_remote_object(tiers, tier, key)
        if deleted is None:
            busy.append((tier.name, key))
        elif deleted:
            gone[tier.name][removal.record.name].add(key)
    for tier_name, names in gone.items():
        for name, keys in names.items():
            by_name[tier_name].names.drop(name, keys)
    for tier_name, item in debris:
        remove_debris(by_name[tier_name], item)
    return tuple(busy)


def _remove_fs_object(tiers: list, tier: FilesystemTier, key: str) -> bool | None:
    """Delete `key` from a filesystem tier: True when deleted, False when a name points at it
    again, None when its lock is held."""
    lock = tier.key_lock(key)
    try:
        lock.acquire(blocking=False)
    except LockBusy:
        return None
    try:
        # a make may have made this key current again since gc looked: ask afresh
        if key in current_targets(tiers):
            return False
        tier.delete(key)
        lock.remove()  # while held: see FileLock's inode check
        _drop_build_lock(tier, key)
        return True
    finally:
        lock.release()


def _remove_remote_object(tiers: list, tier: Tier, key: str) -> bool:
    if key in current_targets(tiers):
        return False
    tier.delete(key)
    return True


def _drop_build_lock(tier: FilesystemTier, key: str) -> None:
    """A deleted key's build lock file goes too, unless a make holds it (building it again)."""
    lock = tier.build_lock(key)
    try:
        lock.acquire(blocking=False)
    except LockBusy:
        return
    try:
        lock.remove()
    finally:
        lock.release()
