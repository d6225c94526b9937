"""A mount's start list (chunks/startlist.py): read from the shared tier and fetched ahead, or,
where there is none yet, recorded from what this start reads and left there for the next nodes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from efabuild.chunks import startlist
from efabuild.chunks.cdc import ChunkIndex
from efabuild.errors import EfabuildError
from efabuild.lazy.chunksource import ChunkSource
from efabuild.store.chunked.fschunks import FsChunks

PARALLEL = 8  # fetches at once: a start list's chunks wait on S3's latency, not its bandwidth


def read_list(shared: FsChunks | None, key: str, index: ChunkIndex, log: Callable[[str], None]) -> list[str]:
    """The ids of the start list kept for `key`, those `index` holds ([] when there is none; a list
    that is not one is one line and ignored)."""
    data = shared.get_list(key) if shared is not None else None
    if data is None:
        return []
    try:
        return startlist.decode(data, key, index)
    except startlist.BadStartList as exc:
        log(f"ignoring the start list of {key[:12]} on the {shared.tier.name} tier: {exc}")
        return []


def fetch_ahead(source: ChunkSource, ids: list[str], key: str, log: Callable[[str], None]) -> None:
    """Every chunk of the start list, PARALLEL at a time, each checked as any read's is."""
    where = {}
    for cid, offset, length in source.spans:
        where.setdefault(cid, (offset, length))
    started = time.monotonic()

    def fetch(cid: str) -> int:
        offset, length = where[cid]
        try:
            source.chunk(cid, length, offset)
        except EfabuildError:  # said once by the source; the read that needs it fails the same way
            return 0
        return length

    with ThreadPoolExecutor(PARALLEL, thread_name_prefix="start-list") as pool:
        done = sum(pool.map(fetch, ids))
    log(f"start list of {key[:12]}: {len(ids)} chunks ({done >> 20} MiB) read ahead in "
        f"{time.monotonic() - started:.1f} s")


class ListKeeper:
    """Leaves what this start read on the shared tier as the artifact's start list, once: when the
    recording window has passed, or at unmount if that comes first."""

    def __init__(self, source: ChunkSource, shared: FsChunks, key: str, index: ChunkIndex,
                 log: Callable[[str], None]) -> None:
        self.source, self.shared, self.key, self.index, self.log = source, shared, key, index, log
        self._kept = False
        self._lock = threading.Lock()
        self.unmounted = threading.Event()

    def watch(self) -> None:
        """Run in a thread: keep the list once the window closes (or the mount ends)."""
        while not self.source.started.closed() and not self.unmounted.wait(1.0):
            pass
        self.keep()

    def keep(self) -> None:
        with self._lock:
            if self._kept or not self.source.started.ids:
                return
            self._kept = True
        ids = list(self.source.started.ids)
        if self.shared.put_list(self.key, startlist.encode(self.key, ids), self.index):
            self.log(f"start list of {self.key[:12]}: {len(ids)} chunks kept on the {self.shared.tier.name} tier")
