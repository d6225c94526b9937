"""Sending chunks to S3: each one compressed and created only if absent, on a bounded pool of
threads, either while the file is still being cut (a cold publish overlaps its chunking with its
upload) or afterwards, read back from the file by its index."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from efabuild.chunks.cdc import ChunkIndex, chunk_id

if TYPE_CHECKING:
    from efabuild.store.chunked.s3 import ChunkStore


class ChunkSender:
    """Puts chunks on up to `workers` threads, holding at most `workers` of them at once (`submit`
    waits for a free thread). The first failure stops the sends not yet begun and is raised by
    the next `submit` or by `check`; `close` waits for the running ones."""

    def __init__(self, store: ChunkStore, workers: int, progress: Callable[[int], None] | None = None) -> None:
        self.store = store
        self.progress = progress
        self._pool = ThreadPoolExecutor(max(1, workers))
        self._slots = threading.BoundedSemaphore(max(1, workers))
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self.created: set[str] = set()  # chunk ids this sender created
        self.etags: dict[str, str] = {}  # id -> ETag S3 gave each of those: no second look is needed
        self.bytes = 0  # raw bytes of those
        self.wire = 0  # their compressed bytes
        self.refused: dict[str, str] = {}  # id -> MD5 of our body, for chunks the bucket held already
        self._failure: BaseException | None = None

    def submit(self, cid: str, read: Callable[[], bytes]) -> None:
        """Send chunk `cid`, whose bytes `read()` gives (called on the sending thread), once."""
        if cid in self._seen:
            return
        self._seen.add(cid)
        self.check()
        self._slots.acquire()
        try:
            self._pool.submit(self._send, cid, read)
        except BaseException:
            self._slots.release()
            raise

    def _send(self, cid: str, read: Callable[[], bytes]) -> None:
        from efabuild.store.chunked.s3 import compress

        try:
            if self._failure is not None:
                return
            raw = read()
            body = compress(raw)
            etag = self.store.tier._create(self.store.object(cid), body, ContentType="application/zstd")
            if etag is not None:
                with self._lock:
                    self.created.add(cid)
                    self.etags[cid] = etag
                    self.bytes += len(raw)
                    self.wire += len(body)
            else:  # its ETag (S3's MD5 of a one-part object) tells whether what is there is these bytes
                with self._lock:
                    self.refused[cid] = hashlib.md5(body, usedforsecurity=False).hexdigest()
            if self.progress is not None:
                self.progress(len(raw))
        except BaseException as exc:  # noqa: BLE001 - handed to the submitting thread
            with self._lock:
                self._failure = self._failure or exc
        finally:
            self._slots.release()

    def check(self) -> None:
        if self._failure is not None:
            raise self._failure

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def send_from_file(store: ChunkStore, index: ChunkIndex, source: Path, ids: set[str],
                   sender: ChunkSender) -> None:
    """Send the chunks `ids` of `source` (described by `index`), each read back and checked
    against its id first: a file changed since it was cut must never store a misnamed chunk."""
    from efabuild.store.chunked.s3 import ChunkError

    spans: dict[str, tuple[int, int]] = {}
    for cid, offset, length in index.spans():
        spans.setdefault(cid, (offset, length))
    fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC)

    def reader(cid: str) -> Callable[[], bytes]:
        offset, length = spans[cid]

        def read() -> bytes:
            raw = os.pread(fd, length, offset)
            if chunk_id(raw) != cid:
                raise ChunkError(f"{source}: bytes at {offset} no longer hash to chunk {cid[:12]}")
            return raw
        return read

    try:
        try:
            # in file order: a file larger than the page cache is read ahead, not seeked through
            for cid in sorted(ids, key=lambda c: spans[c][0]):
                sender.submit(cid, reader(cid))
        finally:
            sender.close()
    finally:
        os.close(fd)
    sender.check()
