"""Copying one artifact from one tier to others: the single way bytes move between tiers.

make's "copy between tiers" (`Store.complete`), publishing past the first tier (`Store.publish`)
and fetching from S3 (`Store.fetch`) all call `transfer`. Its source is verified against its own
record before anything is copied (size first: a stat; then the blake3 digest), so a damaged copy
is never spread as good under a correct record. An S3 source is verified by downloading it (the
download checks the digest before the file is used).

An artifact is its `.sqsh`, its record, and the files listed in `SIDECARS`, which travel with it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from efabuild import notices
from efabuild.host.digest import bytes_digest, file_digest
from efabuild.errors import EfabuildError, NotFound
from efabuild.host import fsutil, statstamp, treecache
from efabuild.store.layout import ENVELOPE_SUFFIX, INDEX_SUFFIX, MANIFEST_SUFFIX
from efabuild.refs import short
from efabuild.chunks.cdc import ChunkIndex
from efabuild.store.record import ArtifactRecord

if TYPE_CHECKING:
    from efabuild.host.blake3tree import Tree

# Files stored beside each .sqsh and carried with it, in the order tiers write them; and the record
# field that holds each one's digest (None: carried as it is).
# The chunk index is checked by whoever uses it (against the record, and chunk by chunk).
SIDECARS: dict[str, str | None] = {MANIFEST_SUFFIX: "manifest_digest", ENVELOPE_SUFFIX: None, INDEX_SUFFIX: None}


# refuses an artifact (raises) from its record and sidecars, before any byte of it is copied
Vet = Callable[[ArtifactRecord, dict[str, bytes]], None]


class DamagedCopy(EfabuildError):
    """A tier's copy of an artifact does not match its record."""

    def __init__(self, tier: str, where: str, problem: str) -> None:
        self.tier = tier
        super().__init__(f"{tier} tier: {where}: corrupt artifact: {problem}")


class Copy(NamedTuple):
    """An artifact's files as one tier holds them, verified: a .sqsh file, its record, sidecars."""

    key: str
    tier: str
    sqsh: Path
    record: ArtifactRecord
    sidecars: dict[str, bytes]
    # its chunk index as this process computed it from the bytes (an export's); a stored one
    # travels among the sidecars, unchecked
    index: ChunkIndex | None = None

    @property
    def manifest(self) -> bytes | None:
        return self.sidecars.get(MANIFEST_SUFFIX)

    @property
    def envelope(self) -> bytes | None:
        """The signed statement; whoever verifies checks it (it names the bytes it signs)."""
        return self.sidecars.get(ENVELOPE_SUFFIX)


def pinned_path(fd: int) -> Path:
    """A path to the very file open as `fd`, whatever has been renamed over its name since."""
    return Path(f"/proc/self/fd/{fd}")


def check_file(tier: str, path: Path, record: ArtifactRecord) -> None:
    """DamagedCopy unless `path` has the size and blake3 digest its record says (size first). The
    file is opened once, never through a link nor waiting on a FIFO, and that open file is hashed:
    one swapped for a FIFO between the stat and the read would hold the check (and a job's start)."""
    os.close(open_checked(tier, path, record))


def open_checked(tier: str, path: Path, record: ArtifactRecord) -> int:
    """check_file(), returning the checked file open (a descriptor the caller closes): whoever
    reads it next reads the bytes that were checked, whatever is renamed over `path` since."""
    return open_checked_stamped(tier, path, record, with_tree=False).fd


class Checked(NamedTuple):
    fd: int
    stamp: tuple[int, ...]  # taken before its bytes were hashed
    tree: Tree | None  # its units' chaining values, from the same read (None without the helper)


def open_checked_stamped(tier: str, path: Path, record: ArtifactRecord, *, with_tree: bool = False) -> Checked:
    """open_checked(), with the file's stat stamp taken before its bytes were hashed (one unchanged
    later means the bytes read then are the checked ones, host/statstamp.py, for a file only this
    user can write) and, `with_tree` and where host/blake3tree.py can, the chaining values that
    hash gave: a file reusing its bytes is hashed from them. Only make's ancestor check asks for
    them: no other command (the Pyxis importer, whose environment the job's user sets; gc; audit)
    loads the native helper."""
    try:
        info = path.lstat()  # a link planted in a store is not an artifact, whatever it points at
    except OSError as exc:
        raise DamagedCopy(tier, str(path), f"cannot read it ({exc.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise DamagedCopy(tier, str(path), "not a regular file")
    if info.st_size != record.size:
        raise DamagedCopy(tier, str(path), f"{info.st_size} bytes, its record says {record.size}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:  # ELOOP: a link put there since the stat
        raise DamagedCopy(tier, str(path), f"cannot read it ({exc.strerror})") from None
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            raise DamagedCopy(tier, str(path), "not a regular file")
        try:
            # another user's file is mapped by no native code: truncated meanwhile, a mapped page
            # past its end would kill this process (SIGBUS), and its tree is not used (incremental.reuse)
            tree = _check_open(tier, path, fd, record, with_tree=with_tree and not statstamp.others_may_write(opened))
        except OSError as exc:
            raise DamagedCopy(tier, str(path), f"cannot read it ({exc.strerror})") from None
    except BaseException:
        os.close(fd)
        raise
    return Checked(fd, statstamp.stamp(opened), tree)


def _check_open(tier: str, path: Path, fd: int, record: ArtifactRecord, *, with_tree: bool = False) -> Tree | None:
    """check_file() of the file open as `fd` (named `path` in messages); `with_tree`: its chaining
    values too, where they can be had from the same read."""
    size = os.fstat(fd).st_size
    if size != record.size:
        raise DamagedCopy(tier, str(path), f"{size} bytes, its record says {record.size}")
    tree = None
    if with_tree:
        tree = _remembered_tree(fd, record)
        if tree is not None:
            return tree
        from efabuild.host.blake3tree import file_tree  # ctypes: only for an ancestor's check

        tree = file_tree(pinned_path(fd))
    actual = tree.digest if tree is not None else file_digest(pinned_path(fd))
    if actual != record.digest:
        raise DamagedCopy(tier, str(path), f"digest {actual}, its record says {record.digest}")
    if tree is not None:  # the next make's check of the same file, unchanged, reads none of it
        opened = os.fstat(fd)
        treecache.remember(path, (opened.st_dev, opened.st_ino), tree.digest, tree.cvs)
    return tree


def _remembered_tree(fd: int, record: ArtifactRecord) -> Tree | None:
    """The tree a fetch or an earlier check remembered for the open file as it is now, once its
    values make the record's digest (host/treecache.py); else None."""
    from efabuild.host import blake3tree  # ctypes: only for an ancestor's check

    found = treecache.recall(fd)
    lib = blake3tree.native() if found is not None and found[0] == record.digest else None
    tree = blake3tree.tree_from(lib, fd, found[1]) if lib is not None else None
    return tree if tree is not None and tree.digest == record.digest else None


def fetch_into(tier: str, dest: Path, record: ArtifactRecord, what: str,
               fill: Callable[[int], str | None]) -> tuple[int, int]:
    """Create `dest`, let `fill` write it (from `what`, on `tier`), and check the whole file against
    its record before anyone may see it; on any failure (or a digest that differs) `dest` is
    removed. `fill` returns the digest of what it wrote when it hashed the file itself. Returns
    the (device, inode) of the file checked: whatever is renamed over its name later is not it.

    The record's size is all a fetch may write (no more is asked of `fill`), and it must fit in
    the filesystem's free space: a record in a bucket others write may claim any size, and only
    the digest at the end tells its bytes are wrong."""
    try:
        info = os.statvfs(dest.parent)
    except OSError as exc:
        raise EfabuildError(f"{dest.parent}: {exc.strerror}; {what} not fetched") from None
    free = info.f_bavail * info.f_frsize
    if record.size > free:
        raise EfabuildError(f"{dest.parent}: {record.size} bytes needed, {free} bytes free; {what} not fetched")
    fd = os.open(dest, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        actual = fill(fd)
        os.fsync(fd)
    except BaseException as exc:
        os.close(fd)
        dest.unlink(missing_ok=True)
        if isinstance(exc, OSError):  # no room (ENOSPC), or more than one file may hold here (EFBIG)
            raise EfabuildError(f"{dest}: {exc.strerror}; {what} not fetched") from None
        raise
    try:
        checked = os.fstat(fd)
        # the file written, through its descriptor: in a shared tier's tmp/ another user may
        # rename a file over `dest` meanwhile, and the inode returned must be the one hashed
        actual = actual or file_digest(pinned_path(fd))
    finally:
        os.close(fd)
    if actual != record.digest:
        dest.unlink(missing_ok=True)
        raise DamagedCopy(tier, what, f"digest {actual}, its record says {record.digest}; not fetched")
    return checked.st_dev, checked.st_ino


def _sidecars(tier: Any, key: str, record: ArtifactRecord) -> tuple[ArtifactRecord, dict[str, bytes]]:
    """The sidecars a tier holds for `key` that match the record; a stray one is dropped with a
    warning (the artifact itself is fine), and the record then no longer claims it."""
    found: dict[str, bytes] = {}
    for suffix, field in SIDECARS.items():
        data = tier.sidecar(key, suffix)
        expected = getattr(record, field) if field else None
        if data is not None and field and expected is not None and bytes_digest(data) != expected:
            notices.warn(f"{tier.name} tier: the {suffix} of {short(key)} does not match its record; "
                 f"copying the artifact without it")
            data = None
        if data is None and expected is not None:
            record = record._replace(**{field: None})
        if data is not None:
            found[suffix] = data
    return record, found


@contextlib.contextmanager
def verified_copy(key: str, source: Any, staging: Any, *, trusted: bool = False,
                  index: ChunkIndex | None = None,
                  vet: Vet | None = None) -> Iterator[Copy]:
    """The artifact as `source` holds it, verified. A filesystem tier's own file is used in place;
    an S3 object is downloaded into `staging` (a filesystem tier) and removed afterwards.
    `trusted` skips re-hashing a filesystem copy this process has just written and hashed, and
    `index` is the chunk index it computed from those bytes. `vet(record, sidecars)` may refuse
    the artifact (raise) from its record and sidecars, before any byte of it is read or written."""
    record = source.record(key)
    if record is None:
        raise NotFound(f"artifact {short(key)} is not in the {source.name} tier ({source.describe(key)})")
    if record.key != key:
        raise DamagedCopy(source.name, source.describe(key), f"its record is for {short(record.key)}")
    record, sidecars = _sidecars(source, key, record)
    if vet is not None:  # the very record the bytes are then checked against
        vet(record, sidecars)
    if hasattr(source, "sqsh_path"):  # a filesystem tier
        # checked and copied on through one descriptor: in a shared tier another user may rename
        # a file over the name once it is checked, and its bytes must not be what is copied
        path = source.sqsh_path(key)
        fd = fsutil.open_regular(path)
        if fd is None:
            raise DamagedCopy(source.name, str(path), "not a regular file (or gone)")
        try:
            if not trusted:
                _check_open(source.name, path, fd, record)
            yield Copy(key, source.name, pinned_path(fd), record, sidecars, index if trusted else None)
        finally:
            os.close(fd)
        return
    staged = staging.staging_path(key)
    try:
        source.download(key, staged, record)  # verifies size and digest before returning
        yield Copy(key, source.name, staged, record, sidecars)
    finally:
        staged.unlink(missing_ok=True)


def send(copy: Copy, target: Any, *, locked: bool = False, show_progress: bool = True) -> str:
    """Store a verified copy on `target`: "published", "reused" or "repaired". `locked`: the
    caller holds the target's key lock (a fetch; an S3 target takes none)."""
    others = {suffix: data for suffix, data in copy.sidecars.items() if suffix not in (MANIFEST_SUFFIX, ENVELOPE_SUFFIX)}
    return target.publish(copy.key, copy.sqsh, copy.record, copy.manifest, show_progress=show_progress,
                          envelope=copy.envelope, sidecars=others, index=copy.index, locked=locked)


def transfer(key: str, source: Any, targets: list, staging: Any, *, trusted: bool = False,
             locked: bool = False, show_progress: bool = True,
             vet: Vet | None = None) -> dict[str, str]:
    """Copy `key` from `source` to every tier of `targets`, verifying the source first (and
    letting `vet` refuse it: see verified_copy).

    Returns {target tier name: outcome}. Raises DamagedCopy, naming the source tier and file,
    when the source does not match its record; nothing is copied then.
    """
    results: dict[str, str] = {}
    if not targets:
        return results
    with verified_copy(key, source, staging, trusted=trusted, vet=vet) as copy:
        for target in targets:
            results[target.name] = send(copy, target, locked=locked, show_progress=show_progress)
    return results
