"""gc of an S3 tier's shared chunks: mark and sweep, and what each artifact costs in the bucket.

A gc run marks the chunks no index references (gc/marks/<time>.json); a later run deletes those
still unreferenced once the grace period has passed since they were marked (chunkplan.py's
arithmetic; the deletion through the trash is chunks.py), so a publish that counted on a chunk
the bucket held has the grace period to write its index.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING

import attrs

from efabuild import notices
from efabuild.chunks.cdc import ChunkIndex, is_chunk_id
from efabuild.errors import EfabuildError
from efabuild.store.chunked.s3 import CHUNKS_DIR, ChunkStore
from efabuild.store.gc.chunkplan import MAX_MARK_BYTES, Mark, Usage, chunks_to_delete, usage
from efabuild.store.gc.chunks import delete_chunks
from efabuild.store.gc.lock import sweeping_alone
from efabuild.store.layout import INDEX_SUFFIX, SQSH_SUFFIX
from efabuild.store.parallel import run_parallel

if TYPE_CHECKING:
    from efabuild.store.tiers.s3 import S3Tier

MARKS_DIR = "gc/marks"
DEFAULT_GRACE = 24 * 3600.0
MAX_MARKS = 1_000  # gc writes one a run and deletes it after the grace period: more were planted


def marks(store: ChunkStore) -> list[tuple[str, Mark]]:
    """The marks earlier gc runs left: (object, mark); one not a mark is warned of and skipped."""
    found = []
    for item in store.tier._walk(store.tier._path(MARKS_DIR) + "/", most=MAX_MARKS):
        try:
            doc = json.loads(store.tier._get_bytes(item["Key"], MAX_MARK_BYTES) or b"")
            mark = Mark(time=float(doc["time"]),
                        unreferenced=frozenset(c for c in doc["unreferenced"] if is_chunk_id(c)))
        except (ValueError, KeyError, TypeError, RecursionError, EfabuildError):
            notices.warn(f"skipping {store.tier.url(item['Key'])}: not a gc mark")
            continue
        found.append((item["Key"], mark))
    return found

def write_mark(store: ChunkStore, mark: Mark) -> None:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(mark.time))
    path = store.tier._path(MARKS_DIR, f"{stamp}-{uuid.uuid4().hex[:8]}.json")
    body = json.dumps({"time": mark.time, "unreferenced": sorted(mark.unreferenced)}).encode()
    store.tier._put_new(path, body, ContentType="application/json")


@attrs.frozen
class ChunkGc:
    deleted: int  # chunks deleted (or that would be, in a dry run)
    deleted_bytes: int  # their stored (compressed) size
    marked: int  # unreferenced chunks marked now, deleted by a later gc after the grace period
    referenced: int  # distinct chunks that some index references
    skipped_indexes: tuple[str, ...] = ()  # index objects that could not be read


def collect(store: ChunkStore, *, grace: float = DEFAULT_GRACE, dry_run: bool = True,
            now: float | None = None) -> ChunkGc:
    """One mark-and-sweep pass over the tier's chunks (see chunkplan.chunks_to_delete); one that
    deletes holds the bucket's gc lock (store/gc/lock.py), and fails with GcBusy when another does."""
    # S3's clock: marks are compared with the chunks' LastModified, set by it
    now = store.tier.server_time() if now is None else now
    if dry_run:
        return _collect(store, grace, dry_run, now)
    with sweeping_alone(store.tier):
        return _collect(store, grace, dry_run, now)


def _collect(store: ChunkStore, grace: float, dry_run: bool, now: float) -> ChunkGc:
    tier = store.tier
    stored = {}
    for item in tier._walk(tier._path(CHUNKS_DIR) + "/"):
        cid = item["Key"].rsplit("/", 1)[-1]
        if is_chunk_id(cid):
            stored[cid] = (item["LastModified"].timestamp(), item.get("Size", 0))
    referenced, skipped = store.referenced()
    found = marks(store)
    doomed = chunks_to_delete({cid: t for cid, (t, _) in stored.items()}, referenced,
                              [mark for _, mark in found], now, grace)
    unreferenced = set(stored) - referenced - doomed
    if not dry_run:
        doomed = delete_chunks(store, doomed, lambda: store.referenced()[0])
        store.delete_objects([path for path, mark in found if mark.time <= now - grace])
        if unreferenced:
            write_mark(store, Mark(time=now, unreferenced=frozenset(unreferenced)))
    return ChunkGc(deleted=len(doomed), deleted_bytes=sum(stored[c][1] for c in doomed if c in stored),
                   marked=len(unreferenced),
                   referenced=len(referenced), skipped_indexes=tuple(skipped))


def bucket_usage(tier: S3Tier, records: list | None = None) -> tuple[dict[str, tuple[object, Usage]], int, int]:
    """What each artifact costs in the bucket as stored (compressed chunks, or its whole object):
    {key: (record, usage)}; the bytes all of them take, shared chunks counted once; and the bytes
    of chunks no index references (gc's to sweep). `records`: the tier's records when the caller
    has listed them already (a unique size is only right when they are all of them)."""
    records = {record.key: record for record in (tier.list() if records is None else records)}
    chunk_sizes = {cid: item.get("Size", 0) for item in tier._walk(tier._path(CHUNKS_DIR) + "/")
                   if is_chunk_id(cid := item["Key"].rsplit("/", 1)[-1])}
    whole_sizes, indexed = {}, set()
    for item in tier._walk(tier._path("objects") + "/"):
        base = item["Key"].rsplit("/", 1)[-1]
        if base.endswith(INDEX_SUFFIX):
            indexed.add(base[: -len(INDEX_SUFFIX)])
        elif base.endswith(SQSH_SUFFIX):
            whole_sizes[base[: -len(SQSH_SUFFIX)]] = item.get("Size", 0)
    keys = sorted(records)

    def index_or_none(key: str) -> ChunkIndex | None:
        if key not in indexed:  # a whole object: the listing says so, no GET to find none
            return None
        try:
            return tier.chunk_index(key)
        except EfabuildError:
            return None

    indexes = dict(zip(keys, run_parallel(index_or_none, keys, tier.workers)))
    chunked = usage({k: i for k, i in indexes.items() if i is not None}, chunk_sizes)
    result = {key: (records[key], chunked.get(key, Usage(stored=whole_sizes.get(key, 0),
                                                         unique=whole_sizes.get(key, 0)))) for key in keys}
    referenced = {cid for index in indexes.values() if index is not None for cid in index.unique()}
    stored = sum(chunk_sizes.get(cid, 0) for cid in referenced) + sum(
        whole_sizes.get(key, 0) for key in keys if indexes[key] is None)
    return result, stored, sum(size for cid, size in chunk_sizes.items() if cid not in referenced)
