"""`Store`: one artifact store over its tiers (local dir, shared filesystem, S3).

- publish goes to every tier: local first (a hard link of the export when it is on the same
  filesystem), then shared, then S3; later tiers copy what the first one holds, so all tiers
  hold the same bytes and record.
- lookup looks at the filesystem tiers without locks (shared first: every node sees that path),
  and only when none holds a copy of the recorded size asks S3 and fetches into the shared tier
  (else local, over a damaged copy) under the key's lock, verified before it becomes visible.
- names ("graph:layer") resolve through the filesystem tiers' refs (lookup.local_choice, also
  `efabuild lookup`'s); S3's only when no filesystem tier knows the name, or only as copied from
  S3 (a shared tier makes builders and jobs agree).
- gc keeps what gc.keys_to_keep decides over every tier and deletes the rest (sweep.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from efabuild import notices
from efabuild.errors import NotFound
from efabuild.refs import check_key, classify_ref, short
from efabuild.store.chunked import seeds
from efabuild.storesettings import DEFAULT_KEEP, S3Config, StoreConfig
from efabuild.store.config import bare_store, locate, store_config_text
from efabuild.host import treecache
from efabuild.host.digest import bytes_digest
from efabuild.store.tiers.base import RemoteTier
from efabuild.store.tiers.fs import PUBLISHED, REPAIRED, REUSED, S3_TIER, FilesystemTier
from efabuild.store.layout import ENVELOPE_SUFFIX, INDEX_SUFFIX, MANIFEST_SUFFIX
from efabuild.store.lookup import first_intact
from efabuild.store.platformindex import IndexVet, Wanted, check_record, manifest_platform_of
from efabuild.store.record import ArtifactRecord
from efabuild.chunks.cdc import ChunkError, ChunkIndex
from efabuild.store.gc.sweep import GcReport, collect_garbage
from efabuild.store.tierhealth import Checks
from efabuild.store.naming import Naming
from efabuild.store.transfer import DamagedCopy, Vet, send, transfer, verified_copy


class Listing(NamedTuple):
    record: ArtifactRecord
    tiers: tuple[str, ...]  # tier names holding it, in store order


class Store(Checks, Naming):
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
        self._damaged: dict[str, set[str]] = {}  # key -> tiers whose copy failed verification
        self._s3_health: dict = {}  # key -> health.S3Health of its last check
        self.skipped: dict[str, str] = {}  # tier name -> why this store leaves it out
        self.fetched: dict[str, tuple[Path, tuple[int, int] | None]] = {}  # key -> (path, device and inode) fetched

    # ---- construction
    @classmethod
    def from_config(cls, config: StoreConfig, **options: object) -> Store:
        tiers = [FilesystemTier(path, name) for name, path in config.roots()]
        return cls(tiers, config.s3, keep=config.keep, pins=config.pins, bare=config.bare, **options)

    @classmethod
    def at(cls, path: str | os.PathLike[str], **options: object) -> Store:
        """A bare store directory (e.g. /fsx/efabuild on a compute node); S3 from its store.toml."""
        return cls.from_config(bare_store(os.fspath(path), str(path)), **options)

    @classmethod
    def locate(cls, store: str | None = None, cwd: Path | None = None, **options: object) -> Store:
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
        return any(name != remote for name in where) or (remote in where and self._chunked_on_remote(key))

    def _chunked_on_remote(self, key: str) -> bool:  # a GET: a fetch that follows finds the index in memo
        checked = self._s3_health.get(key)
        if checked is not None and checked.index is not None:
            return True  # the plan's check read the index just now
        return self.remote.sidecar(key, INDEX_SUFFIX) is not None

    def complete(self, key: str) -> dict[str, str] | None:
        """Copy `key` from a tier holding a good copy into the tiers lacking it, and repair damaged
        copies from it. None when no tier holds a good copy: then it must be exported (and
        publishing the export replaces the damaged copies). Saves a re-export when a filesystem
        tier holds it, or S3 in chunks (see `held`). Filesystem tiers are tried first: an S3
        source costs a download."""
        check_key(key)
        holders = [tier for tier in self._tiers(remote=True) if tier.has(key)]
        if not any(isinstance(tier, FilesystemTier) for tier in holders) and not (
                holders and self._chunked_on_remote(key)):
            return None  # only S3 has it, whole: exporting again costs no more than the download
        lacking = [tier for tier in self._tiers(remote=True) if tier not in holders]
        known_bad = self._damaged.get(key, set())
        for source in [t for t in holders if t.name not in known_bad]:  # a stat or S3's check found the others bad
            reached = False
            try:
                with verified_copy(key, source, self.local_tier) as copy:
                    reached, damaged = True, self._damaged.get(key, set())
                    results = {t.name: REUSED for t in holders if t.name not in damaged}
                    for target in lacking + [t for t in holders if t.name in damaged]:
                        results[target.name] = self._send(copy, target)
                    self._record_names(copy.record.name, key, self._tiers(remote=True),  # as publish does
                                       copy.record.platform)
                    return results
            except (DamagedCopy, ChunkError) as exc:
                if not isinstance(exc, DamagedCopy) and (reached or source is not self.remote):
                    raise  # a chunk failing on its way out, not in the source
                self._source_failed(key, source.name, exc)
        return None

    def _send(self, copy, target) -> str:  # noqa: ANN001 - a transfer.Copy, a tier
        """One verified copy onto one tier, replacing a copy found damaged there."""
        damaged = self._damaged.get(copy.key, set())
        repairing = target.name in damaged
        if repairing and target is self.s3 and self._repaired_chunks(copy, target):
            return REPAIRED
        if repairing and target is self.remote:
            target.delete(copy.key)  # a remote tier keeps the first object written under a key: make room
        outcome = send(copy, target, show_progress=self.show_progress)
        if target is self.s3:
            seeds.keep_beside_copies(self.fs_tiers, copy.key, target.last_index)
        if repairing:
            damaged.discard(target.name)
            outcome = REPAIRED if outcome == PUBLISHED else outcome
        return outcome

    def _record_names(self, name: str, key: str, tiers: list, platform: str | None = None) -> None:
        for tier in tiers:
            if platform is None or not _indexed(tier, name):  # a name with a platform index moves by its index
                tier.names.append(name, key)
            if isinstance(tier, FilesystemTier) and self.s3_settings is not None:
                tier.write_config(store_config_text(self.s3_settings))

    # ---- publish
    def publish(self, key: str, sqsh: str | os.PathLike[str], record: ArtifactRecord, manifest: bytes | None = None,
                *, envelope: bytes | None = None, index: ChunkIndex | None = None) -> dict[str, str]:
        """Store an exported .sqsh in every tier and point its name at it (a name with a platform
        index moves only when `publish_index` names the new key of each platform): {tier name:
        "published" | "reused" | "repaired"}. `record.manifest_digest` is set from `manifest`;
        `envelope` is the signed statement, stored beside it; `index` the chunk index the export
        cut it into (kept beside it; S3 sends from it what `send_ahead` did not). Interrupted, it
        leaves every tier without the object or with all of it, never a part; run again, it ends the job."""
        check_key(key)
        if manifest is not None:
            record = record._replace(manifest_digest=bytes_digest(manifest))
        elif record.manifest_digest is not None:
            record = record._replace(manifest_digest=None)  # no manifest stored with it
        # The export goes to the local tier first (a link, no copy); the other tiers copy what the
        # local tier then holds (it may have kept an earlier identical export), which publish has
        # just written or re-hashed: trusted, not hashed again.
        first, others = self.local_tier, [t for t in self._tiers(remote=True) if t is not self.local_tier]
        results = {first.name: first.publish(key, Path(sqsh), record, manifest, show_progress=self.show_progress,
                                             envelope=envelope, index=index)}
        self._damaged.get(key, set()).discard(first.name)
        with verified_copy(key, first, first, trusted=True, index=index) as copy:
            for target in others:
                results[target.name] = self._send(copy, target)
        # the name asked for: identical inputs in two graphs share one object under two names
        self._record_names(record.name, key, [first, *others], record.platform)
        return results

    def send_ahead(self, name: str, sqsh: str | os.PathLike[str], index: ChunkIndex):  # noqa: ANN201 - Future | None
        """Start sending the chunks of an exported `sqsh` S3 lacks before its record exists: S3Tier.send_ahead."""
        return None if self.s3 is None else self.s3.send_ahead(name, sqsh, index)

    def name(self, name: str, key: str) -> None:
        """Point `name` (graph:layer) at an artifact the store already holds, in every tier; one
        platform's artifact leaves a name that has a platform index as it is (see publish)."""
        check_key(key)
        record = self.record(key)
        platform = record.platform if record is not None else None
        for tier in self._tiers(remote=True):
            if platform is None or not _indexed(tier, name):
                tier.names.append(name, key)

    # ---- resolve and lookup
    def lookup(self, ref: str, fetch: bool = True, verify: bool = False, vet: Vet | None = None,
               deep: bool = False, check_s3: bool = False, *, platform: str | None = None,
               vet_index: IndexVet | None = None, environ: dict[str, str] | None = None) -> Path:
        """The .sqsh on a tier whose copy is intact by a stat, else fetched from S3 (`verify`: see
        verify). A name's platform index picks the node's platform (or `@os/arch`'s), and the
        record of the key it picks must agree, before a fetch writes a byte."""
        wanted = Wanted.of(ref, platform, environ)
        resolved = self.resolve_choice(wanted, remote=fetch, vet_index=vet_index)
        key, signed = resolved.key, vet is not None or vet_index is not None  # signed: a name's record is its own
        hit, damaged = first_intact([tier.layout for tier in self.fs_tiers], key)
        if hit is not None:
            check_record(resolved, wanted, hit[1], manifest_platform_of(hit[0], key), signed=signed)
            if verify:
                self.check_copies(key, remote=fetch and check_s3, deep=deep)
            return hit[0].sqsh_path(key)

        def vetted(record: ArtifactRecord, sidecars: dict[str, bytes]) -> None:
            check_record(resolved, wanted, record.to_dict(), signed=signed)
            if vet is not None:
                vet(record, sidecars)

        try:
            if self.remote is None:
                raise NotFound(f"artifact {short(key)} ({ref}) is in no tier of {self.describe()}")
            if not fetch:
                raise NotFound(f"artifact {short(key)} ({ref}) is not on {', '.join(t.name for t in self.fs_tiers)}"
                               f" (--no-fetch: {'S3' if self.s3_settings else self.remote_name} not asked)")
            path = self.fetch(key, vet=vetted)  # a fetch always verifies
        except NotFound as exc:  # what is wrong with a copy here says more than where it is not
            raise (damaged[0] if damaged else exc) from None
        if verify:  # its chunks taken from seeds say nothing of the bucket's
            self.check_copies(key, remote=check_s3, deep=deep)
        kind, value = classify_ref(wanted.ref)
        if kind == "name":  # the next lookup finds the object here; S3 still says which key
            self._copy_name(value, key)
        return path

    def local_hit(self, key: str) -> tuple[FilesystemTier, Path] | None:
        """The first filesystem tier whose copy of `key` is intact by a stat, and its path."""
        hit, _ = first_intact([tier.layout for tier in self.fs_tiers], key)
        return next(((t, t.sqsh_path(key)) for t in self.fs_tiers if hit is not None and t.layout is hit[0]), None)

    def fetch(self, key: str, vet: Vet | None = None) -> Path:
        """Copy an artifact from the remote tier (S3) into the shared (else local) tier, once, under
        its key lock, over a damaged copy there; `vet` may refuse it before a byte is written
        (transfer.Vet)."""
        remote = self.remote
        if remote is None:
            raise NotFound(f"artifact {short(key)}: no S3 tier to fetch from")
        target = self.fetch_tier
        with target.key_lock(key):
            if first_intact([target.layout], key)[0] is None:  # else fetched meanwhile (the caller vets it)
                transfer(key, remote, [target], target, locked=True, show_progress=self.show_progress, vet=vet)
                self.fetched[key] = (target.sqsh_path(key).absolute(), remote.last_fetched)
                if remote.last_tree is not None and remote.last_fetched is not None:  # for the next fetch onto it
                    treecache.remember(target.sqsh_path(key), remote.last_fetched, *remote.last_tree)
        return target.sqsh_path(key)

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
        for tier in self._tiers(remote):
            if isinstance(tier, FilesystemTier):
                records, bad = tier.scan()
                unreadable += [(tier.name, key, problem) for key, problem in bad]
            else:
                records = tier.list()
            for record in records:
                found.setdefault(record.key, (record, []))[1].append(tier.name)
        listings = [Listing(record, tuple(tiers)) for record, tiers in found.values()]
        return sorted(listings, key=lambda l: (l.record.name, l.record.created, l.record.key)), unreadable

    def _tiers(self, remote: bool) -> list:
        return self.fs_tiers + ([self.remote] if remote and self.remote is not None else [])

    # ---- garbage collection
    def gc(
        self,
        keep: int | None = None,
        pins: tuple[str, ...] | list[str] | None = None,
        dry_run: bool = True,
        *,
        remote: bool = True,
        delete_remote: bool = True,
    ) -> GcReport:
        """All but the newest `keep` keys of every name, the current ref targets and pins, deleted
        from every tier (S3 only with `delete_remote`; see sweep.collect_garbage)."""
        keep = self.keep if keep is None else keep
        pins = self.pins if pins is None else tuple(pins)
        return collect_garbage(self._tiers(remote), keep, pins, dry_run=dry_run, delete_remote=delete_remote,
                               chunk_grace=self.chunk_grace)


def _indexed(tier, name: str) -> bool:  # noqa: ANN001 - a FilesystemTier or the S3Tier
    """Whether `name`'s newest entry on `tier` names a platform index: then one platform's artifact
    published alone leaves the name as it is (an arm64 node must not get it on amd64's behalf, nor
    the other way round) until the make publishes the index naming it."""
    history = tier.names.read(name)
    return bool(history) and "index" in history[-1]
