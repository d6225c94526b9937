"""Leftovers of interrupted writers on the S3 tier, found and removed by gc: a `.sqsh` without a
record (a publish killed before its commit point) and a multipart upload never completed, each
once it is older than a day by S3's own clock (a live publisher of a 25 GB file may still be at it).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from efabuild.store.layout import SQSH_SUFFIX

if TYPE_CHECKING:
    from efabuild.store.tiers.s3 import S3Tier

STALE_UPLOAD = timedelta(days=1)


def find(tier: S3Tier, now: float | None = None) -> list[str]:
    """s3:// URLs of leftovers older than a day; `now` (seconds since the epoch) overrides S3's clock."""
    now_at = datetime.fromtimestamp(tier.server_time() if now is None else now, timezone.utc)
    records, _, sqsh_objects = tier._object_keys("")
    found = []
    for path, written in sqsh_objects.items():
        base = path.rsplit("/", 1)[-1]
        if base[: -len(SQSH_SUFFIX)] not in records and now_at - written > STALE_UPLOAD:
            found.append(tier.url(path))
    for upload in tier.uploads_started_before(tier._path("objects") + "/", now_at - STALE_UPLOAD):
        found.append(tier.url(upload["Key"]) + f"?uploadId={upload['UploadId']}")
    return found


def remove(tier: S3Tier, item: str) -> None:
    """Remove one leftover find() reported."""
    path = item[len(tier.url("")):]
    if "?uploadId=" in path:
        tier.abort_upload(*path.split("?uploadId=", 1))
    else:
        tier._delete_object(path)
