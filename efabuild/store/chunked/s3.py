"""Chunks in S3: which ones the bucket lacks, one fetched and verified (a file is assembled from
seeds and downloads in store/chunked/assembly.py; gc's mark and sweep is store/gc/s3chunks.py).

Layout under the tier's prefix (beside objects/ and refs/):

    chunks/<id[:2]>/<id>                 one chunk, zstd-compressed; id = blake3 of its raw bytes
    objects/<k[:2]>/<key>.chunks.json    the artifact's chunk index (efabuild.chunks.cdc)
    gc/marks/<time>.json                 chunks that were unreferenced at that time (store/gc/s3chunks.py)
    gc/trash/<id>                        a chunk gc is deleting (store/gc/chunks.py)
    gc/lock                              held by the gc that sweeps (store/gc/lock.py)

A chunk object is created with IfNoneMatch='*', so a second publisher of the same bytes loses the
race harmlessly; only a repair of one found missing or failing its id overwrites it, with bytes
checked against the id first (`ChunkStore.replace`, store/chunked/health.py). Every chunk is checked
against its id after decompression, whether it came from S3 or from a seed, and the assembled
file against the index's digest, so neither a damaged object nor a damaged seed can reach a job.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator

import attrs

from efabuild import notices
from efabuild.store.chunked.ahead import AheadSlots
from efabuild.chunks.cdc import (  # ChunkError: this module's, defined there for the facade
    MAX_INDEX_BYTES,
    BadChunkIndex,
    ChunkError,
    ChunkIndex,
    chunk_id,
)
from efabuild.store.layout import INDEX_SUFFIX
from efabuild.store.parallel import run_parallel

ZSTD_LEVEL = 1  # -noD images compress well even at 1; at 3 a cold publish ran at 2/3 of the rate here
CHUNKS_DIR = "chunks"
TRASH_DIR = "gc/trash"  # where gc moves a chunk it deletes, until no index names it (store/gc/chunks.py)
LIST_FROM = 8  # ids under one chunks/<d> from which one LIST (a page per 1,000 keys) beats a HEAD each
LIST_PAGE = 1_000  # keys S3 gives in one LIST page at most
# bytes the chunk downloads of one fetch hold at once (each its object and its raw bytes), whatever
# lengths an index names: 16 parallel GETs of 4 MiB chunks take ~130 MiB, of forged 64 MiB ones 2 GiB
FETCH_MEMORY = 160 * 1024 * 1024


@attrs.frozen
class Transfer:
    chunks: int = 0  # chunk objects sent or fetched
    bytes: int = 0  # raw bytes they hold
    wire_bytes: int = 0  # bytes on the wire (compressed)
    reused: int = 0  # chunks found in the bucket (publish) or in seeds (fetch)
    reused_bytes: int = 0
    cloned_bytes: int = 0  # of the reused ones, bytes that share a seed's blocks (fetch, reflink filesystems)
    created: frozenset[str] = attrs.field(default=frozenset(), repr=False)  # chunk ids this upload created
    # (id, MD5 of the body this upload would have stored) of chunks the bucket held already
    refused: tuple[tuple[str, str], ...] = attrs.field(default=(), repr=False)
    # (id, ETag S3 gave it) of the chunks this upload created
    etags: tuple[tuple[str, str], ...] = attrs.field(default=(), repr=False)


def _etag(response: dict) -> str:
    """An ETag as HEAD, LIST and PUT give it, without its quotes."""
    return str(response.get("ETag", "")).strip('"')


def chunk_object(prefix_path: Callable[..., str], cid: str) -> str:
    return prefix_path(CHUNKS_DIR, cid[:2], cid)


def trash_object(prefix_path: Callable[..., str], cid: str) -> str:
    return prefix_path(TRASH_DIR, cid)


def _compressor():  # noqa: ANN202 - zstandard.ZstdCompressor, one per thread
    import zstandard

    local = _compressor.__dict__.setdefault("local", threading.local())
    if not hasattr(local, "c"):
        local.c = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
        local.d = zstandard.ZstdDecompressor()
    return local


def compress(data: bytes) -> bytes:
    return _compressor().c.compress(data)


def decompress(data: bytes, length: int, what: str) -> bytearray:
    """A chunk object's bytes, which must be the index's `length` for it; never more than
    length + 1 bytes are allocated or decompressed. (python-zstandard's one-shot decompress sizes
    its output by the size a frame declares, whatever max_output_size says: a 32 KiB object
    declaring 1 GiB took 1 GiB.) A frame declaring another size is refused unread; one declaring
    none is streamed into a buffer of length + 1 bytes."""
    import zstandard

    try:
        declared = zstandard.frame_content_size(data)  # -1: the frame does not say
        if declared not in (-1, length):
            raise ChunkError(f"{what}: its zstd frame declares {declared} bytes, the index says {length}")
        raw = bytearray(length + 1)
        with _compressor().d.stream_reader(data) as reader, memoryview(raw) as view:
            got = 0
            while got <= length and (n := reader.readinto(view[got:])):
                got += n
    except zstandard.ZstdError as exc:
        raw = None  # not kept with the failure's traceback
        raise ChunkError(f"{what}: not a zstd frame ({exc})") from None
    if got != length:
        raw = None
        raise ChunkError(f"{what}: {'more than ' if got > length else ''}{got - (got > length)} bytes, "
                         f"the index says {length}")
    del raw[length:]
    return raw


class ChunkStore:
    """The chunks of one S3 tier. `tier` gives the client calls: `_call`, `_head`, `_path`,
    `_put_new`, `url`, `workers`."""

    def __init__(self, tier) -> None:  # noqa: ANN001 - S3Tier
        self.tier = tier
        self._room = _Budget(FETCH_MEMORY)
        self.ahead = AheadSlots()  # what sends ahead of publishes did (store/chunked/publish.py)

    def room_for(self, length: int) -> contextlib.AbstractContextManager[None]:
        """Hold the memory a fetch of a chunk of `length` bytes takes (its object, at most zstd's
        bound, and its raw bytes) for the block, waiting while other fetches hold the rest."""
        return self._room.held(2 * _bound(length) + 1)

    def object(self, cid: str) -> str:
        return chunk_object(self.tier._path, cid)

    def missing(self, ids: Iterable[str]) -> set[str]:
        """The ids among `ids` that the bucket does not hold.

        Ids are grouped by their first hex digit (chunks/<d>...): a group of LIST_FROM or more is
        looked up with one LIST over its key range (1,000 keys a page), a smaller one with a HEAD
        per id. A publish after a one-file change of a 1.5 GB image checks the ~320 chunks it
        reuses twice; 16 LISTs answer each time where as many HEADs took seconds. Once a page answers
        for fewer than LIST_FROM ids, the rest get a HEAD each (100k chunks: 7 pages for ~25 ids)."""
        ids = set(ids)
        return ids - set(self.etags(ids))

    def etags(self, ids: Iterable[str]) -> dict[str, str]:
        """{id: the ETag of its object} for the ids among `ids` that the bucket holds, looked up
        as `missing` says. An object rewritten since an index noted its ETag has another one."""
        groups: dict[str, list[str]] = {}
        for cid in sorted(set(ids)):
            groups.setdefault(cid[0], []).append(cid)
        tasks = [group for group in groups.values() if len(group) >= LIST_FROM]
        tasks += [[cid] for group in groups.values() if len(group) < LIST_FROM for cid in group]
        found, left = {}, []
        for present, rest in run_parallel(self._present, tasks, self.tier.workers):
            found.update(present)
            left += [[cid] for cid in rest]  # what a listing of a bucket too large for these ids left
        found.update(item for present, _ in run_parallel(self._present, left, self.tier.workers) for item in present.items())
        return found

    def _present(self, group: list[str]) -> tuple[dict[str, str], list[str]]:
        """({id: ETag} of those of `group` (sorted ids sharing their first digit) the bucket holds,
        the ids left for a HEAD each): a HEAD each under LIST_FROM ids, else LIST pages over its
        range until one answers for fewer than LIST_FROM of them (not the last: the rest are left)."""
        if len(group) < LIST_FROM:
            heads = {cid: self.tier._head(self.object(cid)) for cid in group}
            return {cid: _etag(head) for cid, head in heads.items() if head is not None}, []
        first, last = self.object(group[0]), self.object(group[-1])
        wanted, found, left = set(group), {}, list(group)
        for page in self.tier._pages(self.tier._path(CHUNKS_DIR, group[0][0]), after=first[:-1], through=last,
                                     size=LIST_PAGE):
            found.update({cid: _etag(item) for item in page if (cid := item["Key"].rsplit("/", 1)[-1]) in wanted})
            reached = sum(1 for cid in left if page and self.object(cid) <= page[-1]["Key"])
            left = left[reached:]
            if left and reached < LIST_FROM and len(page) == LIST_PAGE:
                return found, left
        return found, []

    def replace(self, cid: str, raw: bytes) -> str:
        """Overwrite the chunk object of `cid` with `raw` (checked against the id first): the
        repair of one found missing or damaged, where a conditional PUT would keep what is there.
        Its new ETag."""
        if chunk_id(raw) != cid:
            raise ChunkError(f"{self.tier.url(self.object(cid))}: the bytes to store do not hash to its name")
        path = self.object(cid)
        from botocore.exceptions import ClientError

        try:
            response = self.tier._call(self.tier.url(path), "put_object", Key=path, Body=compress(raw),
                                       ChecksumAlgorithm="CRC32", ContentType="application/zstd")
        except ClientError as exc:
            raise self.tier._error(self.tier.url(path), exc) from None
        return _etag(response)

    def index_objects(self) -> list[str]:
        """Every artifact's chunk index object in the tier."""
        return [item["Key"] for item in self.tier._walk(self.tier._path("objects") + "/")
                if item["Key"].endswith(INDEX_SUFFIX)]

    def referenced(self) -> tuple[set[str], list[str]]:
        """The chunk ids that some index references, and the index objects that could not be read
        (skipped with a warning: a junk object planted in the bucket must not stop gc)."""
        paths = self.index_objects()

        def read(path: str) -> ChunkIndex | None:
            try:
                data = self.tier._get_bytes(path, MAX_INDEX_BYTES, BadChunkIndex)
                if data is None:
                    return None  # deleted meanwhile, with its artifact
                return ChunkIndex.from_json(data, self.tier.url(path))
            except BadChunkIndex as exc:
                notices.warn(f"skipping {exc}")
                return None

        referenced: set[str] = set()
        skipped = []
        batch = 2 * self.tier.workers  # indexes held at once: a batch's, never every artifact's
        for start in range(0, len(paths), batch):
            group = paths[start:start + batch]
            for path, index in zip(group, run_parallel(read, group, self.tier.workers)):
                if index is None:
                    skipped.append(path)
                else:
                    referenced.update(index.unique())
        return referenced, skipped

    def delete_objects(self, paths: list[str]) -> None:
        for start in range(0, len(paths), 1000):  # S3's limit per DeleteObjects call
            batch = paths[start:start + 1000]
            self.tier._call(self.tier.url(batch[0]), "delete_objects",
                            Delete={"Objects": [{"Key": p} for p in batch], "Quiet": True})

    def fetch(self, cid: str, length: int) -> tuple[bytearray, int]:
        """One chunk's raw bytes, verified against its id; and the bytes it took on the wire."""
        path = self.object(cid)
        what = self.tier.url(path)
        from efabuild.store.s3client import retried  # boto3: only once S3 is used

        bound = _bound(length)
        body = retried(what, lambda: self.tier._get_bytes(path, bound, ChunkError), error=ChunkError)
        if body is None:  # a gc may have it in its trash this instant (store/gc/chunks.py)
            trashed = trash_object(self.tier._path, cid)
            body = retried(what, lambda: self.tier._get_bytes(trashed, bound, ChunkError), error=ChunkError)
        if body is None:
            raise ChunkError(f"{what}: missing (deleted by gc while in use, or never uploaded)")
        # A failure is kept with its traceback, and so are the locals of its frames, by every
        # parallel fetch that fails: none may keep megabytes with it
        wire = len(body)
        try:
            raw = decompress(body, length, what)
        finally:
            body = None
        if chunk_id(raw) != cid:
            raw = None
            raise ChunkError(f"{what}: corrupt: its bytes do not hash to its name")
        return raw, wire

    def problem(self, cid: str, length: int) -> str | None:
        """None when the chunk `cid` (of `length` raw bytes) is in the bucket and hashes to its
        id; else what is wrong with it, naming its object (one GET, as a fetch makes)."""
        try:
            self.fetch(cid, length)
        except ChunkError as exc:
            return str(exc)
        return None


def _bound(length: int) -> int:
    return length + (length >> 7) + 4096  # zstd's bound for `length` bytes: more is no chunk of them


class _Budget:
    """Bytes some threads hold at once, at most `total` (one asking more waits for all of it)."""

    def __init__(self, total: int) -> None:
        self.total = self.free = total
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def held(self, amount: int) -> Iterator[None]:
        amount = min(amount, self.total)
        with self._changed:
            self._changed.wait_for(lambda: self.free >= amount)
            self.free -= amount
        try:
            yield
        finally:
            with self._changed:
                self.free += amount
                self._changed.notify_all()
