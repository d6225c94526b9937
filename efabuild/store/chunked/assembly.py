"""Assemble a chunked artifact from seeds on this node and downloads of the chunks they lack.

A seed is a file here whose chunk index is known (store/chunked/seeds.py). The file is put together in
two steps:

1. place: the target's chunks found in seeds are copied from them in runs (chunks that follow each
   other in both files), in the kernel and, where the filesystem can (XFS with reflink, btrfs),
   by sharing the seed's blocks rather than writing them (host/rangecopy.py); the other chunks are
   downloaded, verified against their ids, and written;
2. check: one read of the result hashes the whole file, on both cores, while it is flushed to
   disk. A digest that matches the index's proves every chunk; one that does not makes a second
   read hash each chunk that came from a seed against its id, so that a seed that changed after it
   was indexed, or lies, only costs a download of the chunks it got wrong.

The caller compares the digest returned with the record before anyone may see the file.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import attrs
import blake3

from efabuild.store.chunked.chunks import ChunkIndex, chunk_id
from efabuild.host.digest import PREFIX
from efabuild.host.fsutil import open_regular
from efabuild.store.parallel import run_parallel
from efabuild.host.rangecopy import RangeCopier
from efabuild.store.chunked.s3 import ChunkStore, Transfer

RUN_BYTES = 64 * 1024 * 1024  # a run is cut at this size, so both cores copy and clone


@attrs.frozen
class Seed:
    """A file on this node whose chunk index is known: its chunks need no download."""

    path: Path
    index: ChunkIndex


@attrs.frozen
class Run:
    """Chunks of the target that lie back to back in one seed as well: one copy."""

    seed: Path
    source: int  # offset in the seed
    dest: int  # offset in the target
    length: int
    spans: tuple[tuple[str, int, int], ...]  # (chunk id, offset in the target, length)


@attrs.frozen
class Assembled:
    transfer: Transfer
    digest: str  # "blake3:<hex>" of the bytes now in the file


def plan(index: ChunkIndex, seeds: Sequence[Seed], most: int = RUN_BYTES) -> tuple[list[Run], dict[str, list[int]]]:
    """The runs to copy from seeds and the chunks to download ({id: offsets in the target})."""
    found: dict[str, tuple[Path, int]] = {}
    for seed in seeds:
        for cid, offset, _length in seed.index.spans():
            found.setdefault(cid, (seed.path, offset))
    runs: list[Run] = []
    download: dict[str, list[int]] = {}
    for cid, offset, length in index.spans():
        if cid not in found:
            download.setdefault(cid, []).append(offset)
            continue
        path, source = found[cid]
        last = runs[-1] if runs else None
        if (last is not None and last.seed == path and last.source + last.length == source
                and last.dest + last.length == offset and last.length + length <= most):
            runs[-1] = attrs.evolve(last, length=last.length + length, spans=(*last.spans, (cid, offset, length)))
        else:
            runs.append(Run(path, source, offset, length, ((cid, offset, length),)))
    return runs, download


def assemble(store: ChunkStore, index: ChunkIndex, dest_fd: int, seeds: Sequence[Seed],
             progress: Callable[[int], None] | None = None) -> Assembled:
    """Write the file `index` describes into `dest_fd` (opened for reading and writing) and
    return what it took and the digest of what was written; each distinct download happens once."""
    runs, download = plan(index, seeds)
    os.ftruncate(dest_fd, index.size)
    copier = RangeCopier(dest_fd)
    lengths = index.unique()
    fetched: dict[str, int] = {}  # chunk id -> bytes on the wire
    lock = threading.Lock()

    def fetch(item: tuple[str, list[int]]) -> None:
        cid, offsets = item
        with store.room_for(lengths[cid]):  # held until written: what the parallel GETs hold is bounded
            data, wire = store.fetch(cid, lengths[cid])
            for offset in offsets:
                os.pwrite(dest_fd, data, offset)
            del data
        with lock:
            fetched[cid] = fetched.get(cid, 0) + wire
        if progress is not None:
            progress(lengths[cid] * len(offsets))

    failed: list[Run] = []
    with _opened({run.seed for run in runs}) as fds:
        def place(task: Run | tuple[str, list[int]]) -> None:
            if not isinstance(task, Run):
                return fetch(task)
            try:
                if task.seed not in fds:
                    raise FileNotFoundError(task.seed)
                copier.copy(fds[task.seed], task.source, task.dest, task.length)
            except OSError:  # a seed gone, shortened or unreadable: its chunks are downloaded
                failed.append(task)
                return
            if progress is not None:
                progress(task.length)

        run_parallel(place, [*runs, *download.items()], store.tier.workers)
    run_parallel(fetch, list(_by_chunk(s for run in failed for s in run.spans).items()), store.tier.workers)
    seeded = {offset for run in runs if run not in failed for _, offset, _ in run.spans}
    # The whole file's digest proves every chunk of it: each chunk is hashed on its own only when
    # the whole is wrong, to find what a seed got wrong (changed since it was indexed, or lying),
    # download just that, and hash the whole again. The caller compares the digest with the record.
    digest = whole_digest(dest_fd, index.size)
    wrong = wrong_chunks(dest_fd, index, seeded) if digest != index.digest else {}
    if wrong:
        run_parallel(fetch, list(wrong.items()), store.tier.workers)
        digest = whole_digest(dest_fd, index.size)
    reused = {cid for run in runs if run not in failed for cid, _, _ in run.spans} - set(fetched)
    return Assembled(Transfer(chunks=len(fetched), bytes=sum(lengths[c] for c in fetched),
                              wire_bytes=sum(fetched.values()), reused=len(reused),
                              reused_bytes=sum(lengths[c] for c in reused), cloned_bytes=copier.cloned),
                     digest)


def whole_digest(fd: int, size: int) -> str:
    """The "blake3:<hex>" digest of the file's first `size` bytes, hashed on both cores through a
    mapping while the file is flushed to disk."""
    whole = blake3.blake3(max_threads=blake3.blake3.AUTO)
    if size == 0:
        return PREFIX + whole.hexdigest()
    flush = threading.Thread(target=_fsync_quietly, args=(fd,), daemon=True)
    flush.start()
    with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mapped:
        # blocks cloned from a seed are not in the page cache: read ahead in large requests
        mapped.madvise(mmap.MADV_SEQUENTIAL)
        whole.update(mapped)
    flush.join()
    return PREFIX + whole.hexdigest()


def wrong_chunks(fd: int, index: ChunkIndex, offsets: set[int]) -> dict[str, list[int]]:
    """The chunks at `offsets` that do not hash to their ids: {id: offsets}."""
    wrong: dict[str, list[int]] = {}
    if index.size == 0:
        return wrong
    with mmap.mmap(fd, index.size, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
        for cid, offset, length in index.spans():
            if offset in offsets and chunk_id(view[offset:offset + length]) != cid:
                wrong.setdefault(cid, []).append(offset)
    return wrong


def _fsync_quietly(fd: int) -> None:
    try:
        os.fsync(fd)  # started early; the caller's own fsync reports any error
    except OSError:
        pass


def _by_chunk(spans: Iterator[tuple[str, int, int]]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for cid, offset, _length in spans:
        grouped.setdefault(cid, []).append(offset)
    return grouped


@contextmanager
def _opened(paths: set[Path]) -> Iterator[dict[Path, int]]:
    """Read descriptors of the seeds that are still regular files (one gone, or swapped for a
    link or a FIFO, is left out: its chunks are downloaded)."""
    fds = {path: fd for path in paths if (fd := open_regular(path)) is not None}
    try:
        yield fds
    finally:
        for fd in fds.values():
            os.close(fd)
