"""blake3 digests of artifacts, written as "blake3:<64 hex>", and their sha256 for other tools.

Files are hashed through mmap with blake3's multithreading (a 25 GB .sqsh takes seconds, not
minutes).
blake3 is what efabuild checks; sha256 (plain hex) is what in-toto and cosign verifiers match,
computed beside blake3 in the same read of the file (`file_digests`).
"""

from __future__ import annotations

import mmap
import os
import threading
from pathlib import Path

import blake3

ALGORITHM = "blake3"
PREFIX = ALGORITHM + ":"
HEX_LENGTH = 64
_SHA256_CHUNK = 8 << 20


def file_digest(path: str | os.PathLike[str]) -> str:
    """The "blake3:<hex>" digest of a file's bytes."""
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    hasher.update_mmap(os.fspath(Path(path)))
    return PREFIX + hasher.hexdigest()


def file_digests(path: str | os.PathLike[str]) -> tuple[str, str]:
    """("blake3:<hex>", "<sha256 hex>") of a file, in one read of its pages.

    One mmap feeds both: sha256 (single-threaded in OpenSSL, the slower of the two) runs in a
    thread of its own while blake3 hashes the same pages here; both release the GIL. The pages are
    read from disk once at most, and right after an export they are still in the page cache.
    """
    import hashlib  # OpenSSL's: loaded where sha256 is wanted, not by every plan

    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            return bytes_digest(b""), hashlib.sha256().hexdigest()
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                sha256 = hashlib.sha256()
                failed: list[BaseException] = []

                def sha256_pass() -> None:
                    try:
                        for start in range(0, size, _SHA256_CHUNK):
                            sha256.update(view[start:start + _SHA256_CHUNK])
                    except BaseException as exc:  # re-raised in the caller's thread
                        failed.append(exc)

                worker = threading.Thread(target=sha256_pass, name="sha256", daemon=True)
                worker.start()
                # one blake3 thread: the other core is busy with sha256
                hasher = blake3.blake3(max_threads=1 if (os.cpu_count() or 1) <= 2 else blake3.blake3.AUTO)
                hasher.update(view)
                worker.join()
                if failed:
                    raise failed[0]
                return PREFIX + hasher.hexdigest(), sha256.hexdigest()
            finally:
                view.release()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file's bytes (what `verify --sha256` compares with the statement)."""
    import hashlib

    sha256 = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_SHA256_CHUNK):
            sha256.update(chunk)
    return sha256.hexdigest()


class Sha256Pass:
    """sha256 of a file computed in a thread, so that other work (the manifest's probe) runs
    meanwhile; right after an export the pages are still in the page cache. `result()` waits."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._value: str | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(os.fspath(path),), name="sha256", daemon=True)
        self._thread.start()

    def _run(self, path: str) -> None:
        try:
            self._value = sha256_file(path)
        except BaseException as exc:  # re-raised by result() in the caller's thread
            self._error = exc

    def result(self) -> str:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value


def bytes_digest(data: bytes) -> str:
    return PREFIX + blake3.blake3(data).hexdigest()


def is_digest(text: object) -> bool:
    """True for a well-formed "blake3:<64 lowercase hex>" string."""
    if not isinstance(text, str) or not text.startswith(PREFIX):
        return False
    hex_part = text[len(PREFIX):]
    return len(hex_part) == HEX_LENGTH and all(c in "0123456789abcdef" for c in hex_part)
