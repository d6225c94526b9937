"""What a send of chunks ahead of a publish did, kept until that publish takes it (see
store/chunked/publish.py's send_ahead): one slot per file, by its digest, for exactly its index."""

from __future__ import annotations

import threading
from concurrent.futures import Future

from efabuild.chunks.cdc import ChunkIndex


class AheadSlots:
    def __init__(self) -> None:
        self._slots: dict[str, tuple[ChunkIndex, Future]] = {}
        self._lock = threading.Lock()

    def hold(self, index: ChunkIndex) -> tuple[Future, bool]:
        """The slot of a send ahead for the file of `index`, and whether this caller is its first
        (who fills it); a later one waits for the first's result."""
        with self._lock:
            held = self._slots.get(index.digest)
            if held is not None and held[0] == index:
                return held[1], False
            slot: Future = Future()
            self._slots[index.digest] = (index, slot)
            return slot, True

    def take(self, index: ChunkIndex):  # noqa: ANN201 - publish.Ahead | None
        """What a send ahead did for the file of exactly `index` (waiting for it while it runs),
        once: None when there was none, or it failed (the publish then does it all itself)."""
        with self._lock:
            held = self._slots.get(index.digest)
            if held is None or held[0] != index:
                return None
            del self._slots[index.digest]
        return None if held[1].exception() is not None else held[1].result()
