"""Garbage collection of shared chunks, the decision (pure): which chunks a sweep deletes, and what
each chunked artifact costs in the bucket. The S3 chunk store carries it out (store/chunked/s3.py),
through a trash (store/gc/chunks.py)."""

from __future__ import annotations

from typing import NamedTuple

from efabuild.chunks.cdc import MiB, ChunkIndex

MAX_MARK_BYTES = 256 * MiB  # a gc mark of ~3.5 million unreferenced chunk ids

class Mark(NamedTuple):
    """Chunks that no index referenced at `time` (seconds since the epoch)."""

    time: float
    unreferenced: frozenset[str]


def chunks_to_delete(stored: dict[str, float], referenced: set[str], marks: list[Mark], now: float,
                     grace: float) -> set[str]:
    """Mark and sweep with a grace period, as restic and borg prune shared chunks.

    `stored` maps each chunk in the bucket to its last-modified time. A chunk is deleted only if
    a mark at least `grace` old already found it unreferenced, it has not been written since that
    mark, and no index references it now. How a doomed chunk is then deleted without losing one
    that a publish started meanwhile references: efabuild.store.gc.chunks.
    """
    doomed: set[str] = set()
    for mark in marks:
        if mark.time > now - grace:
            continue
        doomed |= {cid for cid in mark.unreferenced if cid in stored and stored[cid] <= mark.time}
    return doomed - referenced


class Usage(NamedTuple):
    """What one chunked artifact costs in the bucket (bytes as stored, compressed)."""

    stored: int  # its distinct chunks
    unique: int  # the chunks no other artifact references: what deleting it would free


def usage(indexes: dict[str, ChunkIndex], stored_sizes: dict[str, int]) -> dict[str, Usage]:
    """Stored and unique bytes of each artifact, from every index and each chunk's stored size."""
    users: dict[str, int] = {}
    for index in indexes.values():
        for cid in index.unique():
            users[cid] = users.get(cid, 0) + 1
    result = {}
    for key, index in indexes.items():
        ids = index.unique()
        result[key] = Usage(stored=sum(stored_sizes.get(cid, 0) for cid in ids),
                            unique=sum(stored_sizes.get(cid, 0) for cid in ids if users[cid] == 1))
    return result
