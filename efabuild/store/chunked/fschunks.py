"""Chunks that lazy mounts (efabuild/lazy) fetched from S3, kept on a shared filesystem tier (FSx) so that the next
node needing one reads it there: N nodes starting one new artifact pull each chunk from S3 about
once, not N times.

A chunk is `chunks/<id[:2]>/<id>` below the tier's root. It is written under a temp name in the
tier's tmp/ (named after its writer: gc tells a live writer's file from debris), synced, and
linked at its id's name: link(2) creates the name or fails because it exists, so a reader never
sees half a chunk, and of two nodes that fetched a chunk at once one copy wins. Nothing read here
is trusted: a link or a non-file at an id is skipped, every directory is walked without following
a link, and the bytes are checked against the id before they are returned (the mount checks them
again). The store is a cache: a chunk missing, damaged or unwritable costs a fetch from S3, never
a failed read. Beside the chunks, `<key>.start` keeps the start list of artifact <key>
(chunks/startlist.py), written the same way. `efabuild gc` removes chunks and lists nobody wrote
or read for EXPIRE_SECONDS.

Nodes start a job at the same instant and read the same chunks in the same order, so a chunk's
fetch is claimed first: `<id>.claim` created with O_EXCL beside where the chunk goes. The node that
created it fetches, touching the claim every CLAIM_BEAT seconds while it does; the others wait for
the chunk while the claim is alive. A claim a waiter sees unchanged for CLAIM_FRESH seconds (by
the waiter's own clock: the nodes' clocks may differ) is a dead node's, and one whose mtime is
older than CLAIM_STALE is not waited on at all; gc removes those. A wait is at most CLAIM_WAIT
seconds, and a wait that ends without the chunk ends waiting on claims for that mount: claims
planted at every id cost a mount one wait, not one per chunk.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

import blake3

from efabuild.chunks import startlist
from efabuild.chunks.cdc import ChunkIndex, is_chunk_id
from efabuild.errors import EfabuildError
from efabuild.host import fsutil
from efabuild.host.fsutil import UnsafeEntry

CHUNKS_DIR = "chunks"
CLAIM_SUFFIX = ".claim"
LIST_SUFFIX = ".start"  # <key>.start: the start list of artifact <key> (chunks/startlist.py)
CLAIM_STALE = 120.0  # a claim this old by its mtime is a dead node's (NTP keeps clocks far closer)
CLAIM_FRESH = 15.0  # a live claimer touches its claim every CLAIM_BEAT seconds
CLAIM_BEAT = 5.0
CLAIM_WAIT = 60.0
_POLL_FIRST, _POLL_MOST = 0.02, 0.5  # waiters back off: many nodes poll one metadata server
OURS, THEIRS, NONE = "ours", "theirs", "none"  # what claim() found
EXPIRE_SECONDS = 7 * 24 * 3600  # by the later of mtime and atime (relatime updates it daily)
# a write that fails for one of these leaves the shared store aside for this mount: retrying every
# chunk on a full or read-only filesystem would only slow every read; any other failure (a fan-out
# directory another user made unwritable, or planted) leaves aside that fan-out directory alone
_GIVE_UP = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


class FsChunks:
    """The chunk store of one filesystem tier (a FilesystemTier: `root`, `checked_tmp_dir`)."""

    def __init__(self, tier, log=lambda line: None) -> None:  # noqa: ANN001
        self.tier, self.root, self.log = tier, Path(tier.root), log
        # a tier whose root is missing (FSx not mounted on this node) is not made on the local disk
        self.writable = self.root.is_dir()
        self.patient = True  # waits on other nodes' claims, until one such wait ended without the chunk
        self.bad: set[str] = set()  # fan-out directories this mount cannot write
        self.written = 0  # chunks this process added, for the bench and tests
        self._held: dict[str, bytes] = {}  # our claims: id -> the token written in it
        self._lock = threading.Lock()
        self._beat: threading.Thread | None = None
        self._top: bool | None = None  # chunks/ and tmp/ checked, once

    def get(self, cid: str, length: int) -> bytes | None:
        """The chunk's bytes when the tier holds them intact, else None."""
        if not is_chunk_id(cid):
            return None
        try:  # a missing root (FSx not mounted) fails here like a missing chunk
            with fsutil.store_dir(self.root, CHUNKS_DIR, cid[:2]) as dir_fd:
                fd = os.open(cid, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except (OSError, UnsafeEntry):
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = os.pread(fd, length + 1, 0)
        except OSError:
            return None
        finally:
            os.close(fd)
        if len(data) == length and blake3.blake3(data).hexdigest() == cid:
            return data
        return None

    def put(self, cid: str, data: bytes) -> bool:
        """Add a verified chunk unless the tier has an intact one at its id already; True when this
        call added it (a wrong file at the id is replaced, where the directory lets this user)."""
        return self._link_new(cid, cid, data, lambda: self.get(cid, len(data)) is not None)

    def get_list(self, key: str) -> bytes | None:
        """The bytes of the start list kept for artifact `key` (a regular file of at most
        startlist.MAX_BYTES, never through a link), None when there is none: parsed by the caller."""
        if not is_chunk_id(key):
            return None
        try:
            with fsutil.store_dir(self.root, CHUNKS_DIR, key[:2]) as dir_fd:
                return fsutil.read_file(dir_fd, key + LIST_SUFFIX, self.root / key, startlist.MAX_BYTES)
        except (OSError, UnsafeEntry, EfabuildError):
            return None

    def put_list(self, key: str, data: bytes, index: ChunkIndex) -> bool:
        """Keep a start list for artifact `key` unless one of it (for `index`) is there already:
        the first node's list stands; one that is not a list of this artifact is replaced."""
        def intact() -> bool:
            found = self.get_list(key)
            try:
                return found is not None and bool(startlist.decode(found, key, index))
            except startlist.BadStartList:
                return False

        return self._link_new(key, key + LIST_SUFFIX, data, intact)

    def _link_new(self, cid: str, name: str, data: bytes, intact: Callable[[], bool]) -> bool:
        """Write `data` at `name` in `cid`'s fan-out directory: under a temp name in tmp/, synced,
        then linked (created or not at all); a file there that is not `intact()` is replaced."""
        if not self._usable(cid):
            return False
        tmp = None
        try:
            tmp = fsutil.temp_name(self.tier.checked_tmp_dir(), name[:16], ".chunk")
            with fsutil.store_dir(self.root, "tmp") as tmp_fd:
                fd = os.open(tmp.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444,
                             dir_fd=tmp_fd)
                try:
                    fsutil.write_synced(fd, data)  # linked only once its bytes are on the disk: no zeros after a crash
                finally:
                    os.close(fd)
                with self._fanout(cid) as dir_fd:
                    try:
                        os.link(tmp.name, name, src_dir_fd=tmp_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
                    except FileExistsError:
                        if intact():
                            return False  # another node's copy won
                        # a wrong file, a link or a half-written file of a crash: replaced whole
                        os.rename(tmp.name, name, src_dir_fd=tmp_fd, dst_dir_fd=dir_fd)
            self.written += 1
            return True
        except (OSError, UnsafeEntry) as exc:
            self._failed(cid, exc)
            return False
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError, UnsafeEntry), fsutil.store_dir(self.root, "tmp") as tmp_fd:
                    os.unlink(tmp.name, dir_fd=tmp_fd)

    def _usable(self, cid: str) -> bool:
        if self.writable and self._top is None:
            self._top = self._check_top()
            self.writable = self._top
        return self.writable and is_chunk_id(cid) and cid[:2] not in self.bad

    def _check_top(self) -> bool:
        """Whether chunks/ and tmp/ are the tier's own directories (made if missing): a failure there
        leaves the shared store aside for this mount, not one fan-out directory at a time."""
        try:
            with fsutil.store_dir(self.root, CHUNKS_DIR, create=True):
                pass
            self.tier.checked_tmp_dir()
            return True
        except (OSError, UnsafeEntry) as exc:
            self.log(f"not keeping chunks on the {self.tier.name} tier ({exc}): reads go on from S3")
            return False

    def _fanout(self, cid: str):  # noqa: ANN202 - a context manager giving the fan-out directory's fd
        if not self.root.is_dir():  # chunks/ is made below an existing root only (FSx unmounted since)
            raise FileNotFoundError(errno.ENOENT, "no such directory", str(self.root))
        return fsutil.store_dir(self.root, CHUNKS_DIR, cid[:2], create=True)

    def _failed(self, cid: str, exc: BaseException) -> None:
        if getattr(exc, "errno", None) in _GIVE_UP:
            if self.writable:
                self.log(f"not keeping chunks on the {self.tier.name} tier ({exc}): reads go on from S3")
            self.writable = False
        elif cid[:2] not in self.bad:
            self.bad.add(cid[:2])
            self.log(f"not keeping chunks {cid[:2]}… on the {self.tier.name} tier ({exc})")

    def claim(self, cid: str) -> str:
        """OURS: this node created the chunk's claim and fetches it (then `release`); THEIRS:
        another node's claim, `wait` for its chunk; NONE: fetch it, no claim to be had."""
        if not (self.patient and self._usable(cid)):
            return NONE
        try:
            with self._fanout(cid) as dir_fd:
                fd = os.open(cid + CLAIM_SUFFIX, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o444, dir_fd=dir_fd)
                token = os.urandom(16).hex().encode()  # inode numbers are reused at once: this is ours
                try:
                    os.write(fd, token)
                finally:
                    os.close(fd)
        except FileExistsError:
            stamp = self._claim_stamp(cid)
            if stamp is not None and time.time() - stamp[2] > CLAIM_STALE:
                return NONE  # a dead node's: not waited on
            return THEIRS  # alive, or gone since (then the chunk is most likely there)
        except (OSError, UnsafeEntry) as exc:
            self._failed(cid, exc)
            return NONE
        with self._lock:
            self._held[cid] = token
            if self._beat is None or not self._beat.is_alive():
                self._beat = threading.Thread(target=self._heartbeat, name="chunk-claims", daemon=True)
                self._beat.start()
        return OURS

    def release(self, cid: str) -> None:
        """Remove this node's claim (after the chunk was written, or the fetch failed), and only
        ours: gc may have removed it and another node made a new one meanwhile."""
        with self._lock:
            held = self._held.pop(cid, None)
        if held is None:
            return
        with contextlib.suppress(OSError, UnsafeEntry), fsutil.store_dir(self.root, CHUNKS_DIR, cid[:2]) as dir_fd:
            fd = os.open(cid + CLAIM_SUFFIX, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
            try:
                found = os.read(fd, len(held) + 1)
            finally:
                os.close(fd)
            if found == held:
                os.unlink(cid + CLAIM_SUFFIX, dir_fd=dir_fd)

    def release_all(self) -> None:
        """Remove every claim this node still holds (a mount unmounted while its prefetch fetched):
        the other nodes need not wait CLAIM_FRESH to see it is gone."""
        with self._lock:
            held = list(self._held)
        for cid in held:
            self.release(cid)

    def _heartbeat(self) -> None:
        """Touch our claims while their fetches run: a slow fetch is not taken for a dead node."""
        while True:
            time.sleep(CLAIM_BEAT)
            with self._lock:
                held = dict(self._held)
                if not held:
                    self._beat = None
                    return
            for cid in held:
                with contextlib.suppress(OSError, UnsafeEntry), \
                        fsutil.store_dir(self.root, CHUNKS_DIR, cid[:2]) as dir_fd:
                    os.utime(cid + CLAIM_SUFFIX, dir_fd=dir_fd, follow_symlinks=False)

    def wait(self, cid: str, length: int) -> bytes | None:
        """The chunk once the node that claimed it has written it; None when its claim went
        without it, stopped changing for CLAIM_FRESH seconds, or CLAIM_WAIT passed (then this
        mount waits on no claim again)."""
        started = last_change = time.monotonic()
        seen = self._claim_stamp(cid)
        poll = _POLL_FIRST
        while True:
            data = self.get(cid, length)
            if data is not None:
                return data
            now = time.monotonic()
            stamp = self._claim_stamp(cid)
            if stamp is None:  # released: written just now, or its fetch failed
                data = self.get(cid, length)
                if data is not None:
                    return data
                why = "its claim went without it"
                break
            if stamp != seen:
                seen, last_change = stamp, now
            if now - last_change > CLAIM_FRESH:
                why = f"its claim did not change for {CLAIM_FRESH:.0f} s"
                break
            if now - started > CLAIM_WAIT:
                why = f"waited {CLAIM_WAIT:.0f} s"
                break
            time.sleep(poll)
            poll = min(_POLL_MOST, poll * 2)
        self.patient = False
        self.log(f"chunk {cid[:12]}, claimed by another node on the {self.tier.name} tier: {why}; fetching "
                 "it from S3, and waiting on no claim again")
        return None

    def _claim_stamp(self, cid: str) -> tuple[int, int, float] | None:
        """(device, inode, mtime) of the chunk's claim, None when there is none."""
        try:
            with fsutil.store_dir(self.root, CHUNKS_DIR, cid[:2]) as dir_fd:
                info = os.stat(cid + CLAIM_SUFFIX, dir_fd=dir_fd, follow_symlinks=False)
        except (OSError, UnsafeEntry):
            return None
        return info.st_dev, info.st_ino, info.st_mtime


def expired(tier, now: float | None = None) -> list[Path]:  # noqa: ANN001 - a FilesystemTier
    """The tier's chunks nobody wrote or read for EXPIRE_SECONDS (links and non-files left alone)."""
    now = time.time() if now is None else now
    found = []
    try:
        with fsutil.store_dir(tier.root, CHUNKS_DIR) as fd:
            fanouts = [e.name for e in os.scandir(fd) if e.is_dir(follow_symlinks=False) and len(e.name) == 2]
    except (OSError, UnsafeEntry):
        return []
    for fanout in sorted(fanouts):
        try:
            with fsutil.store_dir(tier.root, CHUNKS_DIR, fanout) as fd:
                for entry in os.scandir(fd):
                    try:  # a claim released while gc looks is gone: the rest is still looked at
                        if _is_entry(entry.name, fanout) and _expired(entry.stat(follow_symlinks=False), entry.name,
                                                                       now):
                            found.append(Path(tier.root) / CHUNKS_DIR / fanout / entry.name)
                    except OSError:
                        continue
        except (OSError, UnsafeEntry):
            continue
    return found


def _is_entry(name: str, fanout: str) -> bool:
    """A chunk's, a claim's or a start list's name, in its own fan-out directory."""
    return is_chunk_id(name.removesuffix(CLAIM_SUFFIX).removesuffix(LIST_SUFFIX)) and name[:2] == fanout


def _expired(info: os.stat_result, name: str, now: float) -> bool:
    if not stat.S_ISREG(info.st_mode):
        return False  # a link or anything else planted here is left alone
    if name.endswith(CLAIM_SUFFIX):
        return now - info.st_mtime > CLAIM_STALE
    if name.endswith(LIST_SUFFIX):  # by its writing alone: every mount reads it, and a planted one must go
        return now - info.st_mtime > EXPIRE_SECONDS
    return now - max(info.st_mtime, info.st_atime) > EXPIRE_SECONDS


def is_chunk_path(tier, path: Path) -> bool:  # noqa: ANN001
    path = Path(path)
    return path.parent.parent == Path(tier.root) / CHUNKS_DIR and _is_entry(path.name, path.parent.name)


def remove(tier, path: Path) -> bool:  # noqa: ANN001
    """Remove one chunk or claim expired() reported, if it still is (read meanwhile: kept);
    whether it was removed."""
    path = Path(path)
    if not is_chunk_path(tier, path):
        return False
    with contextlib.suppress(OSError, UnsafeEntry), \
            fsutil.store_dir(tier.root, CHUNKS_DIR, path.parent.name) as fd:
        if _expired(os.stat(path.name, dir_fd=fd, follow_symlinks=False), path.name, time.time()):
            os.unlink(path.name, dir_fd=fd)
            return True
    return False
