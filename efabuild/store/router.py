"""The router: one artifact store over its tiers in order (local dir, shared filesystem, then a
remote tier: S3), as desync routes over an ordered list of stores.

It builds the tiers from the store's settings, says which tiers hold a key (`where`; with
`checked`, a filesystem copy's size by a stat and S3's chunks by their quick check), reads
records, manifests and signed statements from the first tier holding them, lists, and keeps
what this process found damaged for a repair. What is done over the tiers lives beside it, each
a module of functions of a router: publishing.py (publish, copy between tiers, repair),
fetching.py (lookup, fetch), naming.py (names and platform indexes), tierhealth.py (verify),
gc/sweep.py. `Store` (tiered.py) is the router with those as its methods.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, Self

from efabuild import notices
from efabuild.errors import EfabuildError
from efabuild.refs import check_key, short
from efabuild.store.chunked import seeds
from efabuild.store.config import bare_store, locate
from efabuild.store.layout import ENVELOPE_SUFFIX, INDEX_SUFFIX, MANIFEST_SUFFIX
from efabuild.store.lookup import first_intact
from efabuild.store.record import ArtifactRecord
from efabuild.store.tiers.base import S3_TIER, RemoteTier
from efabuild.store.tiers.fs import FilesystemTier
from efabuild.storesettings import DEFAULT_KEEP, S3Config, StoreConfig


class Listing(NamedTuple):
    record: ArtifactRecord
    tiers: tuple[str, ...]  # tier names holding it, in store order


class Router:
    def __init__(
        self, fs_tiers: list[FilesystemTier], s3: S3Config | None = None, *,
        keep: int = DEFAULT_KEEP,
        pins: tuple[str, ...] = (),
        show_progress: bool = True,
        s3_options: dict | None = None,
        bare: bool = False,
        remote: RemoteTier | None = None,
    ) -> None:
        if not fs_tiers:
            raise ValueError("a store needs at least one filesystem tier")
        self.fs_tiers = list(fs_tiers)  # lookup order: shared first
        self.s3_settings = s3
        self.keep = keep
        self.pins = tuple(pins)
        self.show_progress = show_progress
        self.bare = bare  # a store directory given by path (a compute node's), not a workspace's
        self._s3_options = dict(s3_options or {})
        self._chunk_grace = self._s3_options.pop("chunk_grace", None)
        self._s3 = remote  # S3's, built from `s3` when first used; or a remote tier given ready
        self._remote_given = remote is not None
        self.damaged: dict[str, set[str]] = {}  # key -> tiers whose copy failed a check, left to repair
        self.s3_checked: dict = {}  # key -> health.S3Health of S3's last check of it
        self.skipped: dict[str, str] = {}  # tier name -> why this store leaves it out
        self.fetched: dict[str, tuple[Path, tuple[int, int] | None]] = {}  # key -> (path, device and inode) fetched

    # ---- construction
    @classmethod
    def from_config(cls, config: StoreConfig, **options: object) -> Self:
        tiers = [FilesystemTier(path, name) for name, path in config.roots()]
        return cls(tiers, config.s3, keep=config.keep, pins=config.pins, bare=config.bare, **options)

    @classmethod
    def at(cls, path: str | os.PathLike[str], **options: object) -> Self:
        """A bare store directory (e.g. /fsx/efabuild on a compute node); S3 from its store.toml."""
        return cls.from_config(bare_store(os.fspath(path), str(path)), **options)

    @classmethod
    def locate(cls, store: str | None = None, cwd: Path | None = None, **options: object) -> Self:
        """--store PATH, else $EFABUILD_STORE, else the workspace's [store] table."""
        return cls.from_config(locate(store, cwd), **options)

    # ---- tiers
    @property
    def remote(self) -> RemoteTier | None:
        """The tier fetched from and published to after the filesystem tiers: S3 (an S3Tier,
        imported only when S3 is used), or the one given."""
        if self.s3_settings is None and not self._remote_given:
            return None
        if self._s3 is None:
            from efabuild.store.tiers.s3 import S3Tier

            self._s3 = S3Tier(self.s3_settings, show_progress=self.show_progress, **self._s3_options)
            self._s3.seed_provider = self.seeds  # what this node holds, for chunked transfers
        return self._s3

    @property
    def s3(self):  # noqa: ANN201 - the S3Tier when the remote tier is S3's (its chunks, health, usage)
        return self.remote if self.s3_settings is not None else None

    @property
    def remote_name(self) -> str | None:  # without building an S3 client
        if self.s3_settings is not None:
            return S3_TIER
        return self._s3.name if self._remote_given and self._s3 is not None else None

    @property
    def chunk_grace(self) -> float:  # how long gc leaves a chunk it found unreferenced
        from efabuild.store.gc.s3chunks import DEFAULT_GRACE  # loaded only when gc needs it

        return DEFAULT_GRACE if self._chunk_grace is None else float(self._chunk_grace)

    def skip_s3(self, reason: str) -> None:
        """Leave the S3 tier out from now on (no credentials): the filesystem tiers still serve."""
        if self.s3_settings is not None:
            notices.warn(f"{S3_TIER} tier skipped: {reason}")
            self.skipped[S3_TIER] = reason
            self.s3_settings = self._s3 = None
            self._remote_given = False

    @property
    def tier_names(self) -> tuple[str, ...]:
        names = tuple(t.name for t in self.fs_tiers)
        return names + ((self.remote_name,) if self.remote_name else ())

    @property
    def fetch_tier(self) -> FilesystemTier:
        return self.fs_tiers[0]

    @property
    def local_tier(self) -> FilesystemTier:
        return self.fs_tiers[-1]

    def staging_dir(self) -> Path:
        """Where an exporter should write a .sqsh so that publishing links it instead of copying."""
        return self.local_tier.checked_tmp_dir()

    def describe(self) -> str:
        parts = [f"{t.name} {t.root}" for t in self.fs_tiers]
        if self.s3_settings:
            prefix = self.s3_settings.prefix.strip("/")
            parts.append(f"s3 s3://{self.s3_settings.bucket}/{prefix}")
        elif self.remote is not None:
            parts.append(f"{self.remote.name} {self.remote!r}")
        return ", ".join(parts)

    # ---- presence
    def where(self, key: str, *, remote: bool = True, checked: bool = False) -> tuple[str, ...]:
        """Names of the tiers holding `key` committed (S3 asked only when `remote`). `checked`
        (a make's plan): a filesystem copy must also have its record's size (a stat), and S3's
        chunks must all be there as written (store/chunked/health.py's quick check); a copy that fails is
        named in a warning and left for `complete` to repair."""
        check_key(key)
        names = tuple(tier.name for tier in self.fs_tiers if tier.has(key) and (not checked or self._sized(tier, key)))
        if remote and self.remote is not None and self.remote.has(key) and (
                not checked or self.s3 is None or self._s3_sound(key)):
            names += (self.remote.name,)
        return names

    def has(self, key: str) -> bool:
        """True when every tier holds `key`: nothing left to publish."""
        return len(self.where(key)) == len(self.tier_names)

    def held(self, key: str, where: tuple[str, ...]) -> bool:
        """A copy can complete the tiers lacking `key`, no export, given `where` (the tiers found
        holding it, not asked again): a filesystem tier holds it, or S3 in chunks, of which a
        fetch downloads only what this node's seeds lack."""
        remote = self.remote_name
        return any(name != remote for name in where) or (remote in where and self.chunked_on_remote(key))

    def chunked_on_remote(self, key: str) -> bool:  # a GET: a fetch that follows finds the index in memo
        checked = self.s3_checked.get(key)
        if checked is not None and checked.index is not None:
            return True  # the plan's check read the index just now
        return self.remote.sidecar(key, INDEX_SUFFIX) is not None


    def local_hit(self, key: str) -> tuple[FilesystemTier, Path] | None:
        """The first filesystem tier whose copy of `key` is intact by a stat, and its path."""
        hit, _ = first_intact([tier.layout for tier in self.fs_tiers], key)
        return next(((t, t.sqsh_path(key)) for t in self.fs_tiers if hit is not None and t.layout is hit[0]), None)


    def seeds(self, name: str) -> tuple[seeds.Seed, ...]:
        """What this node holds that can seed a chunked transfer of `name` (see store/chunked/seeds.py)."""
        return seeds.seeds(self.fs_tiers, name)

    # ---- metadata
    def record(self, key: str) -> ArtifactRecord | None:
        return self._first_found(lambda tier: tier.record(key))

    def manifest(self, key: str) -> bytes | None:
        return self._first_found(lambda tier: tier.sidecar(key, MANIFEST_SUFFIX))

    def _first_found(self, read: Callable):  # noqa: ANN202 - what `read` returns
        """What `read(tier)` finds on the first tier that holds it (filesystem tiers, then S3)."""
        for tier in self.fs_tiers:
            found = read(tier)
            if found is not None:
                return found
        return read(self.remote) if self.remote is not None else None

    def envelope(self, key: str) -> bytes | None:
        """The signed statement of `key` from the first tier holding it (none there: unsigned)."""
        holder = next((tier for tier in self.fs_tiers if tier.has(key)), self.remote)
        return holder.sidecar(key, ENVELOPE_SUFFIX) if holder is not None else None

    def write_envelope(self, key: str, envelope: bytes) -> list[str]:
        """Store a re-signed statement on every tier holding `key`; the tiers written."""
        written = []
        for tier in self.fs_tiers:
            if tier.has(key):
                tier.write_sidecar(key, ENVELOPE_SUFFIX, envelope)
                written.append(tier.name)
        if self.remote is not None and self.remote.has(key):
            self.remote.write_sidecar(key, ENVELOPE_SUFFIX, envelope)
            written.append(self.remote.name)
        return written

    def ls(self, *, remote: bool = True) -> list[Listing]:
        """Every artifact with the tiers holding it, by name then creation time (an unreadable record: warned of)."""
        listings, unreadable = self.inventory(remote=remote)
        for tier, key, problem in unreadable:
            notices.warn(f"{tier} tier: skipping {short(key)}: {problem}")
        return listings

    def inventory(self, *, remote: bool = True) -> tuple[list[Listing], list[tuple[str, str, str]]]:
        """(what ls lists, [(tier, key, problem)] of stored objects whose record is unreadable)."""
        found: dict[str, tuple[ArtifactRecord, list[str]]] = {}
        unreadable: list[tuple[str, str, str]] = []
        for tier in self.tiers(remote):
            if isinstance(tier, FilesystemTier):
                records, bad = tier.scan()
                unreadable += [(tier.name, key, problem) for key, problem in bad]
            else:
                records = tier.list()
            for record in records:
                found.setdefault(record.key, (record, []))[1].append(tier.name)
        listings = [Listing(record, tuple(tiers)) for record, tiers in found.values()]
        return sorted(listings, key=lambda l: (l.record.name, l.record.created, l.record.key)), unreadable

    def tiers(self, remote: bool) -> list:
        """The tiers in store order: the filesystem tiers, then (with `remote`) the remote one."""
        return self.fs_tiers + ([self.remote] if remote and self.remote is not None else [])

    # ---- quick checks of copies (a make's plan asks where(checked=True))
    def _sized(self, tier: FilesystemTier, key: str) -> bool:
        """The copy of `key` on `tier` has its record's size (a stat; warned and marked damaged
        when not)."""
        try:
            record, info = tier.record(key), tier.layout.committed(key)
        except EfabuildError as exc:
            return self.mark_damaged(key, tier.name, f"{tier.name} tier: {exc}")
        if record is None or info is None:
            return False
        if info.st_size != record.size:
            return self.mark_damaged(key, tier.name, f"{tier.name} tier: {tier.sqsh_path(key)}: corrupt artifact: "
                                                      f"{info.st_size} bytes, its record says {record.size}")
        return True

    def _s3_sound(self, key: str) -> bool:
        """S3's copy of `key` passes the quick check (warned and marked damaged when not)."""
        found = self.s3_health(key)
        if found is None or found.ok:
            return found is not None
        for problem in found.problems[:-1]:
            notices.warn(problem)
        return self.mark_damaged(key, S3_TIER, found.problems[-1])

    def s3_health(self, key: str, *, deep: bool = False):  # noqa: ANN201 - health.S3Health, None when S3 lacks it
        """How the S3 tier holds `key` (see store/chunked/health.py); remembered for a repair."""
        from efabuild.store.chunked import health

        record = self.s3.record(key)
        if record is None:
            return None
        found = health.check(self.s3, key, record, deep=deep)
        self.s3_checked[key] = found
        return found

    def mark_damaged(self, key: str, tier: str, problem: str) -> bool:
        """Warn of `problem` with `key`'s copy on `tier`, left for `complete` to repair: False."""
        notices.warn(f"{problem}; a make repairs it from a good copy")
        self.damaged.setdefault(key, set()).add(tier)
        return False
