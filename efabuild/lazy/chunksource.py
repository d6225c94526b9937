"""Where a lazily read artifact's bytes come from, chunk by chunk, each checked against its id.

A chunk is looked for in this order: the bytes recently served (a bounded LRU in memory), the
node cache, the artifact's copy on a filesystem tier (read at the chunk's offset through a
descriptor opened without following a link), the chunks other nodes fetched onto a shared tier
(store/chunked/fschunks.py), then S3 (one GET, decompressed into at most the chunk's length). A
chunk from S3 is left on the shared tier for the next node, so N nodes starting one artifact pull
each chunk from S3 about once. Whatever the source, the bytes are hashed and must
be the chunk's id before anything is served or cached: a mismatch is ChunkUnavailable, never
wrong bytes. Concurrent reads of one missing chunk fetch it once.
"""

from __future__ import annotations

import bisect
import collections
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import blake3

from efabuild.errors import EfabuildError
from efabuild.lazy.nodecache import CacheFull, NodeCache
from efabuild.chunks import startlist
from efabuild.chunks.cdc import ChunkIndex
from efabuild.store.chunked.fschunks import NONE, OURS, THEIRS, FsChunks


class ChunkUnavailable(EfabuildError):
    """No source gave the chunk's bytes: a read of it is an I/O error."""


class ChunkSource:
    def __init__(self, index: ChunkIndex, cache: NodeCache | None, copies: Sequence[int],
                 fetch: Callable[[str, int], bytes] | None, memory: int = 64 << 20,
                 log: Callable[[str], None] = lambda line: None, shared: Sequence[FsChunks] = ()) -> None:
        """`copies`: descriptors of whole copies of the artifact (filesystem tiers); `fetch(id,
        length)`: S3's verified fetch; `memory`: bytes of chunks kept in memory; `shared`: the
        chunk stores of the shared filesystem tiers."""
        self.index, self.cache, self.copies, self.fetch, self.log = index, cache, list(copies), fetch, log
        self.shared = list(shared)
        spans = list(index.spans())
        self.offsets = [offset for _, offset, _ in spans]
        self.spans = spans
        self.memory = memory
        self._lru: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._held = 0
        self._lock = threading.Lock()
        self._inflight: dict[str, Future] = {}
        self.fetched_bytes = 0  # from S3, for the bench and tests
        self.stopped: str | None = None  # why every read now fails (the whole-file check)
        self.started = Recorder()  # the chunks reads asked for first, in order: a start list

    def read(self, offset: int, size: int) -> bytes:
        """`size` bytes of the artifact from `offset` (fewer at its end)."""
        end = min(offset + size, self.index.size)
        if offset >= end:
            return b""
        out = bytearray()
        n = bisect.bisect_right(self.offsets, offset) - 1
        while offset < end:
            cid, start, length = self.spans[n]
            self.started.note(cid)
            data = self.chunk(cid, length, start)
            piece = data[offset - start: min(end, start + length) - start]
            out += piece
            offset += len(piece)
            n += 1
        return bytes(out)

    def stop(self, why: str) -> None:
        """Serve nothing more, and drop what the cache and memory hold of this artifact."""
        with self._lock:
            self.stopped = why
            self._lru.clear()
        if self.cache is not None:
            for cid, _, _ in self.spans:
                self.cache.forget(cid)

    def chunk(self, cid: str, length: int, offset: int) -> bytes:
        if self.stopped is not None:
            raise ChunkUnavailable(self.stopped)
        with self._lock:
            data = self._lru.get(cid)
            if data is not None:
                self._lru.move_to_end(cid)
                return data
            future = self._inflight.get(cid)
            owner = future is None
            if owner:
                future = self._inflight[cid] = Future()
        if not owner:
            return future.result()
        try:
            data = self._find(cid, length, offset)
        except BaseException as exc:
            with self._lock:
                del self._inflight[cid]
            future.set_exception(exc)
            raise
        with self._lock:
            del self._inflight[cid]
            self._remember(cid, data)
        future.set_result(data)
        return data

    def _find(self, cid: str, length: int, offset: int) -> bytes:
        if self.cache is not None:
            data = self.cache.get(cid, length)
            if data is not None:
                return data
        problems = []
        for fd in self.copies:
            try:
                data = os.pread(fd, length, offset)
            except OSError as exc:
                problems.append(f"a tier's copy: {exc.strerror}")
                continue
            if len(data) == length and blake3.blake3(data).hexdigest() == cid:
                return self._keep(cid, data)
            problems.append("a tier's copy holds other bytes there")
        for chunks in self.shared:
            data = chunks.get(cid, length)  # checked against the id there; a bad file is a miss
            if data is not None:
                return self._keep(cid, data)
        if self.fetch is not None:
            data = self._from_s3(cid, length, problems)
            if data is not None:
                return self._keep(cid, data)
        message = f"chunk {cid[:12]} at offset {offset}: " + ("; ".join(problems) or "no source holds it")
        self.log(message)
        raise ChunkUnavailable(message)

    def _from_s3(self, cid: str, length: int, problems: list[str]) -> bytes | None:
        """The chunk from S3, once across the nodes sharing a tier: the node that claims it there
        fetches it and leaves it on the tier; the others wait for it (store/chunked/fschunks.py)."""
        shared = self.shared[0] if self.shared else None
        claim = shared.claim(cid) if shared is not None else NONE
        if claim == THEIRS:
            data = shared.wait(cid, length)
            if data is not None:
                return data
        try:
            if claim == OURS:
                data = shared.get(cid, length)  # written between our look and our claim
                if data is not None:
                    return data
            try:
                data = bytes(self.fetch(cid, length))
            except EfabuildError as exc:
                problems.append(str(exc))
                return None
            if len(data) != length or blake3.blake3(data).hexdigest() != cid:
                problems.append("S3 gave other bytes")
                return None
            with self._lock:
                self.fetched_bytes += length
            if shared is not None:
                shared.put(cid, data)  # for the next node
            return data
        finally:
            if claim == OURS:
                shared.release(cid)

    def _keep(self, cid: str, data: bytes) -> bytes:
        if self.cache is not None:
            try:
                self.cache.put(cid, data)
            except CacheFull as exc:
                self.log(str(exc))  # served all the same: the bytes are checked, only not kept
        return data

    def _remember(self, cid: str, data: bytes) -> None:
        self._lru[cid] = data
        self._held += len(data)
        while self._held > self.memory and len(self._lru) > 1:
            _, dropped = self._lru.popitem(last=False)
            self._held -= len(dropped)


class Recorder:
    """The chunks reads asked for in the first WINDOW seconds after the first one, each once, in
    order, at most startlist.MAX_IDS: what a job start reads (not what the prefetch reads)."""

    WINDOW = 60.0

    def __init__(self) -> None:
        self.ids: list[str] = []
        self._seen: set[str] = set()
        self._first: float | None = None
        self._made = self._last = time.monotonic()
        self._lock = threading.Lock()

    def note(self, cid: str) -> None:
        if cid in self._seen:
            return
        now = time.monotonic()
        with self._lock:
            if self._first is None:
                self._first = now
            if now - self._first <= self.WINDOW and len(self.ids) < startlist.MAX_IDS and cid not in self._seen:
                self._seen.add(cid)
                self.ids.append(cid)
                self._last = now

    def settled(self, quiet: float) -> bool:
        """Whether the start is over: no read asked for a new chunk for `quiet` seconds (none at all
        for three times that since the mount), or the window has passed."""
        now = time.monotonic()
        if self._first is None:
            return now - self._made > 3 * quiet
        return self.closed() or now - self._last > quiet

    def closed(self) -> bool:
        """Whether the window has passed: the list is what the start read."""
        return self._first is not None and time.monotonic() - self._first > self.WINDOW
