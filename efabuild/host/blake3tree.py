"""BLAKE3 digests assembled from the chaining values of 1 MiB subtrees, so that a file which
reuses another's bytes at the same offsets is hashed from that file's subtrees plus its own new
bytes (an incremental export's child: its ancestor's data region, cloned or copied, is 99 % of it;
and that child fetched onto a node holding the previous version, hashed from its pages).

BLAKE3 is a tree over 1 KiB chunks. A subtree's chaining value depends only on its bytes and on the
chunk it starts at; every aligned 1 MiB unit that lies inside a file is a node of the file's tree,
and so is what follows the last whole unit. The digest is therefore the root over the units' values,
merged as BLAKE3 splits (the largest power of two of chunks on the left), with the root flag on the
last merge: the digest `blake3.blake3` gives, which the tests compare at every split.

The Python binding does not expose chaining values; native/blake3cv.c does, built by
scripts/build-native.sh against the BLAKE3 C sources Debian ships. Where it is not built, `native()`
is None and callers hash the file whole, as before: slower, never different.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import stat
import threading
from collections.abc import Callable, Sequence

import blake3

from efabuild.host import statstamp
from efabuild.host.digest import PREFIX

LIBRARY_ENV = "EFABUILD_BLAKE3_LIB"
DEFAULT_LIBRARY = "/usr/local/lib/efabuild/libblake3cv.so"
UNIT = 1 << 20  # bytes of one subtree whose chaining value is kept: 1024 chunks
CHUNK = 1024
CV = 32


@functools.cache
def native() -> ctypes.CDLL | None:
    """The built helper ($EFABUILD_BLAKE3_LIB, else the installed one), or None (not built here,
    not loadable, or one that another user could have written: loading a library runs its code as
    this user, who may be root)."""
    return _load(os.environ.get(LIBRARY_ENV) or DEFAULT_LIBRARY)


@functools.cache
def installed() -> ctypes.CDLL | None:
    """native() from its installed path alone, whatever $EFABUILD_BLAKE3_LIB names: what a fetch
    from S3 loads, which the Pyxis importer runs in the environment the job's user sets."""
    return _load(DEFAULT_LIBRARY)


def _load(path: str) -> ctypes.CDLL | None:
    try:
        # the very file checked is the one loaded, whatever is renamed over its name meanwhile
        fd = os.open(os.path.realpath(path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        lib = ctypes.CDLL(f"/proc/self/fd/{fd}") if _trusted(fd) else None
    except OSError:
        lib = None
    if lib is None:
        os.close(fd)
        return None
    # left open for the process: the loader hands back what it loaded under a name before, and
    # /proc/self/fd/N free again would name the next library checked (installed() after native())
    u64, size = ctypes.c_uint64, ctypes.c_size_t
    try:
        functions = (lib.efabuild_subtree_cv, lib.efabuild_unit_cvs, lib.efabuild_parent)
    except AttributeError:  # another library, or a helper built before one of them: hashed whole
        return None
    lib.efabuild_subtree_cv.argtypes = [ctypes.c_void_p, size, u64, ctypes.c_char_p]
    lib.efabuild_unit_cvs.argtypes = [ctypes.c_void_p, size, size, u64, ctypes.c_char_p]
    lib.efabuild_parent.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
    for fn in functions:
        fn.restype = None
    return lib


def _trusted(fd: int) -> bool:
    """Whether the open library is a regular file that root or this user owns, in a directory
    they own, neither writable by anyone else (the verification cache's rule)."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid not in (0, os.geteuid()) or info.st_mode & 0o022:
        return False
    try:
        parent = os.stat(os.path.dirname(os.readlink(f"/proc/self/fd/{fd}")))
    except OSError:
        return False
    return parent.st_uid in (0, os.geteuid()) and not parent.st_mode & 0o022


class Tree:
    """A file's digest and the chaining values of its whole 1 MiB units, in file order; `stamp`:
    the stat stamp of the file they were taken from (host/statstamp.py)."""

    __slots__ = ("size", "digest", "cvs", "stamp")

    def __init__(self, size: int, digest: str, cvs: bytes, stamp: tuple[int, ...] = ()) -> None:
        self.size, self.digest, self.cvs, self.stamp = size, digest, cvs, stamp

    def unit(self, number: int) -> bytes:
        return self.cvs[number * CV:(number + 1) * CV]

    def describes(self, path: str | os.PathLike[str]) -> bool:
        """Whether these are the values of the file at `path` (the same file, unchanged since):
        another file's tree, passed by mistake, would give a digest of bytes it does not hold."""
        try:
            info = os.stat(path)
        except OSError:
            return False
        return bool(self.stamp) and statstamp.stamp(info) == tuple(self.stamp) and info.st_size == self.size


class _Mapped:
    """A file mapped copy-on-write (never written: ctypes needs a writable buffer to take its
    address) with the address of its first byte."""

    def __init__(self, fd: int, sequential: bool = False) -> None:
        info = os.fstat(fd)
        self.size, self.stamp = info.st_size, statstamp.stamp(info)
        self._map = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY) if self.size else None
        if sequential and self._map is not None:
            self._map.madvise(mmap.MADV_SEQUENTIAL)
        self._array = (ctypes.c_char * self.size).from_buffer(self._map) if self._map is not None else None
        self.base = ctypes.addressof(self._array) if self._array is not None else 0

    def close(self) -> None:
        self._array = None  # the map cannot close while ctypes holds it
        if self._map is not None:
            self._map.close()


def _open(path: str | os.PathLike[str]) -> _Mapped:
    # no O_NOFOLLOW: a checked copy is handed on as /proc/self/fd/N
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _Mapped(fd)
    finally:
        os.close(fd)


def _unit_cvs(lib: ctypes.CDLL, mapped: _Mapped, units: Sequence[int]) -> dict[int, bytes]:
    """Chaining values of the given whole units, on two threads when there are many (the calls
    release the GIL)."""
    numbers = list(units)
    out = ctypes.create_string_buffer(len(numbers) * CV)
    runs = _runs(numbers)

    def hash_runs(part: list[tuple[int, int, int]]) -> None:
        for slot, first, count in part:
            lib.efabuild_unit_cvs(mapped.base + first * UNIT, UNIT, count, first * (UNIT // CHUNK),
                                  ctypes.cast(ctypes.addressof(out) + slot * CV, ctypes.c_char_p))

    halves = _split(runs, len(numbers) // 2) if len(numbers) >= 64 else [runs, []]
    worker = threading.Thread(target=hash_runs, args=(halves[1],), name="blake3-units", daemon=True)
    worker.start()
    hash_runs(halves[0])
    worker.join()
    raw = out.raw
    return {number: raw[i * CV:(i + 1) * CV] for i, number in enumerate(numbers)}


def _runs(numbers: list[int]) -> list[tuple[int, int, int]]:
    """(slot in the output, first unit, count) for each run of consecutive unit numbers."""
    runs: list[tuple[int, int, int]] = []
    for slot, number in enumerate(numbers):
        if runs and runs[-1][1] + runs[-1][2] == number:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((slot, number, 1))
    return runs


def _split(runs: list[tuple[int, int, int]], first_half: int) -> list[list[tuple[int, int, int]]]:
    """The runs cut in two parts of about `first_half` units and the rest."""
    head: list[tuple[int, int, int]] = []
    tail: list[tuple[int, int, int]] = []
    taken = 0
    for slot, first, count in runs:
        if taken >= first_half:
            tail.append((slot, first, count))
            continue
        here = min(count, first_half - taken)
        head.append((slot, first, here))
        if here < count:
            tail.append((slot + here, first + here, count - here))
        taken += here
    return [head, tail]


def _root(lib: ctypes.CDLL, mapped: _Mapped, unit_cv: Callable[[int], bytes]) -> str:
    """The digest of the mapped file, whose whole units' chaining values `unit_cv` gives."""
    size = mapped.size
    chunks = max(1, -(-size // CHUNK))
    if chunks == 1:  # one chunk is its own root: the binding hashes it
        return PREFIX + blake3.blake3(ctypes.string_at(mapped.base, size) if size else b"").hexdigest()
    whole_units = size // UNIT
    per_unit = UNIT // CHUNK

    def node(first: int, count: int) -> bytes:
        if count == per_unit and first % per_unit == 0 and first // per_unit < whole_units:
            return unit_cv(first // per_unit)
        if count <= per_unit:  # what follows the last whole unit (or a file smaller than one)
            out = ctypes.create_string_buffer(CV)
            start = first * CHUNK
            lib.efabuild_subtree_cv(mapped.base + start, min(size, (first + count) * CHUNK) - start, first, out)
            return out.raw
        left = 1 << ((count - 1).bit_length() - 1)  # the largest power of two below count
        return _parent(lib, node(first, left), node(first + left, count - left), False)

    left = 1 << ((chunks - 1).bit_length() - 1)
    return PREFIX + _parent(lib, node(0, left), node(left, chunks - left), True).hex()


def _parent(lib: ctypes.CDLL, left: bytes, right: bytes, root: bool) -> bytes:
    out = ctypes.create_string_buffer(CV)
    lib.efabuild_parent(left, right, int(root), out)
    return out.raw


def file_tree(path: str | os.PathLike[str]) -> Tree | None:
    """The file's digest with its units' chaining values, in one read; None without the helper."""
    return _assemble(path, lambda whole: {})


def spliced_digest(path: str | os.PathLike[str], start: int, end: int, source: Tree) -> str | None:
    """The digest of a file whose bytes [start, end) are those of the file `source` describes, at
    the same offsets: the units inside that range are the source's, only the rest is hashed. None
    without the helper."""
    def lent(whole: int) -> dict[int, bytes]:
        inside = min(end, source.size)
        return {n: source.unit(n) for n in range(whole)
                if start <= n * UNIT and (n + 1) * UNIT <= inside and (n + 1) * CV <= len(source.cvs)}

    tree = _assemble(path, lent)
    return tree.digest if tree is not None else None


def _assemble(path: str | os.PathLike[str], lent: Callable[[int], dict[int, bytes]]) -> Tree | None:
    """The file's tree, its units' values taken from `lent(units)` where it has them and hashed
    from the file for the rest; None without the helper."""
    lib = native()
    if lib is None:
        return None
    mapped = _open(path)
    try:
        return _tree(lib, mapped, lent)
    finally:
        mapped.close()


def _tree(lib: ctypes.CDLL, mapped: _Mapped, lent: Callable[[int], dict[int, bytes]]) -> Tree:
    whole = mapped.size // UNIT
    cvs = lent(whole)
    cvs.update(_unit_cvs(lib, mapped, [n for n in range(whole) if n not in cvs]))
    digest = _root(lib, mapped, cvs.__getitem__)
    return Tree(mapped.size, digest, b"".join(cvs[n] for n in range(whole)), mapped.stamp)


def unit_values(lib: ctypes.CDLL, fd: int, units: Sequence[int]) -> dict[int, bytes] | None:
    """The chaining values of whole units of the open file (mapped: for a file only this user can
    truncate); None where it no longer holds them all."""
    mapped = _Mapped(fd)
    try:
        if units and (max(units) + 1) * UNIT > mapped.size:
            return None
        return _unit_cvs(lib, mapped, units)
    finally:
        mapped.close()


def tree_with(lib: ctypes.CDLL, fd: int, lent: dict[int, bytes]) -> Tree:
    """The tree of the open file whose units in `lent` (whole ones) have those chaining values:
    only the rest of it is read, ahead in large requests (blocks cloned from another file are
    not in the page cache)."""
    mapped = _Mapped(fd, sequential=True)
    try:
        return _tree(lib, mapped, lambda whole: {n: cv for n, cv in lent.items() if n < whole})
    finally:
        mapped.close()


def tree_from(lib: ctypes.CDLL, fd: int, cvs: bytes) -> Tree | None:
    """The tree of the open file whose whole units have the values `cvs` (a tree remembered for
    it, host/treecache.py): only what follows the last whole unit is read. Its digest is the
    file's only if `cvs` are its units' values, which the caller checks against the digest it
    expects; None for values of another number of units."""
    mapped = _Mapped(fd)
    try:
        if len(cvs) != (mapped.size // UNIT) * CV:
            return None
        return Tree(mapped.size, _root(lib, mapped, lambda n: cvs[n * CV:(n + 1) * CV]), cvs, mapped.stamp)
    finally:
        mapped.close()


def digest_with(lib: ctypes.CDLL, fd: int, lent: dict[int, bytes]) -> str:
    """tree_with()'s digest."""
    return tree_with(lib, fd, lent).digest
