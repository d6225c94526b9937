"""Assemble a chunked artifact from seeds on this node and downloads of the chunks they lack.

A seed is a file here whose chunk index is known (store/chunked/seeds.py). The file is put together in
two steps:

1. place: the target's chunks found in seeds are copied from them in runs (chunks that follow each
   other in both files), in the kernel and, where the filesystem can (XFS with reflink, btrfs),
   by sharing the seed's blocks rather than writing them (host/rangecopy.py); the other chunks are
   downloaded, verified against their ids, and written;
2. check: one read of the result hashes the whole file, on both cores, while it is flushed to
   disk; BLAKE3 being a tree, the 1 MiB units copied from a seed at the same offsets (the
   previous version of an incremental export's child: 99 % of it) are hashed from the seed's
   pages instead, cached where the clone's are not, when the seed is this user's alone and its
   stamp shows it unchanged from before the copy to after the hash (check_digest). A digest that
   matches the index's proves every chunk; one that does not makes a second read hash each chunk
   that came from a seed against its id, so that a seed that changed after it was indexed, or
   lies, only costs a download of the chunks it got wrong, and the whole file is hashed again.

The caller compares the digest returned with the record before anyone may see the file.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import NamedTuple
from contextlib import contextmanager
from pathlib import Path

import attrs
import blake3

from efabuild.chunks.cdc import ChunkIndex, chunk_id
from efabuild.host import statstamp, treecache
from efabuild.host.digest import PREFIX
from efabuild.host.fsutil import open_regular
from efabuild.store.parallel import run_parallel
from efabuild.host.rangecopy import RangeCopier
from efabuild.store.chunked.s3 import ChunkStore, Transfer

RUN_BYTES = 64 * 1024 * 1024  # a run is cut at this size, so both cores copy and clone
UNIT = 1 << 20  # host/blake3tree.py's subtree, whose chaining value a seed lends the check
CV = 32  # bytes of one chaining value


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
    lent: int = 0  # bytes of the file that digest hashed from seeds' pages (check_digest)
    cvs: bytes | None = None  # the values of its whole units, for host/treecache.py (check_digest)


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
        before = settled_stamps(fds)  # before any byte of a seed is copied

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
        copied = [run for run in runs if run not in failed]
        # the digest proves every chunk; each is hashed on its own only when it is wrong, to find what
        # a seed got wrong (changed since indexed, or lying). A seed that ended under a run lends nothing.
        sound = [run for run in copied if run.seed not in {f.seed for f in failed}]
        digest, lent, cvs = check_digest(dest_fd, index.size, sound, fds, before)
    if digest != index.digest:
        wrong = wrong_chunks(dest_fd, index, {offset for run in copied for _, offset, _ in run.spans})
        if wrong:
            run_parallel(fetch, list(wrong.items()), store.tier.workers)
        if wrong or lent:  # a lent digest is the seeds' pages': the file itself is hashed then
            digest, lent, cvs = whole_digest(dest_fd, index.size), 0, None
    reused = {cid for run in copied for cid, _, _ in run.spans} - set(fetched)
    return Assembled(Transfer(chunks=len(fetched), bytes=sum(lengths[c] for c in fetched),
                              wire_bytes=sum(fetched.values()), reused=len(reused),
                              reused_bytes=sum(lengths[c] for c in reused), cloned_bytes=copier.cloned),
                     digest, lent, cvs)


class Checked(NamedTuple):
    digest: str  # "blake3:<hex>" of the file
    lent: int  # bytes of it whose units' values came from seeds rather than from its own pages
    cvs: bytes | None  # the values of its whole units, in order (host/treecache.py); None without the helper


def check_digest(fd: int, size: int, copied: Sequence[Run], seeds: Mapping[Path, int],
                 before: Mapping[Path, tuple[int, ...]]) -> Checked:
    """The digest of the file `fd` just assembled, and how many of its bytes it took from seeds
    rather than from the file: the whole 1 MiB units copied from one seed at the same offsets (an
    incremental child's reused range, from the previous version on this node) take their values
    from the tree this user's fetch of that seed remembered (host/treecache.py), else are hashed
    from the seed, whose pages are cached where a reflinked clone's are not; the rest from the
    file. The file is flushed to disk meanwhile, done when this returns.

    A seed lends only where its bytes cannot have changed unseen since they were hashed: a file
    only this user can write (another user's can be rewritten through a mapping without moving
    its stamp, and truncated under ours: SIGBUS), whose stamp had settled before the copy
    (`before`: settled_stamps) and is the same after the copy and any hash, and that still holds
    the units."""
    from efabuild.host import blake3tree  # deferred: ctypes and the helper, for a chunked fetch alone

    with _flushing(fd):
        lib = blake3tree.installed()
        if lib is None:
            return Checked(_hashed(fd, size), 0, None)
        units = _lendable(copied, size, seeds, before)
        values = _lent_values(lib, units, seeds, before) if units else {}
        tree = blake3tree.tree_with(lib, fd, values)
        return Checked(tree.digest, len(values) * UNIT, tree.cvs)


def settled_stamps(seeds: Mapping[Path, int]) -> dict[Path, tuple[int, ...]]:
    """The stat stamps of the open seeds that had settled (no change for RACY_WINDOW_NS), taken
    before any of their bytes is copied: one unchanged after a seed's pages were hashed means the
    bytes hashed are those copied. A stamp taken sooner after a change may not move at a second
    write within the clock's step: that seed lends nothing."""
    now = statstamp.clock_ns()
    stamps = {path: statstamp.stamp(os.fstat(fd)) for path, fd in seeds.items()}
    return {path: stamp for path, stamp in stamps.items() if statstamp.settled(stamp, now)}


def lent_units(copied: Sequence[Run], size: int) -> dict[Path, list[int]]:
    """The whole units of a `size`-byte file that lie in bytes copied from one seed at the same
    offsets ({seed: unit numbers}); runs that follow each other in both are one range."""
    ranges: dict[Path, list[list[int]]] = {}
    for run in sorted((r for r in copied if r.source == r.dest), key=lambda r: r.dest):
        spans = ranges.setdefault(run.seed, [])
        if spans and spans[-1][1] == run.dest:
            spans[-1][1] = run.dest + run.length
        else:
            spans.append([run.dest, run.dest + run.length])
    units: dict[Path, list[int]] = {}
    for seed, spans in ranges.items():
        numbers = [n for start, end in spans for n in range(-(-start // UNIT), min(end, size) // UNIT)]
        if numbers:
            units[seed] = numbers
    return units


def _lendable(copied: Sequence[Run], size: int, seeds: Mapping[Path, int],
              before: Mapping[Path, tuple[int, ...]]) -> dict[Path, list[int]]:
    """lent_units() of the seeds only this user can write whose settled stamp was taken (`before`)."""
    units = lent_units(copied, size)
    return {path: numbers for path, numbers in units.items()
            if path in before and not statstamp.others_may_write(os.fstat(seeds[path]))}


def _lent_values(lib, units: Mapping[Path, list[int]], seeds: Mapping[Path, int],  # noqa: ANN001 - a CDLL
                 before: Mapping[Path, tuple[int, ...]]) -> dict[int, bytes]:
    """The chaining values of the units each seed lends, hashed from its descriptor; none of a
    seed shortened, or changed in any way since its stamp was taken before the copy."""
    from efabuild.host import blake3tree  # deferred: ctypes, as in check_digest

    values: dict[int, bytes] = {}
    for path, numbers in units.items():
        got = _remembered(seeds[path], numbers, before[path]) or blake3tree.unit_values(lib, seeds[path], numbers)
        if got is not None and statstamp.stamp(os.fstat(seeds[path])) == before[path]:
            values.update(got)
    return values


def _remembered(fd: int, numbers: Sequence[int], stamp: tuple[int, ...]) -> dict[int, bytes] | None:
    """The values of the units `numbers` of the open seed from the tree its fetch remembered, if
    that tree is of the seed as its settled stamp `stamp` shows it."""
    found = treecache.recall(fd)
    if found is None or statstamp.stamp(os.fstat(fd)) != stamp:
        return None
    cvs = found[1]
    if (max(numbers) + 1) * CV > len(cvs):
        return None
    return {n: cvs[n * CV:(n + 1) * CV] for n in numbers}


def whole_digest(fd: int, size: int) -> str:
    """The "blake3:<hex>" digest of the file's first `size` bytes, hashed on both cores through a
    mapping while the file is flushed to disk."""
    with _flushing(fd):
        return _hashed(fd, size)


def _hashed(fd: int, size: int) -> str:
    whole = blake3.blake3(max_threads=blake3.blake3.AUTO)
    if size:
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mapped:
            # blocks cloned from a seed are not in the page cache: read ahead in large requests
            mapped.madvise(mmap.MADV_SEQUENTIAL)
            whole.update(mapped)
    return PREFIX + whole.hexdigest()


@contextmanager
def _flushing(fd: int) -> Iterator[None]:
    """The file flushed to disk on a thread while the body hashes it; done on leaving."""
    flush = threading.Thread(target=_fsync_quietly, args=(fd,), daemon=True)
    flush.start()
    try:
        yield
    finally:
        flush.join()


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
