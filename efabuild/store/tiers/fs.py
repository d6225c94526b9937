"""A store tier on a POSIX filesystem: the local `cache/` or a shared FSx for Lustre path.

Publishing order (see layout.py): manifest, signed statement (`.intoto.jsonl`), then record (each
temp + fsync + rename), then the `.sqsh` hard-linked into place last. The `.sqsh` is the commit point; a record without a `.sqsh`
is an interrupted publish, invisible to readers and overwritten by the next publisher. Publishers
and cold fetchers of one key hold its lock (locks/<key>.lock); readers of committed objects take
no lock: committed files never change, they are only removed whole by gc.

Other users write the same directories. Nothing below the tier's root is followed when it is a
link, and only regular files count (fsutil): a planted entry is skipped with a warning naming it,
replaced when a publish writes that name, and never opened, chmod-ed or deleted through.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from efabuild import notices
from efabuild.errors import EfabuildError
from efabuild.refs import check_key, short
from efabuild.host import fsutil
from efabuild.store.chunked import seeds
from efabuild.chunks.cdc import ChunkIndex
from efabuild.display import shown
from efabuild.host.fsutil import UnsafeEntry
from efabuild.host.owner import owned_name
from efabuild.store.layout import (ENVELOPE_LIMIT, ENVELOPE_SUFFIX, INDEX_SUFFIX, MANIFEST_LIMIT, PLANTED_PREFIX,
                                   RECORD_SUFFIX, SQSH_SUFFIX, Layout)
from efabuild.store.lock import FileLock, note_waiting
from efabuild.store.tiers.fsnames import FsNames
from efabuild.store.progress import Progress
from efabuild.store.record import ArtifactRecord
from efabuild.store.transfer import SIDECARS, DamagedCopy, check_file
from efabuild.store.tiers.base import PUBLISHED, REPAIRED, REUSED, S3_TIER, Tier, check_publish_input, check_rewritable  # noqa: F401 - PUBLISHED & co. are the tier's words


def _warn(message: str) -> None:
    notices.warn(message)


class FilesystemTier(Tier):
    def __init__(self, root: str | os.PathLike[str], name: str) -> None:
        self.root = Path(root).absolute()
        self.name = name
        self.layout = Layout(self.root)
        self.names = FsNames(self.root, self.layout, name)

    def __repr__(self) -> str:
        return f"FilesystemTier({str(self.root)!r}, {self.name!r})"

    # ---- reads (no locks)
    def has(self, key: str) -> bool:
        return self.layout.has(key)

    def sqsh_path(self, key: str) -> Path:
        return self.layout.sqsh_path(key)

    def record(self, key: str) -> ArtifactRecord | None:
        """The record of a committed object (None if absent or not committed); EfabuildError
        naming the file when the object is not what a publish writes."""
        if self.layout.committed(key) is None:
            return None
        data = self.layout.read_record_dict(key)
        if data is None:
            return None
        where = shown(self.layout.record_path(key))
        record = ArtifactRecord.from_dict(data, where)
        if record.key != key:
            raise EfabuildError(f"{where}: the record is for key {short(record.key)}, not for its file name")
        return record

    def sidecar(self, key: str, suffix: str) -> bytes | None:
        if not self.has(key):
            return None
        limit = ENVELOPE_LIMIT if suffix == ENVELOPE_SUFFIX else MANIFEST_LIMIT
        try:
            return fsutil.read_under(self.root, self.layout.object_dir(key) / (key + suffix), limit)
        except UnsafeEntry as exc:
            _warn(f"{self.name} tier: ignoring {exc}")  # then: no such file (unsigned), as audit, show and verify say
            return None

    def write_sidecar(self, key: str, suffix: str, data: bytes) -> None:
        check_rewritable(suffix)
        with self.key_lock(key):
            if not self.layout.has(key):
                raise EfabuildError(f"{self.name} tier has no artifact {short(key)}")
            fsutil.atomic_write_bytes(self.layout.envelope_path(key), data, self.layout.tmp_dir)

    def describe(self, key: str) -> str:
        return str(self.sqsh_path(key))

    def list(self, prefix: str = "") -> list[ArtifactRecord]:
        records, unreadable = self.scan(prefix)
        for key, problem in unreadable:
            _warn(f"{self.name} tier: skipping {short(key)}: {problem}")
        return records

    def scan(self, prefix: str = "") -> tuple[list[ArtifactRecord], list[tuple[str, str]]]:
        """(records of committed objects, [(key, problem)] of those damaged, planted or unreadable)."""
        records, unreadable = [], []
        for key in self.layout.keys_with_prefix(prefix) if prefix else self.layout.keys():
            try:
                record = self.record(key)
            except EfabuildError as exc:
                unreadable.append((key, str(exc)))
                continue
            if record is not None:
                records.append(record)
        return records, unreadable

    def verify(self, key: str) -> None:
        """Re-hash the .sqsh and compare with its record; EfabuildError when they differ."""
        record = self.record(key)
        if record is None:
            raise EfabuildError(f"{self.name} tier has no artifact {short(key)}")
        check_file(self.name, self.sqsh_path(key), record)

    # ---- chunk indexes kept beside artifacts, to seed fetches from S3 (store/chunked/seeds.py)
    def chunk_index(self, key: str) -> ChunkIndex | None:
        return seeds.kept_index(self, key)

    def keep_index(self, key: str, index: ChunkIndex) -> None:
        seeds.keep_index(self, key, index)

    def recently_indexed(self, limit: int = 64) -> list[str]:
        return seeds.recently_indexed(self, limit)

    # ---- locks
    def key_lock(self, key: str, **options: object) -> FileLock:
        return FileLock(self.layout.key_lock_path(check_key(key)), on_wait=note_waiting, root=self.root, **options)

    def build_lock(self, key: str, **options: object) -> FileLock:
        """One make at a time builds, exports and publishes a key; the others wait, then reuse."""
        return FileLock(self.layout.build_lock_path(check_key(key)), root=self.root, **options)

    # ---- publish
    def publish(
        self,
        key: str,
        sqsh: str | os.PathLike[str],
        record: ArtifactRecord,
        manifest: bytes | None = None,
        *,
        show_progress: bool | None = None,
        envelope: bytes | None = None,
        sidecars: Mapping[str, bytes] | None = None,
        index: ChunkIndex | None = None,
        locked: bool = False,
    ) -> str:
        """Store `sqsh` under `key`: PUBLISHED, REUSED (someone else did already) or REPAIRED.
        `sidecars` ({suffix: bytes}, see transfer.SIDECARS) are stored beside it like the manifest,
        and so is `index`, its chunk index (it seeds fetches from S3).
        `locked`: the caller holds key_lock(key) already (a cold fetch).

        On the same filesystem the file is hard-linked, not copied: the caller hands it over and
        must not modify it afterwards (deleting it is fine).
        """
        sqsh = Path(sqsh)
        check_publish_input(key, sqsh, record)
        if manifest is not None and record.manifest_digest is None:
            raise EfabuildError("publish: a manifest was given but the record has no manifest_digest")
        with contextlib.nullcontext() if locked else self.key_lock(key):
            repairing = False
            if self.layout.has(key):
                existing = self._intact_existing(key)
                if existing is not None:
                    if existing.digest != record.digest:
                        _warn(f"{self.name} tier: {short(key)} exists with digest {existing.digest}; the new "
                              f"export has {record.digest} (export not byte-identical); keeping the stored one")
                    return REUSED
                repairing = True
            if index is not None:
                sidecars = {**(sidecars or {}), INDEX_SUFFIX: index.to_json()}
            self._commit(key, sqsh, record, manifest, envelope, sidecars or {}, show_progress)
            return REPAIRED if repairing else PUBLISHED

    def _intact_existing(self, key: str) -> ArtifactRecord | None:
        """The record of the committed copy of `key` when it is intact; None when it is damaged or
        forged (the caller holds the lock and writes it anew)."""
        try:
            existing = self.record(key)
        except EfabuildError as exc:
            _warn(f"{self.name} tier: replacing {short(key)}: {exc}")
            return None
        if existing is None or self.layout.committed(key) is None:
            return None
        # Re-hashed before it is kept: a damaged copy kept here would be copied on as good.
        # (Reached only when someone else published first, or to repair: never on a warm path.)
        try:
            check_file(self.name, self.sqsh_path(key), existing)
        except DamagedCopy as exc:
            _warn(f"{exc}; replacing it")
            return None
        return existing

    def _commit(self, key: str, sqsh: Path, record: ArtifactRecord, manifest: bytes | None,
                envelope: bytes | None, sidecars: Mapping[str, bytes], show_progress: bool | None) -> None:
        """Write the object's files in publishing order; linking the .sqsh last commits it."""
        with contextlib.ExitStack() as stack:
            tmp_fd = stack.enter_context(fsutil.store_dir(self.root, "tmp", create=True))
            object_fd = stack.enter_context(fsutil.store_dir(self.root, "objects", key[:2], create=True))
            staged = self._stage(key, sqsh, tmp_fd, show_progress)
            try:
                if manifest is not None:
                    fsutil.atomic_write_bytes(self.layout.manifest_path(key), manifest, self.layout.tmp_dir)
                if envelope is not None:
                    fsutil.atomic_write_bytes(self.layout.envelope_path(key), envelope, self.layout.tmp_dir)
                else:  # a damaged object's old signature must not vouch for the new bytes
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(key + ENVELOPE_SUFFIX, dir_fd=object_fd)
                for suffix, data in sidecars.items():
                    fsutil.atomic_write_bytes(self.layout.object_dir(key) / (key + suffix), data, self.layout.tmp_dir)
                fsutil.atomic_write_bytes(self.layout.record_path(key), record.to_json(), self.layout.tmp_dir)
                final = key + SQSH_SUFFIX
                try:
                    # no-overwrite: the commit point
                    os.link(staged, final, src_dir_fd=tmp_fd, dst_dir_fd=object_fd, follow_symlinks=False)
                except FileExistsError:
                    # A .sqsh without a record (damaged store), a damaged one, or an entry someone
                    # planted: we hold the lock, so nobody else is writing it; replace it whole (a
                    # link is replaced, not followed).
                    try:
                        os.replace(staged, final, src_dir_fd=tmp_fd, dst_dir_fd=object_fd)
                    except IsADirectoryError:
                        # a directory at the name is repaired as a FIFO or a link is: moved aside
                        # whole (nothing in it followed) into tmp/, which gc empties once we are gone
                        aside = owned_name(PLANTED_PREFIX, final)
                        os.rename(final, aside, src_dir_fd=object_fd, dst_dir_fd=tmp_fd)
                        _warn(f"{shown(self.sqsh_path(key))}: a directory, not an artifact; moved it to "
                              f"{shown(self.layout.tmp_dir / aside)} (gc removes it) and stored the artifact")
                        os.replace(staged, final, src_dir_fd=tmp_fd, dst_dir_fd=object_fd)
                os.fsync(object_fd)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(staged, dir_fd=tmp_fd)  # the object keeps its own link

    def _stage(self, key: str, sqsh: Path, tmp_fd: int, show_progress: bool | None) -> str:
        """The name of a read-only file in tmp/ with the .sqsh bytes: a link when possible."""
        tmp_dir = self.layout.tmp_dir
        staged = fsutil.temp_name(tmp_dir, key, SQSH_SUFFIX)
        linked = False
        if os.stat(sqsh).st_dev == os.fstat(tmp_fd).st_dev:
            fsutil.fsync_file(sqsh)  # the exporter may not have; the link must not outlive the data
            try:
                os.link(sqsh, staged.name, dst_dir_fd=tmp_fd)
                linked = True
            except OSError as exc:
                # bind mounts (EXDEV) and protected_hardlinks (EPERM: someone else's file) refuse
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                    raise
        if not linked:
            size = sqsh.stat().st_size
            try:
                with Progress(f"copy {short(key)} to {self.name}", size, enabled=show_progress is not False) as bar:
                    fsutil.copy_file(sqsh, staged, bar.update)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(staged.name, dir_fd=tmp_fd)
                raise
        fd = os.open(staged.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=tmp_fd)
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.fchmod(fd, 0o444)  # stored artifacts never change
        except PermissionError:
            pass  # a linked file owned by someone else keeps its mode
        finally:
            os.close(fd)
        return staged.name

    def checked_tmp_dir(self) -> Path:
        """tmp/, made if missing, and checked to be a directory of the store (not a planted link)."""
        with fsutil.store_dir(self.root, "tmp", create=True):
            return self.layout.tmp_dir

    def staging_path(self, key: str, suffix: str = SQSH_SUFFIX) -> Path:
        """A fresh temp path on this tier's filesystem (for downloads and exports)."""
        return fsutil.temp_name(self.checked_tmp_dir(), key, suffix)

    # ---- removal
    def delete(self, key: str) -> None:
        """Remove an object: the .sqsh first (uncommits it), then its metadata. Caller holds the lock."""
        check_key(key)
        try:
            with fsutil.store_dir(self.root, "objects", key[:2]) as fd:
                for suffix in (SQSH_SUFFIX, *SIDECARS, RECORD_SUFFIX):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(key + suffix, dir_fd=fd)  # a link itself, never what it points at
                os.fsync(fd)
        except FileNotFoundError:
            pass

    # ---- store.toml (where the S3 tier is, for bare-path users on compute nodes)
    def write_config(self, text: str) -> None:
        path = self.layout.config_path
        try:
            if fsutil.read_under(self.root, path, len(text.encode()) + 1) == text.encode():
                return
        except UnsafeEntry:
            pass  # replaced below
        fsutil.atomic_write_bytes(path, text.encode(), self.layout.tmp_dir)
