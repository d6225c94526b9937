"""blake3 digests of artifacts, written as "blake3:<64 hex>", and their sha256 for other tools.

Files are hashed through mmap with blake3's multithreading (a 25 GB .sqsh takes seconds, not
minutes); one that someone else could truncate meanwhile is read instead (file_digest).
blake3 is what efabuild checks; sha256 (plain hex) is what in-toto and cosign verifiers match,
computed beside blake3 in the same read of the file (`file_digests`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import blake3

from efabuild.host.statstamp import others_may_write

ALGORITHM = "blake3"
PREFIX = ALGORITHM + ":"
HEX_LENGTH = 64
_SHA256_CHUNK = 8 << 20  # bytes read at once where a file is read, not mapped
# bytes of a mapping hashed per call: the call releases the GIL, and each new one waits for it
# again behind the Python of other threads (the probe's, botocore's): 8 MiB calls took a 1.4 GB
# sha256 from 1.0 s to 2.0 s beside a busy thread, 128 MiB ones to 1.1 s
_MAPPED_PIECE = 128 << 20


def file_digest(path: str | os.PathLike[str]) -> str:
    """The "blake3:<hex>" digest of a file's bytes: mapped, or read where someone else could
    truncate it meanwhile (mapped pages past a new end kill the reader with SIGBUS: a copy's
    owner in a shared tier could end a root `audit` or a job's start so)."""
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    fd = os.open(os.fspath(Path(path)), os.O_RDONLY | os.O_CLOEXEC)  # no O_NOFOLLOW: /proc/self/fd/N
    try:
        if not others_may_write(os.fstat(fd)):
            hasher.update_mmap(f"/proc/self/fd/{fd}")  # the very file just opened
        else:
            for piece in read_pieces(fd, 0, None):
                hasher.update(piece)
    finally:
        os.close(fd)
    return PREFIX + hasher.hexdigest()


def read_pieces(fd: int, start: int, end: int | None) -> Iterator[memoryview]:
    """The bytes [start, end) of the open file (to its end with None), in pieces of one reused
    buffer (each is valid until the next is taken); fewer where the file ends sooner."""
    buffer = bytearray(_SHA256_CHUNK)
    while end is None or start < end:
        view = memoryview(buffer)[:_SHA256_CHUNK if end is None else min(_SHA256_CHUNK, end - start)]
        n = os.preadv(fd, [view], start)
        if not n:
            return
        yield view[:n]
        start += n


def file_digests(path: str | os.PathLike[str]) -> tuple[str, str]:
    """("blake3:<hex>", "<sha256 hex>") of a file, in one read of its pages (_digests_of)."""
    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:  # mmap refuses an empty file
            return _digests_of([], True)
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                return _digests_of([view], True)
            finally:
                view.release()


def _digests_of(pieces: list[memoryview], with_sha256: bool) -> tuple[str, str | None]:
    """blake3 of the pieces in order, and their sha256 (or None) from the same pages.

    sha256 (single-threaded in OpenSSL, the slower of the two) runs in a thread of its own while
    blake3 hashes the same pages here; both release the GIL. The pages are read from disk once at
    most, and right after an export they are still in the page cache.
    """
    sha256 = _new_sha256() if with_sha256 else None
    failed: list[BaseException] = []

    def sha256_pass() -> None:
        try:
            _sha256_update(sha256, pieces)
        except BaseException as exc:  # re-raised in the caller's thread
            failed.append(exc)

    worker = threading.Thread(target=sha256_pass, name="sha256", daemon=True) if sha256 is not None else None
    if worker is not None:
        worker.start()
    busy = worker is not None and (os.cpu_count() or 1) <= 2  # the other core is sha256's
    hasher = blake3.blake3(max_threads=1 if busy else blake3.blake3.AUTO)
    for piece in pieces:
        hasher.update(piece)
    if worker is not None:
        worker.join()
    if failed:
        raise failed[0]
    return PREFIX + hasher.hexdigest(), sha256.hexdigest() if sha256 is not None else None


class Abandoned(Exception):
    """A Sha256Pass stopped before its end: its result was no longer wanted."""


def _sha256_update(sha256, pieces: list[memoryview], stop: threading.Event | None = None) -> None:  # noqa: ANN001 - a hashlib object
    for piece in pieces:
        for start in range(0, len(piece), _MAPPED_PIECE):
            if stop is not None and stop.is_set():
                raise Abandoned
            sha256.update(piece[start:start + _MAPPED_PIECE])


class Splice(NamedTuple):
    """Bytes [start, end) of a file are those of `source` at the same offsets: they were copied or
    cloned from it (an incremental export's ancestor prefix). Hashing the file reads them from
    `source`, whose pages are cached where a clone's are not (a reflinked range shares the disk
    blocks, not the page cache), and an index of `source` may lend its chunks there."""

    source: str  # a path to the source file (the ancestor's checked descriptor)
    start: int
    end: int


@contextlib.contextmanager
def spliced_maps(path: str | os.PathLike[str], splice: Splice) -> Iterator[tuple[memoryview, memoryview]]:
    """The file and the splice's source, each mapped whole; ValueError when the range passes the
    end of either (a caller's mistake, not an input's)."""
    with contextlib.ExitStack() as stack:
        views = []
        for name in (os.fspath(path), splice.source):
            fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC)
            stack.callback(os.close, fd)
            size = os.fstat(fd).st_size
            if size < splice.end or not 0 <= splice.start <= splice.end:
                raise ValueError(f"{name}: {size} bytes, outside the splice {splice.start}..{splice.end}")
            view = memoryview(stack.enter_context(mmap.mmap(fd, 0, access=mmap.ACCESS_READ)) if size else b"")
            stack.callback(view.release)
            views.append(view)
        yield views[0], views[1]


def splice_pieces(own: memoryview, source: memoryview, splice: Splice) -> list[memoryview]:
    """The file's bytes in order as slices: [start, end) from the source, the rest its own."""
    pieces = [own[:splice.start], source[splice.start:splice.end], own[splice.end:]]
    return [piece for piece in pieces if len(piece)]


def spliced_digests(path: str | os.PathLike[str], splice: Splice, with_sha256: bool) -> tuple[str, str | None]:
    """file_digests() (or file_digest() and None) of a file whose splice range is read from its source."""
    with spliced_maps(path, splice) as (own, source):
        pieces = splice_pieces(own, source, splice)
        try:
            return _digests_of(pieces, with_sha256)
        finally:
            for piece in pieces:
                piece.release()


def _new_sha256():  # noqa: ANN202 - a hashlib sha256 object
    """OpenSSL's sha256. hashlib is loaded here, where sha256 is wanted: a plan loads this module
    and hashes nothing with it."""
    import hashlib

    return hashlib.sha256()


def _spliced_sha256(path: str, splice: Splice, stop: threading.Event | None = None) -> str:
    sha256 = _new_sha256()
    with spliced_maps(path, splice) as (own, source):
        pieces = splice_pieces(own, source, splice)
        try:
            _sha256_update(sha256, pieces, stop)
        finally:
            for piece in pieces:
                piece.release()
    return sha256.hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file's bytes (what `verify --sha256` compares with the statement)."""
    sha256 = _new_sha256()
    with open(path, "rb") as handle:
        info = os.fstat(handle.fileno())
        if info.st_size and not others_may_write(info):  # mapped: few calls (_MAPPED_PIECE)
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
                _sha256_update(sha256, [view])
            return sha256.hexdigest()
        for piece in read_pieces(handle.fileno(), 0, None):  # one someone could truncate: read (SIGBUS)
            sha256.update(piece)
    return sha256.hexdigest()


class Sha256Pass:
    """sha256 of a file computed in a thread, so that other work (the manifest's probe, or the
    copy of an incremental export's reused range) runs meanwhile; right after an export the pages
    are still in the page cache. `result()` waits; `abandon()` stops it at its next 8 MiB.

    `holding`: a descriptor of the file, which `path` names as /proc/self/fd/N (a temp file that
    may be renamed or unlinked meanwhile), closed when the pass ends."""

    def __init__(self, path: str | os.PathLike[str], splice: Splice | None = None, *,
                 holding: int | None = None) -> None:
        self._value: str | None = None
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._holding = holding
        self.splice = splice
        self._thread = threading.Thread(target=self._run, args=(os.fspath(path), splice), name="sha256", daemon=True)
        self._thread.start()

    def _run(self, path: str, splice: Splice | None) -> None:
        try:
            self._value = sha256_file(path) if splice is None else _spliced_sha256(path, splice, self._stop)
        except BaseException as exc:  # re-raised by result() in the caller's thread
            self._error = exc
        finally:
            if self._holding is not None:
                os.close(self._holding)

    def result(self) -> str:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value

    def abandon(self) -> None:
        """Stop the pass (its result is not wanted) and wait for it to let go of the file."""
        self._stop.set()
        self._thread.join()


def bytes_digest(data: bytes) -> str:
    return PREFIX + blake3.blake3(data).hexdigest()


def is_digest(text: object) -> bool:
    """True for a well-formed "blake3:<64 lowercase hex>" string."""
    if not isinstance(text, str) or not text.startswith(PREFIX):
        return False
    hex_part = text[len(PREFIX):]
    return len(hex_part) == HEX_LENGTH and all(c in "0123456789abcdef" for c in hex_part)
