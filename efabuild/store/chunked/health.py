"""Whether the S3 tier can deliver an artifact: its chunk index against its record, its chunks in
the bucket (or its whole object), and the repair of the chunks found missing or damaged.

Anyone who may write the bucket can delete a chunk, or overwrite it with other bytes (or plant
junk under an id a future artifact will need): no fetch then delivers the artifact, since every
chunk is checked against its id, but nothing else would say so. The quick check (audit, verify,
lookup --verify, and a warm make) costs a GET of the index and one look at every distinct chunk
(a LIST per first hex digit of their ids, or a HEAD each when few, as a publish looks): a chunk
that is missing, or whose ETag is not the one the index noted when it was written, is read and
checked against its id (one GET each). The deep check (`--deep`) reads every chunk, checks each
against its id and hashes the file they make. A whole-object artifact: its size and the digest
stored with it by a HEAD, its bytes with `--deep`.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import blake3

from efabuild.errors import EfabuildError
from efabuild.host.digest import PREFIX
from efabuild.refs import is_key, short
from efabuild.store.chunked.publish import read_chunk, stored_index_json
from efabuild.chunks.cdc import MAX_INDEX_BYTES, BadChunkIndex, ChunkIndex, is_chunk_id
from efabuild.store.layout import INDEX_SUFFIX
from efabuild.store.parallel import run_parallel
from efabuild.store.chunked.s3 import CHUNKS_DIR
from efabuild.store.transfer import DamagedCopy

READ_PIECE = 8 * 1024 * 1024  # a whole object is hashed a piece at a time, never held
WINDOW_BYTES = 128 * 1024 * 1024  # chunk bytes a deep check holds at once (at most `workers` chunks)


class S3Health(NamedTuple):
    key: str
    size: int  # bytes the index (or the whole object) describes; -1 when neither is there
    digest: str | None  # the digest it claims
    problems: tuple[str, ...] = ()  # one line each, naming the artifact and the chunk or object
    index: ChunkIndex | None = None  # the chunk index, when it matches the record
    damaged: frozenset[str] = frozenset()  # ids of its chunks missing or failing their id

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def chunks_only(self) -> bool:
        """Only chunks are wrong: storing them again from a good copy repairs the artifact."""
        return self.index is not None and bool(self.damaged)


class S3Damaged(DamagedCopy):
    """The S3 tier cannot deliver an artifact: what S3Health found, one problem after another."""

    def __init__(self, health: S3Health) -> None:
        self.tier = "s3"
        self.health = health
        EfabuildError.__init__(self, "; ".join(health.problems))


def check(tier, key: str, record, *, deep: bool = False) -> S3Health:  # noqa: ANN001 - S3Tier, ArtifactRecord
    """How `tier` (an S3Tier) holds the artifact `key` of `record`: S3Health, ok or naming what is
    wrong. Never reads a chunk it does not check; holds a bounded window of them (`_windows`)."""
    what = f"s3 tier: {short(key)} ({record.name})"
    path = tier.index_object(key)
    try:
        data = tier._get_bytes(path, MAX_INDEX_BYTES, BadChunkIndex)
        index = None if data is None else ChunkIndex.from_json(data, tier.url(path))
    except BadChunkIndex as exc:
        if tier._head(tier.sqsh_object(key)) is None:
            return S3Health(key, -1, None, (f"{what}: {exc}",))
        data = index = None  # the fetch falls back to the whole object, and so does this check
    if index is None:
        return _check_whole(tier, key, record, what, deep)
    if (index.size, index.digest) != (record.size, record.digest):
        return S3Health(key, index.size, index.digest, (
            f"{what}: {tier.url(path)} describes {index.size} bytes {index.digest}, its record says "
            f"{record.size} bytes {record.digest}",))
    unique = index.unique()
    if deep:
        bad, whole = _read_all(tier, index)
    else:
        noted = _noted_etags(data)
        etags = tier.chunks.etags(unique)
        suspects = sorted(cid for cid in unique if cid not in etags or noted.get(cid, etags[cid]) != etags[cid])
        found = run_parallel(lambda cid: tier.chunks.problem(cid, unique[cid]), suspects, tier.workers)
        bad, whole = {cid: problem for cid, problem in zip(suspects, found) if problem is not None}, None
    problems = [f"{what}: chunk {cid}: {bad[cid]}" for cid in sorted(bad)]
    if not bad and whole is not None and whole != record.digest:
        problems.append(f"{what}: the chunks {tier.url(path)} lists make {whole}, its record says {record.digest}")
        return S3Health(key, index.size, index.digest, tuple(problems))
    return S3Health(key, index.size, index.digest, tuple(problems), index, frozenset(bad))


def _noted_etags(data: bytes | None) -> dict[str, str]:
    """The ETags the publisher noted in the index (none in an index written before it did)."""
    try:
        noted = json.loads(data or b"{}").get("etags")
    except (ValueError, AttributeError, RecursionError):
        return {}
    if not isinstance(noted, dict):
        return {}
    return {cid: etag for cid, etag in noted.items() if is_chunk_id(cid) and isinstance(etag, str)}


def _read_all(tier, index: ChunkIndex) -> tuple[dict[str, str], str | None]:  # noqa: ANN001 - S3Tier
    """Every chunk read in file order, a window at a time (`_windows`), and checked against its id
    through the fetch's own check: ({id: problem} of those that fail, the digest of the file they
    make, or None when one failed)."""
    whole = blake3.blake3(max_threads=blake3.blake3.AUTO)
    bad: dict[str, str] = {}
    window = max(1, tier.workers)

    def read(item: tuple[str, int]) -> bytes | None:
        cid, length = item
        try:
            return tier.chunks.fetch(cid, length)[0]
        except EfabuildError as exc:  # a ChunkError, or S3 failing on that object
            bad[cid] = str(exc)
            return None

    for group in _windows(index.chunks, window):
        for raw in run_parallel(read, group, window):
            if raw is not None and not bad:
                whole.update(raw)
    return bad, None if bad else PREFIX + whole.hexdigest()


def _windows(chunks: tuple[tuple[str, int], ...], most: int) -> list[list[tuple[str, int]]]:
    """`chunks` in order, in groups of at most `most` and WINDOW_BYTES (one chunk at least): an
    index naming chunks of 64 MiB must not make a check hold a gigabyte."""
    groups: list[list[tuple[str, int]]] = [[]]
    held = 0
    for cid, length in chunks:
        if groups[-1] and (len(groups[-1]) >= most or held + length > WINDOW_BYTES):
            groups.append([])
            held = 0
        groups[-1].append((cid, length))
        held += length
    return groups if groups[0] else []


def _check_whole(tier, key: str, record, what: str, deep: bool) -> S3Health:  # noqa: ANN001
    """A whole-object artifact: its size and stored digest from a HEAD; its bytes with `deep`."""
    path = tier.sqsh_object(key)
    head = tier._head(path)
    if head is None:
        return S3Health(key, -1, None, (f"{what}: neither {tier.url(path)} nor a chunk index is there",))
    size, stored = head.get("ContentLength", -1), head.get("Metadata", {}).get("blake3")
    digest = f"{PREFIX}{stored}" if stored else None
    problems = []
    if size != record.size:
        problems.append(f"{what}: {tier.url(path)} is {size} bytes, its record says {record.size}")
    if digest != record.digest:
        problems.append(f"{what}: {tier.url(path)} was stored with digest {digest or 'none'}, its record says "
                        f"{record.digest}")
    if deep and not problems:
        actual = _hash_object(tier, path, size, head.get("ETag"))
        if actual != record.digest:
            problems.append(f"{what}: {tier.url(path)} holds bytes of digest {actual}, its record says "
                            f"{record.digest}")
    return S3Health(key, size, digest, tuple(problems))


def _hash_object(tier, path: str, size: int, etag: str | None) -> str:  # noqa: ANN001 - S3Tier
    """blake3 of one object, read a piece at a time, no more than `size` bytes (pinned to `etag`)."""
    from botocore.exceptions import ClientError

    url = tier.url(path)
    try:
        response = tier._call(url, "get_object", Key=path, **({"IfMatch": etag} if etag else {}))
    except ClientError as exc:
        raise tier._error(url, exc) from None
    whole, body, left = blake3.blake3(max_threads=blake3.blake3.AUTO), response["Body"], size + 1
    try:
        while left > 0:
            piece = body.read(min(READ_PIECE, left))
            if not piece:
                break
            whole.update(piece)
            left -= len(piece)
    finally:
        body.close()
    return PREFIX + whole.hexdigest()


def repair(tier, key: str, sqsh, health: S3Health) -> None:  # noqa: ANN001 - S3Tier, a verified file
    """Store the chunks `health` found missing or damaged again from `sqsh` (a copy verified
    against the record, so its chunks are the index's), overwriting what is there, and note their
    new ETags in the index."""
    index = health.index
    run_parallel(lambda cid: tier.chunks.replace(cid, read_chunk(index, sqsh, cid)), sorted(health.damaged),
                 tier.workers)
    path = tier.index_object(key)
    body = stored_index_json(index, tier.chunks.etags(index.unique()))
    from botocore.exceptions import ClientError

    try:
        tier._call(tier.url(path), "put_object", Key=path, Body=body, ChecksumAlgorithm="CRC32",
                   ContentType="application/json")
    except ClientError as exc:
        raise tier._error(tier.url(path), exc) from None


class ChunkProblem(NamedTuple):
    cid: str
    problem: str  # what is wrong with it
    keys: tuple[str, ...]  # the artifacts whose index names it: none of them can be fetched


def chunk_problems(tier, *, deep: bool = False) -> list[ChunkProblem]:  # noqa: ANN001 - S3Tier
    """The chunks some index names that the bucket lacks (one listing of chunks/ and a GET of
    each index, as gc makes), and with `deep` those that fail their id (every one read)."""
    stored = {cid for item in tier._walk(tier._path(CHUNKS_DIR) + "/")
              if is_chunk_id(cid := item["Key"].rsplit("/", 1)[-1])}
    users: dict[str, list[str]] = {}
    lengths: dict[str, int] = {}
    for path in tier.chunks.index_objects():
        key = path.rsplit("/", 1)[-1][: -len(INDEX_SUFFIX)]
        if not is_key(key):
            continue
        try:
            data = tier._get_bytes(path, MAX_INDEX_BYTES, BadChunkIndex)
            index = None if data is None else ChunkIndex.from_json(data, tier.url(path))
        except BadChunkIndex:
            continue  # gc warns of it already
        for cid, length in (index.unique().items() if index is not None else ()):
            users.setdefault(cid, []).append(key)
            lengths[cid] = length
    # one missing from chunks/ may sit in a running gc's trash, where a fetch still finds it
    suspects = sorted(users if deep else set(users) - stored)
    found = run_parallel(lambda cid: tier.chunks.problem(cid, lengths[cid]), suspects, tier.workers)
    return [ChunkProblem(cid, "missing" if cid not in stored else problem, tuple(sorted(users[cid])))
            for cid, problem in zip(suspects, found) if problem is not None]
