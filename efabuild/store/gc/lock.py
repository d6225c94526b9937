"""One gc at a time per bucket: the lock object `gc/lock` under the tier's prefix.

Two gcs sweeping the same chunks at once could lose one (one gc's delete of a chunk, the second
half of its move to the trash, landing after the other put it back for an index written
meanwhile). gc takes the lock by creating the object (IfNoneMatch='*'), and gives it up by
deleting it while it is still its own. A gc killed meanwhile leaves the lock; once it is older
than STALE_AFTER_S by S3's own clock, the next gc takes it over by a conditional overwrite of that
very version (IfMatch on its ETag), so two gcs finding the same stale lock cannot both win.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from efabuild.errors import EfabuildError
from efabuild.store.s3client import _missing, already_exists, response_time

if TYPE_CHECKING:
    from efabuild.store.tiers.s3 import S3Tier

LOCK_OBJECT = "gc/lock"
STALE_AFTER_S = 24 * 3600.0  # no gc of a bucket runs this long; a lock this old was left by a killed one


class GcBusy(EfabuildError):
    """Another gc holds the bucket's lock."""


@contextlib.contextmanager
def sweeping_alone(tier: S3Tier) -> Iterator[None]:
    """Hold the bucket's gc lock for the block; GcBusy when another gc holds it."""
    path = tier._path(LOCK_OBJECT)
    etag = _take(tier, path)
    try:
        yield
    finally:
        with contextlib.suppress(EfabuildError):
            head = tier._head(path)
            if head is not None and head.get("ETag") == etag:  # still ours: not taken over as stale
                tier._delete_object(path)


def _take(tier: S3Tier, path: str) -> str:
    body = json.dumps({"host": os.uname().nodename, "pid": os.getpid(), "time": time.time()}).encode()
    for _ in range(3):  # the lock may vanish between our put and our look at it
        etag = _put(tier, path, body, IfNoneMatch="*")
        if etag is not None:
            return etag
        head = tier._head(path)
        if head is None:
            continue
        since = head["LastModified"]
        # both times by S3's clock (the HEAD's own Date): a gc host a day ahead took a live lock
        if since.timestamp() > response_time(head) - STALE_AFTER_S:
            raise GcBusy(f"{tier.url(path)}: another gc of this bucket's chunks holds it since "
                         f"{since:%Y-%m-%d %H:%M:%S} UTC; if none runs, delete that object")
        etag = _put(tier, path, body, IfMatch=head["ETag"])  # take over that stale version only
        if etag is not None:
            return etag
    raise GcBusy(f"{tier.url(path)}: another gc of this bucket's chunks took it first")


def _put(tier: S3Tier, path: str, body: bytes, **condition: str) -> str | None:
    """The new version's ETag, or None when the condition failed."""
    try:
        return tier._call(tier.url(path), "put_object", Key=path, Body=body,
                          ContentType="application/json", **condition)["ETag"]
    except ClientError as exc:
        if already_exists(exc) or _missing(exc):  # IfMatch on a version someone deleted meanwhile
            return None
        raise tier._error(tier.url(path), exc) from None
