"""A layer's tar stream, entry by entry, its bodies read in pieces: a 2 GB file is never held whole.

The names are the export filter's (`tarfilter.norm_path`, the header helpers of `tarheader`);
pax and GNU long names are read bounded (1 MiB of pax records, 64 KiB of name), a name with a
`..` component is an InputError, and what mksquashfs' tar input would not take the same way
(GNU sparse files, multi-volume entries) is `Unsupported`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import BinaryIO

import attrs

from efabuild.errors import EfabuildError, InputError
from efabuild.export.squashfs.tree import Unsupported
from efabuild.export.tarfilter import norm_path
from efabuild.export.tarheader import BLOCK, checksum, has_body, number, padded, parse_pax, ustar_linkname, ustar_name

MAX_PAX = 1 << 20
MAX_LONG_NAME = 64 << 10
MAX_NAME = 256  # squashfs' longest name, as mksquashfs refuses longer ones
_KNOWN = frozenset(bytes([c]) for c in b"01234567")
_PROGRESS_EVERY = 64 << 20


class LayerReadError(EfabuildError):
    """A layer's stream failed while being read."""


@attrs.frozen
class Entry:
    parts: tuple[str, ...]  # the path's components; () for the root
    typeflag: bytes  # b"0" for every regular file
    mode: int
    mtime: float
    size: int
    link: str  # a symlink's target as written; a hard link's as a path
    major: int = 0
    minor: int = 0

    @property
    def path(self) -> str:
        return "/".join(self.parts)


def split_path(name: str, where: str) -> tuple[str, ...]:
    """A tar name as components; a `..` component leads out of the tree and is refused."""
    parts = tuple(p for p in norm_path(name).split("/") if p not in ("", "."))
    if ".." in parts:
        raise InputError(f"entry {name!r} leads out of the tree ('..')", where)
    for part in parts:
        if len(part.encode("utf-8", "surrogateescape")) > MAX_NAME:
            raise InputError(f"entry {name!r} has a name longer than {MAX_NAME} bytes", where)
    return parts


class LayerReader:
    """Iterate `entries()`; for a regular file, `read(n)` its body before the next entry."""

    def __init__(self, f: BinaryIO, where: str, progress: Callable[[int], None] | None = None,
                 consumed: int = 0) -> None:
        self.f, self.where = f, where
        self.left = 0  # body bytes of the current entry not read yet
        self.pad = 0
        self.consumed = consumed  # over all layers, for `progress`
        self._progress, self._next = progress, consumed + _PROGRESS_EVERY

    def _read(self, n: int) -> bytes:
        try:
            return self.f.read(n)
        except OSError as exc:  # the stream's source broke (a registry, a pipe)
            raise LayerReadError(f"{self.where}: cannot read it: {exc.strerror or exc}") from None

    def _exact(self, n: int) -> bytes:
        parts, want = [], n
        while want:
            chunk = self._read(min(want, 1 << 20))
            if not chunk:
                raise InputError(f"the layer's tar stream ended {want} bytes early", self.where)
            parts.append(chunk)
            want -= len(chunk)
        self.consumed += n
        if self._progress and self.consumed >= self._next:
            self._next = self.consumed + _PROGRESS_EVERY
            self._progress(self.consumed)
        return b"".join(parts)

    def read(self, n: int) -> bytes:
        n = min(n, self.left)
        self.left -= n
        return self._exact(n)

    def _skip_rest(self) -> None:
        while self.left:
            self.read(1 << 20)
        self._exact(self.pad)
        self.pad = 0

    def entries(self) -> Iterator[Entry]:
        pax: dict[str, str] = {}
        long_name = long_link = None
        while True:
            self._skip_rest()
            header = self._read(BLOCK)
            if len(header) < BLOCK and not header:
                return  # no end-of-archive blocks: the stream just ends
            if len(header) < BLOCK:
                header += self._exact(BLOCK - len(header))
            self.consumed += len(header)
            if not any(header):
                return
            try:
                if number(header[148:156]) != checksum(header):
                    raise ValueError("checksum")
                kind, size = header[156:157], number(header[124:136])
            except ValueError:
                raise InputError("the layer's tar stream has a corrupt header", self.where) from None
            if kind in (b"x", b"g", b"L", b"K"):
                limit = MAX_PAX if kind in (b"x", b"g") else MAX_LONG_NAME
                if size > limit:
                    raise InputError(f"a tar extension header of {size} bytes (at most {limit})", self.where)
                data = self._exact(padded(size))[:size]
                if kind == b"x":
                    pax.update(self._pax(data))
                elif kind == b"L":
                    long_name = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
                elif kind == b"K":
                    long_link = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
                continue  # a global header (g) sets nothing an export keeps
            try:
                entry = self._entry(bytearray(header), kind, size, pax, long_name, long_link)
            except ValueError:
                raise InputError("the layer's tar stream has a corrupt header", self.where) from None
            pax, long_name, long_link = {}, None, None
            if has_body(entry.typeflag):
                self.left, self.pad = entry.size, padded(entry.size) - entry.size
            yield entry

    def _pax(self, data: bytes) -> dict[str, str]:
        try:
            records = parse_pax(data)
        except (ValueError, IndexError):
            raise InputError("the layer's tar stream has a malformed pax header", self.where) from None
        if any(key.startswith("GNU.sparse") for key in records):
            raise Unsupported("a layer holds a sparse file (GNU.sparse)")
        return records

    def _entry(self, header: bytearray, kind: bytes, size: int, pax: dict[str, str], long_name: str | None,
               long_link: str | None) -> Entry:
        if kind == b"\0" or kind == b"7":
            kind = b"0"
        if kind not in _KNOWN:
            raise Unsupported(f"a layer holds a tar entry of type {kind.decode('latin-1')!r}")
        try:
            size = int(pax["size"]) if "size" in pax else size
            mtime = float(pax["mtime"]) if "mtime" in pax else float(number(header[136:148]))
        except ValueError:
            raise InputError("the layer's tar stream has a malformed pax size or mtime", self.where) from None
        if size < 0:
            raise InputError("a tar entry with a negative size", self.where)
        name = pax.get("path") or long_name or ustar_name(header)
        link = pax.get("linkpath") or long_link or ustar_linkname(header)
        major = minor = 0
        if kind in (b"3", b"4"):
            major, minor = number(header[329:337]), number(header[337:345])
        return Entry(split_path(name, self.where), kind, number(header[100:108]) & 0o7777, mtime,
                     size if has_body(kind) else 0, link, major, minor)
