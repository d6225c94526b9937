"""How gc deletes chunks without losing one that a publish started meanwhile references.

gc decides from one listing of the indexes which chunks nobody uses (efabuild.chunks.cdc'
mark and sweep). A publisher that found a chunk present checks it again just after writing its
index and sends it again if it is gone. Deleting straight away would leave a gap: an index
written after gc's listing, whose publisher checked before gc's delete, would lose the chunk for
good. So gc moves the doomed chunks aside instead (`gc/trash/<id>`, a server-side copy), lists
the indexes again, moves back those an index now names, and only then empties the trash:

- an index written before the second listing gets its chunks back from the trash;
- an index written after it was written after the chunks left chunks/, so its publisher's check
  (after its index) finds them gone and sends them again.

A fetch that meets a chunk in the trash reads it there (it is verified against its id as any
chunk is). A gc killed midway leaves the trash; the next gc, once it is an hour old, moves back
what indexes name and empties the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from efabuild.errors import EfabuildError
from efabuild.chunks.cdc import is_chunk_id
from efabuild.store.chunked.s3 import TRASH_DIR, trash_object
from efabuild.store.parallel import run_parallel
from efabuild.store.s3client import _missing

if TYPE_CHECKING:
    from efabuild.store.chunked.s3 import ChunkStore
    from efabuild.store.tiers.s3 import S3Tier

ABANDONED_AFTER_S = 3600.0  # a trash entry older than this was left by a gc that was killed


def delete_chunks(store: ChunkStore, doomed: set[str], referenced_now: Callable[[], set[str]]) -> set[str]:
    """Delete the chunks `doomed` of `store` (a ChunkStore), and an abandoned trash; the ids
    deleted. `referenced_now` lists the indexes again and gives the chunks they name."""
    tier = store.tier
    left = _abandoned(store, tier.server_time() - ABANDONED_AFTER_S)  # by S3's clock, as LastModified
    moved = {cid for cid, ok in zip(sorted(doomed), run_parallel(
        lambda cid: _move(tier, store.object(cid), trash_object(tier._path, cid)), sorted(doomed), tier.workers))
        if ok}
    trashed = moved | left
    if not trashed:
        return set()
    back = sorted(trashed & referenced_now())
    run_parallel(lambda cid: _copy_back(tier, trash_object(tier._path, cid), store.object(cid)), back, tier.workers)
    store.delete_objects([trash_object(tier._path, cid) for cid in sorted(trashed)])
    return trashed - set(back)


def _abandoned(store: ChunkStore, before: float) -> set[str]:
    """The ids of the trash entries a killed gc left (dated before `before`). Only gc/trash/<id>
    is an entry; anything else there was planted and is removed as itself, never read as the
    entry of the id its name ends in (which may be a running gc's)."""
    tier = store.tier
    entries, junk = set(), []
    for item in tier._walk(tier._path(TRASH_DIR) + "/"):
        if item["LastModified"].timestamp() >= before:
            continue
        cid = item["Key"].rsplit("/", 1)[-1]
        if is_chunk_id(cid) and item["Key"] == trash_object(tier._path, cid):
            entries.add(cid)
        else:
            junk.append(item["Key"])
    if junk:
        store.delete_objects(junk)
    return entries


def _move(tier: S3Tier, source: str, target: str) -> bool:
    """Copy `source` to `target` in the bucket, then delete `source`; False when it was gone."""
    if not _copy(tier, source, target):
        return False  # deleted meanwhile by another gc
    tier._delete_object(source)
    return True


def _copy_back(tier: S3Tier, trashed: str, chunk: str) -> None:
    """Put a trashed chunk back unless chunks/ holds it again (a publisher sent it meanwhile)."""
    if tier._head(chunk) is None and not _copy(tier, trashed, chunk):
        raise EfabuildError(f"{tier.url(trashed)}: gone before gc could put it back to {tier.url(chunk)}")


def _copy(tier: S3Tier, source: str, target: str) -> bool:
    """A server-side copy of one object; False when `source` is not there."""
    try:
        tier._call(tier.url(target), "copy_object", Key=target, CopySource={"Bucket": tier.bucket, "Key": source})
    except ClientError as exc:
        if _missing(exc):
            return False
        raise tier._error(tier.url(source), exc) from None
    return True
