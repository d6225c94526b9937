"""Chunk indexes kept beside artifacts on filesystem tiers, and the seeds they make.

When the S3 tier cuts an artifact into chunks (publish or fetch), its index is kept beside each
filesystem copy as `<key>.chunks.json`; that copy then seeds later fetches of newer versions
(their shared chunks are read from it, not downloaded) without being read again. Indexes are
written by whoever may write the store: anything else found there (a link, a FIFO, junk, an
index of other bytes) only costs that artifact its use as a seed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from efabuild import notices
from efabuild.display import shown
from efabuild.errors import EfabuildError
from efabuild.refs import check_key, is_key
from efabuild.host import fsutil
from efabuild.chunks.cdc import MAX_INDEX_BYTES, ChunkIndex
from efabuild.store.layout import INDEX_SUFFIX

if TYPE_CHECKING:  # the S3 chunk store loads only when a chunked artifact is touched
    from efabuild.store.chunked.assembly import Seed

# kept index bytes one fetch reads to choose its seeds, and so what the seeds it keeps hold in
# memory (about 4 times their JSON): eight indexes of 100 GB images cut at the average chunk size
# (4 MiB), where a planted history of 1,000 keys with large indexes beside them made it read 24 GB,
# and eight planted indexes of the largest size held 600 MiB
SEED_INDEX_BUDGET = 32 * 1024 * 1024


def index_path(tier, key: str) -> Path:  # noqa: ANN001 - a FilesystemTier
    return tier.layout.object_dir(check_key(key)) / (key + INDEX_SUFFIX)


def kept_index(tier, key: str, limit: int = MAX_INDEX_BYTES) -> ChunkIndex | None:  # noqa: ANN001
    """The artifact's chunk index, if one is kept (of at most `limit` bytes) and matches the stored record."""
    where = index_path(tier, key)
    try:
        data = fsutil.read_under(tier.root, where, min(limit, MAX_INDEX_BYTES))
        index = None if data is None else ChunkIndex.from_json(data, shown(where))
        record = tier.record(key) if index is not None else None
    except EfabuildError as exc:  # UnsafeEntry, BadChunkIndex, a damaged record
        notices.warn(f"{tier.name} tier: ignoring {exc}")
        return None
    if index is None or record is None or (index.size, index.digest) != (record.size, record.digest):
        return None
    return index


def recently_indexed(tier, limit: int = 64) -> list[str]:  # noqa: ANN001
    """Keys whose chunk index is kept here, most recently written first (entries that are not
    plain files in plain directories are passed over, never followed)."""
    found = []
    for name in fsutil.fanout_dirs(tier.root):
        try:
            with fsutil.store_dir(tier.root, "objects", name) as fd:
                for entry in os.scandir(fd):
                    key = entry.name[: -len(INDEX_SUFFIX)]
                    if entry.name.endswith(INDEX_SUFFIX) and is_key(key) and entry.is_file(follow_symlinks=False):
                        found.append((entry.stat(follow_symlinks=False).st_mtime_ns, key))
        except (OSError, fsutil.UnsafeEntry):
            continue
    return [key for _, key in sorted(found, reverse=True)[:limit]]


def keep_index(tier, key: str, index: ChunkIndex) -> None:  # noqa: ANN001
    if tier.has(key):
        fsutil.atomic_write_bytes(index_path(tier, key), index.to_json(), tier.layout.tmp_dir)


def keep_beside_copies(fs_tiers: list, key: str, index: ChunkIndex | None) -> None:
    """Keep the index S3 just cut the artifact into beside each filesystem copy of those bytes."""
    if index is None:
        return
    for tier in fs_tiers:
        record = tier.record(key) if tier.has(key) else None
        if record is not None and (record.size, record.digest) == (index.size, index.digest):
            keep_index(tier, key, index)


def seeds(fs_tiers: list, name: str, limit: int = 8) -> tuple[Seed, ...]:
    """Artifacts on these filesystem tiers whose chunk indexes are kept: earlier versions of
    `name` first (they share the most), then the most recently indexed others (a parent layer's
    artifact holds most of its children's bytes). Each index is read once, and all of them at
    most SEED_INDEX_BUDGET bytes, whatever history and indexes others planted."""
    from efabuild.store.chunked.assembly import Seed

    found: dict[str, Seed] = {}
    tried: set[tuple[str, str]] = set()
    budget = SEED_INDEX_BUDGET

    def take(tier, key: str, room: int) -> None:  # noqa: ANN001
        nonlocal budget
        if len(found) >= room or budget <= 0 or (tier.name, key) in tried:
            return
        tried.add((tier.name, key))
        try:
            info = fsutil.stat_under(tier.root, index_path(tier, key))
        except EfabuildError as exc:  # UnsafeEntry: a link, FIFO or directory planted there
            notices.warn(f"{tier.name} tier: ignoring {exc}")
            return
        if info is None or info.st_size > budget:
            return
        budget -= info.st_size
        index = kept_index(tier, key, limit=info.st_size)
        if index is not None:
            found.setdefault(index.digest, Seed(tier.sqsh_path(key), index))

    for tier in fs_tiers:
        for entry in reversed(tier.names.read(name)):
            take(tier, entry["key"], limit // 2)
    for tier in fs_tiers:
        for key in recently_indexed(tier):
            take(tier, key, limit)
    return tuple(found.values())
