"""Chunk indexes: a `.sqsh` cut into content-defined chunks, each named by the blake3 of its bytes.

Two versions of one image share most of their bytes, but not at the same offsets: a file added in
the user layer shifts everything after it. Content-defined chunking (FastCDC) cuts where the
content says, not where the offset says, so the shared bytes fall into the same chunks in both
versions. The chunked S3 tier stores each chunk once; a fetch copies the chunks it already has
from artifacts on the node (seeds) and downloads only the rest.

An index lists the chunks in file order with their lengths, plus the whole file's size and
digest. It is kept beside every stored artifact (`objects/<k[:2]>/<key>.chunks.json`), so a seed
needs no re-chunking, and it is the S3 artifact's table of contents. An index read from a store is
untrusted input: `ChunkIndex.from_json` checks every field, and every chunk is verified against its
id when it is used.
"""

from __future__ import annotations

from typing import NamedTuple
import contextlib
import json
import mmap
import os
from collections.abc import Iterator

import blake3

from efabuild.host import statstamp
from efabuild.host.digest import PREFIX, Splice, is_digest, spliced_maps
from efabuild.errors import EfabuildError

FORMAT = "efabuild.chunks/v1"
MiB = 1024 * 1024
# Chosen by measurement (docs/guides/store.md, "Chunk size"): on a one-file change of a 1.4 GB image, 1 MiB
# average chunks left 0.08 % of its bytes new and 4 MiB ones 0.21 % (SquashFS's rewritten tables
# and the changed file's chunk), both far under 1 %, while a cold transfer of 4 MiB chunks makes a
# quarter of the requests: a 25 GB image is ~6,000 S3 objects, not 25,000.
MIN_SIZE, AVG_SIZE, MAX_SIZE = 1 * MiB, 4 * MiB, 16 * MiB
# Bounds of an index read from a store: what a fetch parses and plans holds ~300 bytes a chunk.
# 262,144 chunks are 256 GiB cut at the 1 MiB minimum, 1 TiB at the 4 MiB average; an entry
# takes at most 78 bytes of JSON
MAX_CHUNKS = 1 << 18
MAX_INDEX_BYTES = 24 * MiB  # a 25 GB image cut at the minimum chunk size needs ~2 MiB
# no chunker efabuild configures cuts more; an index naming a longer chunk is forged, and a fetch
# would size its buffers by it
MAX_CHUNK_BYTES = 64 * MiB
MIN_CHUNK_BYTES = 64  # FastCDC's smallest minimum
_HEX = frozenset("0123456789abcdef")


class BadChunkIndex(EfabuildError):
    """An index that is not one efabuild wrote: the artifact is not used from it."""


def chunk_id(data: bytes | memoryview) -> str:
    return blake3.blake3(data).hexdigest()


def is_chunk_id(text: object) -> bool:
    return isinstance(text, str) and len(text) == 64 and _HEX.issuperset(text)


class ChunkError(EfabuildError):
    """A chunk that is missing or does not hash to its id (raised by store/chunked/s3.py; here so the
    store facade can catch it without loading the S3 chunk store, and attrs, on a plan's path)."""


class ChunkIndex(NamedTuple):
    size: int  # bytes of the whole file
    digest: str  # "blake3:<hex>" of the whole file
    chunks: tuple[tuple[str, int], ...]  # (chunk id, length) in file order
    chunking: tuple[int, int, int] = (MIN_SIZE, AVG_SIZE, MAX_SIZE)

    def spans(self) -> Iterator[tuple[str, int, int]]:
        """(chunk id, offset, length) of every chunk, in file order."""
        offset = 0
        for cid, length in self.chunks:
            yield cid, offset, length
            offset += length

    def unique(self) -> dict[str, int]:
        """Each distinct chunk id with its length."""
        return dict(self.chunks)

    def size_unique(self) -> int:
        """Bytes of the distinct chunks (what storing this file alone would take)."""
        return sum(self.unique().values())

    def identity(self) -> str:
        """"blake3:<hex>" of the index's canonical JSON. A record and a signed statement name the
        index by it, so a lazy read can trust the chunk ids before it has read the whole file."""
        return PREFIX + blake3.blake3(self.to_json()).hexdigest()

    def to_json(self) -> bytes:
        return json.dumps({
            "format": FORMAT, "size": self.size, "digest": self.digest,
            "chunking": {"min": self.chunking[0], "avg": self.chunking[1], "max": self.chunking[2]},
            "chunks": [[cid, length] for cid, length in self.chunks],
        }, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> ChunkIndex:
        """Parse and check an index read from a store; BadChunkIndex naming `where` if it is not valid."""
        if len(data) > MAX_INDEX_BYTES:
            raise BadChunkIndex(f"{where}: chunk index larger than {MAX_INDEX_BYTES // MiB} MiB")
        # every JSON value past the first follows a comma: this bounds what parsing it makes
        if data.count(b",") > 2 * MAX_CHUNKS + 16:
            raise BadChunkIndex(f"{where}: chunk index of more than {MAX_CHUNKS} chunks")
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):
            raise BadChunkIndex(f"{where}: chunk index is not JSON") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise BadChunkIndex(f"{where}: not a {FORMAT} chunk index")
        size, digest, chunks, chunking = doc.get("size"), doc.get("digest"), doc.get("chunks"), doc.get("chunking")
        if not _is_count(size) or not is_digest(digest) or not isinstance(chunks, list):
            raise BadChunkIndex(f"{where}: chunk index has a bad size, digest or chunk list")
        if len(chunks) > MAX_CHUNKS:
            raise BadChunkIndex(f"{where}: chunk index of {len(chunks)} chunks, more than {MAX_CHUNKS}")
        limits = (MIN_SIZE, AVG_SIZE, MAX_SIZE)
        if chunking is not None:
            values = tuple(chunking.get(k) for k in ("min", "avg", "max")) if isinstance(chunking, dict) else ()
            if not (len(values) == 3 and all(_is_count(v) for v in values)
                    and MIN_CHUNK_BYTES <= values[0] <= values[1] <= values[2] <= MAX_CHUNK_BYTES):
                raise BadChunkIndex(f"{where}: chunk index has a bad chunking {str(chunking)[:80]!r}")
            limits = values
        low, _, high = limits
        parsed = []
        total = 0
        for number, entry in enumerate(chunks):
            if not (isinstance(entry, list) and len(entry) == 2 and is_chunk_id(entry[0])
                    and _is_count(entry[1]) and 0 < entry[1] <= MAX_CHUNK_BYTES):
                raise BadChunkIndex(f"{where}: chunk index entry {str(entry)[:80]!r} is not [id, length]")
            # FastCDC cuts no chunk longer than its maximum, nor shorter than its minimum but the last
            if entry[1] > high or (entry[1] < low and number < len(chunks) - 1):
                raise BadChunkIndex(f"{where}: chunk {number} has {entry[1]} bytes, outside its chunking's "
                                    f"{low}..{high}")
            parsed.append((entry[0], entry[1]))
            total += entry[1]
        if total != size:
            raise BadChunkIndex(f"{where}: chunk lengths add up to {total} bytes, the index says {size}")
        return cls(size=size, digest=digest, chunks=tuple(parsed), chunking=limits)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def chunk_file(path: str | os.PathLike[str], *, chunking: tuple[int, int, int] = (MIN_SIZE, AVG_SIZE, MAX_SIZE),
               progress=None, on_chunk=None) -> ChunkIndex:  # noqa: ANN001 - progress(n), on_chunk(id, bytes)
    """Cut a file into chunks and digest it whole, in one read (through mmap: the pages of a
    freshly exported .sqsh are still in the page cache, and memory stays bounded); each chunk is
    handed to `on_chunk` as soon as it is cut. A file someone else could write is read in
    windows instead: its owner truncating it meanwhile would kill a reader of a mapping with
    SIGBUS, where a read that ends early is one line (ShortRead)."""
    whole = blake3.blake3()
    chunks: list[tuple[str, int]] = []
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # a verified copy is handed on as /proc/self/fd/N
    try:
        info = os.fstat(fd)
        size = info.st_size
        if size == 0:
            return ChunkIndex(size=0, digest=PREFIX + whole.hexdigest(), chunks=(), chunking=chunking)
        cut = _read_cuts if statstamp.others_may_write(info) else _mapped_cuts
        for data in cut(fd, size, chunking, path):
            whole.update(data)
            cid = chunk_id(data)
            chunks.append((cid, len(data)))
            if on_chunk is not None:
                on_chunk(cid, data)
            if progress is not None:
                progress(len(data))
    finally:
        os.close(fd)
    return ChunkIndex(size=size, digest=PREFIX + whole.hexdigest(), chunks=tuple(chunks), chunking=chunking)


class ShortRead(EfabuildError):
    """A file ended before its size while it was cut (truncated meanwhile)."""


_WINDOW = 64 * MiB  # bytes read at once where a file is read rather than mapped


def _cuts(data, chunking: tuple[int, int, int]):  # noqa: ANN001, ANN202 - bytes-like; FastCDC's chunks
    """FastCDC's chunks of `data`. fastcdc (20 ms to import) is loaded here: a plan loads this
    module, and only publishing and fetching cut chunks."""
    from fastcdc import fastcdc

    low, avg, high = chunking
    return fastcdc(data, min_size=low, avg_size=avg, max_size=high, fat=True)


def _mapped_cuts(fd: int, size: int, chunking: tuple[int, int, int], path) -> Iterator[bytes]:  # noqa: ANN001
    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as view:
        for chunk in _cuts(view, chunking):
            yield chunk.data


def _read_cuts(fd: int, size: int, chunking: tuple[int, int, int], path) -> Iterator[bytes]:  # noqa: ANN001
    """The chunks FastCDC cuts the whole file into, from reads of a window: a cut depends only on
    the bytes from the chunk's start to at most its maximum size, so every chunk that starts a
    maximum size or more before the window's end is the whole file's; the rest is read again
    with the next window."""
    high = chunking[2]
    pos = 0
    while pos < size:
        wanted = min(size - pos, max(_WINDOW, 2 * high))
        window = os.pread(fd, wanted, pos)
        # a regular file reads short only at its end: shortened meanwhile (a window of less than a
        # chunk's maximum taken again and again would never end)
        if len(window) < wanted:
            raise ShortRead(f"{path}: ended at byte {pos} of {size} while it was cut into chunks (truncated?)")
        last = pos + len(window) >= size
        taken = 0
        for chunk in _cuts(window, chunking):
            if not last and len(window) - chunk.offset < high:
                break  # its cut may lie past the window: cut again from the next read
            yield chunk.data
            taken = chunk.offset + chunk.length
        pos += taken


def chunk_spliced(path: str | os.PathLike[str], splice: Splice, seed: ChunkIndex | None, *,
                  chunking: tuple[int, int, int] = (MIN_SIZE, AVG_SIZE, MAX_SIZE), digest: str | None = None,
                  seed_checked: bool = False, progress=None) -> ChunkIndex:  # noqa: ANN001
    """chunk_file() of a file whose bytes [splice.start, splice.end) were copied from
    `splice.source`, whose chunk index is `seed`; the same index, without cutting that range again.

    A FastCDC chunk depends only on the bytes from its start to its cut: once a cut of this file
    lands where a seed chunk starts inside the range, that chunk is this file's too, and so is
    every one after it that ends inside the range (and before the source's end, where the last
    chunk is cut by the end of the data). Those are taken from the seed; the rest is cut here.
    A seed read from a store is a claim: every chunk taken from it is hashed (from the source's
    pages) and checked against its id, and one that does not match ends the reuse there (a seed
    whose ids are right but whose cuts are not FastCDC's costs sharing, never a wrong byte). A
    seed cut with other sizes, or of another size than the source, lends nothing. Cutting a whole
    1.4 GB image took 1.05 s here; hashing its chunks again takes a fifth of that. `digest`: the
    file's, where its caller has it (host/blake3tree.py): the file is then not hashed whole again.
    `seed_checked`: the seed is known to describe the source's bytes (lends_all() said so of an
    earlier child of the same source, remembered by the caller): its chunks are not hashed again."""
    whole = blake3.blake3(max_threads=blake3.blake3.AUTO) if digest is None else None
    chunks: list[tuple[str, int]] = []
    with spliced_maps(path, splice) as (own, source):
        size = len(own)
        lent: dict[int, tuple[str, int]] = {}
        if seed is not None and seed.chunking == chunking and seed.size == len(source):
            lent = {offset: (cid, length) for cid, offset, length in seed.spans()
                    if splice.start <= offset and offset + length <= splice.end and offset + length < seed.size}
        pos = 0
        try:
            while pos < size:
                taken = lent.get(pos)
                if taken is not None:
                    cid, length = taken
                    data = source[pos:pos + length]
                    if not seed_checked and blake3.blake3(data, max_threads=blake3.blake3.AUTO).hexdigest() != cid:
                        lent, taken = {}, None  # a seed that lied once lends nothing more
                    elif whole is not None:
                        whole.update(data)
                if taken is None:
                    chunk = next(iter(_cuts(own[pos:], chunking)))
                    cid, length = chunk_id(chunk.data), chunk.length
                    if whole is not None:
                        whole.update(chunk.data)
                chunks.append((cid, length))
                pos += length
                if progress is not None:
                    progress(length)
        finally:
            data = None  # the slices of the maps go before the maps do
    return ChunkIndex(size=size, digest=digest or PREFIX + whole.hexdigest(), chunks=tuple(chunks),
                      chunking=chunking)


def lends_all(seed: ChunkIndex, index: ChunkIndex, splice: Splice) -> bool:
    """Whether every chunk of `seed` inside the splice's range is in `index` where the seed has it:
    chunk_spliced() hashed each against its id and found none that lied, so the seed describes
    the source's bytes there."""
    mine = set(index.spans())
    return all((cid, offset, length) in mine for cid, offset, length in seed.spans()
               if splice.start <= offset and offset + length <= splice.end and offset + length < seed.size)


def mismatch(index: ChunkIndex, path: str | os.PathLike[str]) -> str | None:
    """None when `path` holds exactly the chunks `index` lists, and their bytes make the digest it
    claims; else what differs. An index kept beside an artifact in a shared store is checked so
    before a publish tells S3 the artifact is made of chunks the bucket already holds: its size
    and digest are copied from the record as easily as the record is read. (No O_NOFOLLOW: a
    verified copy is handed on as /proc/self/fd/N.)"""
    whole = blake3.blake3(max_threads=blake3.blake3.AUTO)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        size = info.st_size
        if size != index.size:
            return f"it describes {index.size} bytes, the file has {size}"
        if statstamp.others_may_write(info):  # read, not mapped: truncated meanwhile, a map would be SIGBUS
            return _read_mismatch(index, fd, whole)
        mapping = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else contextlib.nullcontext(b"")  # mmap refuses 0 B
        with mapping as mapped, memoryview(mapped) as view:
            for number, (cid, offset, length) in enumerate(index.spans()):
                # one chunk is megabytes: blake3's own threads hash it on every core
                if blake3.blake3(view[offset:offset + length], max_threads=blake3.blake3.AUTO).hexdigest() != cid:
                    return f"chunk {number} (at byte {offset}) does not hash to {cid[:12]}"
            whole.update(view)
    finally:
        os.close(fd)
    if PREFIX + whole.hexdigest() != index.digest:
        return f"its chunks make {PREFIX + whole.hexdigest()}, it claims {index.digest}"
    return None


def _read_mismatch(index: ChunkIndex, fd: int, whole) -> str | None:  # noqa: ANN001 - a blake3 hasher
    for number, (cid, offset, length) in enumerate(index.spans()):
        data = os.pread(fd, length, offset)  # at most MAX_CHUNK_BYTES
        if blake3.blake3(data, max_threads=blake3.blake3.AUTO).hexdigest() != cid:
            return f"chunk {number} (at byte {offset}) does not hash to {cid[:12]}"
        whole.update(data)
    if PREFIX + whole.hexdigest() != index.digest:
        return f"its chunks make {PREFIX + whole.hexdigest()}, it claims {index.digest}"
    return None
