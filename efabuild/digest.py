"""blake3 digests of artifacts, written as "blake3:<64 hex>".

Files are hashed through mmap with blake3's multithreading (a 25 GB .sqsh takes seconds, not
minutes); `Hasher` digests a stream while it is being written, so no second pass is needed.
"""

from __future__ import annotations

import os
from pathlib import Path

import blake3

ALGORITHM = "blake3"
PREFIX = ALGORITHM + ":"
HEX_LENGTH = 64


class Hasher:
    """Streaming digest: feed bytes with `update`, read `digest()` at the end."""

    def __init__(self, *, threads: bool = True) -> None:
        # Multithreading only pays for large updates; blake3 decides per update.
        self._hash = blake3.blake3(max_threads=blake3.blake3.AUTO if threads else 1)
        self.size = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._hash.update(data)
        self.size += len(data)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def digest(self) -> str:
        return PREFIX + self._hash.hexdigest()


def file_digest(path: str | os.PathLike[str]) -> str:
    """The "blake3:<hex>" digest of a file's bytes."""
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    hasher.update_mmap(os.fspath(Path(path)))
    return PREFIX + hasher.hexdigest()


def bytes_digest(data: bytes) -> str:
    return PREFIX + blake3.blake3(data).hexdigest()


def is_digest(text: object) -> bool:
    """True for a well-formed "blake3:<64 lowercase hex>" string."""
    if not isinstance(text, str) or not text.startswith(PREFIX):
        return False
    hex_part = text[len(PREFIX):]
    return len(hex_part) == HEX_LENGTH and all(c in "0123456789abcdef" for c in hex_part)
