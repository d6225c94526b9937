"""Publishing an artifact to the chunked S3 tier: the chunks the bucket lacks, then the index.

The export cuts the `.sqsh` into chunks in the pass that digests it, so a publish starts from that
index and reads only the chunks it sends: after a one-file change, a few MiB of a file of GBs.
An index kept beside a stored artifact is another matter: on a shared tier anyone who may write
the store may have put it there, with the size and digest copied from the record. It is used only
once every chunk it lists has been checked against the file's bytes (one blake3 pass, cheaper than
cutting the file again); one that fails, or describes other bytes than the record, is ignored and
the file is cut again. Chunks that are sent are checked against their ids as they are read.

Chunks found in the bucket are checked twice, so that a gc sweep overlapping the publish costs a
re-upload, never an artifact: before anything is sent (that check decides what to send), and just
after the index is written (what gc removed meanwhile is sent again; from then on gc sees the
index and keeps them). See chunks.chunks_to_delete.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from efabuild import notices
from efabuild.errors import EfabuildError
from efabuild.refs import short
from efabuild.chunks.cdc import BadChunkIndex, ChunkIndex, chunk_file, mismatch
from efabuild.store.chunked.send import ChunkSender, send_from_file
from efabuild.store.layout import INDEX_SUFFIX
from efabuild.store.progress import Progress
from efabuild.store.chunked.s3 import ChunkStore, Transfer

if TYPE_CHECKING:
    from efabuild.store.record import ArtifactRecord


def upload(store: ChunkStore, index: ChunkIndex, source: Path, ids: set[str],
           progress: Callable[[int], None] | None = None) -> Transfer:
    """Send the chunks `ids` of `source` (described by `index`), compressed, each created only if
    absent (a chunk found there already counts as reused). Memory: one chunk per worker."""
    sender = ChunkSender(store, store.tier.workers, progress)
    send_from_file(store, index, source, ids, sender)
    return transfer_of(index, sender)


@attrs.frozen
class Ahead:
    """What a send ahead of a publish did for one file's index (see send_ahead)."""

    found: dict[str, str]  # {id: ETag} of the chunks its check found in the bucket
    sent: Transfer  # what it sent (created, with their ETags; refused)

    def covered(self) -> set[str]:
        return set(self.found) | set(self.sent.created) | set(dict(self.sent.refused))


def send_ahead(store: ChunkStore, index: ChunkIndex, sqsh: Path,
               likely_present: Callable[[], set[str]]) -> Future:
    """Send the chunks of `sqsh` (cut into `index` by the export) that the bucket lacks before
    the file is published, e.g. while its sha256 and signature are computed: `publish` of the
    same index then takes what this found and sent (waiting for it to end), and neither checks
    nor sends those again. Chunks are named by their bytes, so one sent early is harmless before
    an index names it; gc's grace keeps it meanwhile, and the publish's check after its index
    covers a sweep in between. Returns at once: the sends run on a thread of their own, and the
    Future gives the Ahead they leave (or their failure, after which the publish does it all);
    a second call for the same index gives the first's."""
    slot, first = store.ahead.hold(index)
    if first:
        threading.Thread(target=_send_into, args=(slot, store, index, sqsh, likely_present), name="send-ahead").start()
    return slot


def _send_into(slot: Future, store: ChunkStore, index: ChunkIndex, sqsh: Path,
               likely_present: Callable[[], set[str]]) -> None:
    try:
        found, sent = _send_lacking(store, index, sqsh, set(index.unique()), likely_present(), cut=False, what=None)
    except BaseException as exc:  # noqa: BLE001 - the Future hands it to whoever asks
        slot.set_exception(exc)
        return
    slot.set_result(Ahead(found, sent))


def publish(store: ChunkStore, key: str, sqsh: Path, record: ArtifactRecord, *, index: ChunkIndex | None,
            kept: bytes | None, likely_present: set[str], chunking: tuple[int, int, int],
            show: bool, meanwhile: Callable[[], None] = lambda: None) -> tuple[ChunkIndex, Transfer]:
    """Upload the chunks of `sqsh` the bucket lacks, then its index (the record, written by the
    tier after this, commits it): (the index, what was sent). `index` was computed by this
    process from these bytes (the export's); `kept` is an index read from a store (its JSON),
    checked before use. `likely_present` are chunk ids seen in other artifacts on this node.
    What a send ahead (send_ahead) found and sent for the same index is not done again.
    `meanwhile` runs while the chunks are checked the second time (the tier's other objects)."""
    index = _matching(index, record, chunking) or _checked(kept, record, chunking, sqsh, key)
    cut = ahead = None
    if index is None:
        index, cut = _chunk_and_send(store, key, sqsh, record, likely_present, chunking, show)
        if index.digest != record.digest:  # never publish bytes under a record they do not match
            raise EfabuildError(f"{sqsh}: digest {index.digest}, its record says {record.digest}; not published")
    else:
        ahead = store.ahead.take(index)
    unique = index.unique()
    index_path = store.tier.index_object(key)
    found, rest = _send_lacking(store, index, sqsh, set(unique) - (ahead.covered() if ahead else set()),
                                likely_present, cut=cut is not None,
                                what=f"upload {short(key)} to {store.tier.url(index_path)}" if show else None)
    sent = transfer_of(index, *[t for t in (cut, ahead and ahead.sent) if t], rest)
    etags = _checked_etags(store, index, sqsh, {**(ahead.found if ahead else {}), **found}, sent)
    store.tier._put_new(index_path, stored_index_json(index, etags), ContentType="application/json")
    # the second: gc may have swept a chunk found present before the index referenced it
    with ThreadPoolExecutor(1, thread_name_prefix="second-check") as pool:
        second = pool.submit(store.missing, set(unique) - sent.created)
        meanwhile()
        gone = second.result()
    if gone:
        upload(store, index, sqsh, gone)
    return index, sent


def _send_lacking(store: ChunkStore, index: ChunkIndex, sqsh: Path, ids: set[str], likely_present: set[str], *,
                  cut: bool, what: str | None) -> tuple[dict[str, str], Transfer]:
    """The first check of the chunks `ids` of the file and the sends it decides: ({id: ETag} of
    those found in the bucket, what was sent). Only the ids this node has seen in other artifacts
    are looked up; the others are most likely new, and a conditional PUT of one that exists is
    refused harmlessly (`cut`: the cut sent those already). `what` names a progress bar."""
    known = ids & likely_present
    found = store.etags(known)
    to_send = (known - set(found)) | (set() if cut else ids - known)
    unique = index.unique()
    with Progress(what or "", sum(unique[c] for c in to_send), enabled=what is not None and bool(to_send)) as bar:
        sent = upload(store, index, sqsh, to_send, progress=bar.update)
    return found, sent


def stored_index_json(index: ChunkIndex, etags: dict[str, str]) -> bytes:
    """The index as the bucket keeps it: with the ETag each chunk object had when it was written
    (or checked), so that a later look at the chunks (a warm make, audit, verify) sees one
    rewritten since without reading it (see store/chunked/health.py)."""
    doc = json.loads(index.to_json())
    doc["etags"] = {cid: etags[cid] for cid in sorted(etags) if cid in index.unique()}
    return json.dumps(doc, separators=(",", ":")).encode()


def _checked_etags(store: ChunkStore, index: ChunkIndex, sqsh: Path, found: dict[str, str],
                   sent: Transfer) -> dict[str, str]:
    """{id: ETag} of the file's chunks in the bucket, after a chunk found there with other bytes
    than this upload's (its ETag is not our body's MD5) was read and, failing its id, replaced
    by the file's bytes: a co-tenant may plant junk under an id a future artifact needs. The
    ETags the first check (`found`) and the PUTs that created chunks gave are kept as they are:
    only the others (those a PUT found there already) are looked up."""
    unique = index.unique()
    etags = {**found, **dict(sent.etags)}
    unknown = set(unique) - set(etags)
    if unknown:
        etags.update(store.etags(unknown))
    for cid, md5 in sorted(dict(sent.refused).items()):
        if etags.get(cid, md5) == md5:
            continue
        problem = store.problem(cid, unique[cid])  # another compressor's bytes are as good
        if problem is not None:
            notices.warn(f"{problem}; storing it again")
            etags[cid] = store.replace(cid, read_chunk(index, sqsh, cid))
    return etags


def read_chunk(index: ChunkIndex, sqsh: Path, cid: str) -> bytes:
    """The bytes of chunk `cid` as `sqsh` holds them (the caller checks them against the id)."""
    offset, length = next((offset, length) for c, offset, length in index.spans() if c == cid)
    fd = os.open(sqsh, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


def _matching(index: ChunkIndex | None, record: ArtifactRecord, chunking: tuple[int, int, int]) -> ChunkIndex | None:
    """`index` when it describes the record's bytes cut with this tier's chunk sizes."""
    if index is None or (index.size, index.digest, index.chunking) != (record.size, record.digest, chunking):
        return None
    return index


def _checked(data: bytes | None, record: ArtifactRecord, chunking: tuple[int, int, int], sqsh: Path,
             key: str) -> ChunkIndex | None:
    """A stored index, once the file's bytes are found to be the chunks it lists."""
    try:
        kept = None if data is None else ChunkIndex.from_json(data, f"{key}{INDEX_SUFFIX}")
    except BadChunkIndex:
        return None
    if _matching(kept, record, chunking) is None:
        return None
    problem = mismatch(kept, sqsh)
    if problem is not None:
        notices.warn(f"s3 tier: ignoring the chunk index kept with {short(key)} ({problem}); cutting the file again")
        return None
    return kept


def _chunk_and_send(store: ChunkStore, key: str, sqsh: Path, record: ArtifactRecord, skip: set[str],
                    chunking: tuple[int, int, int], show: bool) -> tuple[ChunkIndex, ChunkSender]:
    """Cut `sqsh` into chunks and send each new one while the rest is still being cut, so a cold
    publish takes about the longer of the two rather than their sum; chunks in `skip` (seen in
    other artifacts) are left for the caller to check first."""
    sender = ChunkSender(store, store.tier.workers)
    url = store.tier.url(store.tier.index_object(key))
    with Progress(f"chunk and upload {short(key)} to {url}", record.size, enabled=show) as bar:
        try:
            index = chunk_file(sqsh, chunking=chunking, progress=bar.update,
                               on_chunk=lambda cid, data: cid in skip or sender.submit(cid, lambda: data))
        finally:
            sender.close()
    sender.check()
    return index, sender


def transfer_of(index: ChunkIndex, *senders: ChunkSender | Transfer) -> Transfer:
    """What `senders` sent for the file of `index`: every other distinct chunk was reused."""
    created = frozenset().union(*(s.created for s in senders))
    refused = tuple(item for s in senders for item in dict(s.refused).items())
    etags = tuple(item for s in senders for item in dict(s.etags).items())
    sent = sum(s.bytes for s in senders)
    wire = sum(s.wire if isinstance(s, ChunkSender) else s.wire_bytes for s in senders)
    return Transfer(chunks=len(created), bytes=sent, wire_bytes=wire, reused=len(index.unique()) - len(created),
                    reused_bytes=index.size_unique() - sent, created=created,
                    refused=refused, etags=etags)
