"""`Store`: one artifact store over its tiers (local dir, shared filesystem, S3).

- publish goes to every tier: local first (a hard link of the export when it is on the same
  filesystem), then shared, then S3; later tiers copy what the first one holds, so all tiers
  hold the same bytes and record.
- lookup looks at the filesystem tiers without locks (shared first: every node sees that path),
  and only when they miss asks S3 and fetches into the shared tier (else local) under the key's
  lock, verified before it becomes visible.
- names ("graph:layer") resolve through the filesystem tiers' refs; S3's refs are asked only when
  no filesystem tier knows the name (configure a shared tier so that builders and jobs agree).
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import attrs

from efabuild.digest import bytes_digest
from efabuild.errors import EfabuildError, InputError, NotFound
from efabuild.store.fs import FilesystemTier
from efabuild.store.layout import check_key, classify_ref, newest_ref, pick_one, resolve_in, short
from efabuild.store.config import DEFAULT_KEEP, S3Config, StoreConfig, bare_store, locate
from efabuild.store.lock import LockBusy
from efabuild.store.record import ArtifactRecord

S3_TIER = "s3"


@attrs.frozen
class Listing:
    record: ArtifactRecord
    tiers: tuple[str, ...]  # tier names holding it, in store order


@attrs.frozen
class Removal:
    tier: str
    record: ArtifactRecord


@attrs.frozen
class GcReport:
    keep: int
    dry_run: bool
    removals: tuple[Removal, ...]  # deleted, or to delete on a dry run
    kept: tuple[str, ...]  # keys kept
    debris: tuple[tuple[str, str], ...]  # (tier, path or URL) of interrupted writes
    busy: tuple[tuple[str, str], ...] = ()  # (tier, key) skipped: in use by a publisher or fetcher

    @property
    def freed(self) -> int:
        return sum(r.record.size for r in self.removals)


def _current_targets(tiers) -> set[str]:
    """The key every name currently resolves to, in any of these tiers."""
    current = set()
    for tier in tiers:
        for name in tier.ref_names():
            history = tier.read_refs(name)
            if history:
                current.add(history[-1]["key"])
    return current


def store_config_text(s3: S3Config) -> str:
    """store.toml for a store directory: where its S3 tier is. Never credentials."""
    lines = [
        "# Where this store's S3 tier is; written by efabuild when it publishes.",
        "# No credentials here: boto3's standard chain (environment, ~/.aws, instance role) supplies them.",
        "[s3]",
    ]
    for name in ("bucket", "prefix", "region", "endpoint_url"):
        value = getattr(s3, name)
        if value:
            lines.append(f"{name} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


class Store:
    def __init__(
        self,
        fs_tiers: list[FilesystemTier],
        s3: S3Config | None = None,
        *,
        keep: int = DEFAULT_KEEP,
        pins: tuple[str, ...] = (),
        show_progress: bool = True,
        s3_options: dict | None = None,
    ) -> None:
        if not fs_tiers:
            raise ValueError("a store needs at least one filesystem tier")
        self.fs_tiers = list(fs_tiers)  # lookup order: shared first
        self.s3_settings = s3
        self.keep = keep
        self.pins = tuple(pins)
        self.show_progress = show_progress
        self._s3_options = dict(s3_options or {})
        self._s3 = None

    # ---- construction
    @classmethod
    def from_config(cls, config: StoreConfig, **options: object) -> Store:
        tiers = [FilesystemTier(path, name) for name, path in config.roots()]
        return cls(tiers, config.s3, keep=config.keep, pins=config.pins, **options)

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
    def s3(self):  # noqa: ANN201 - S3Tier, imported only when S3 is used
        if self.s3_settings is None:
            return None
        if self._s3 is None:
            from efabuild.store.s3 import S3Tier

            self._s3 = S3Tier(self.s3_settings, show_progress=self.show_progress, **self._s3_options)
        return self._s3

    @property
    def tier_names(self) -> tuple[str, ...]:
        names = tuple(t.name for t in self.fs_tiers)
        return names + ((S3_TIER,) if self.s3_settings else ())

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
        return ", ".join(parts)

    # ---- presence
    def where(self, key: str, *, remote: bool = True) -> tuple[str, ...]:
        """Names of the tiers holding `key` committed (S3 asked only when `remote`)."""
        check_key(key)
        names = tuple(tier.name for tier in self.fs_tiers if tier.has(key))
        if remote and self.s3 is not None and self.s3.has(key):
            names += (S3_TIER,)
        return names

    def has(self, key: str) -> bool:
        """True when every tier holds `key`: nothing left to publish."""
        return len(self.where(key)) == len(self.tier_names)

    def complete(self, key: str) -> dict[str, str] | None:
        """Copy `key` from a tier that has it into the tiers that don't; None if no filesystem
        tier has it (then it must be exported). Saves a re-export when only one tier lacks it."""
        check_key(key)
        hit = self.local_hit(key)
        if hit is None:
            return None
        tier, path = hit
        record = tier.record(key)
        if record is None:
            return None
        return self.publish(key, path, record, tier.manifest(key), envelope=tier.envelope(key))

    # ---- publish
    def publish(
        self,
        key: str,
        sqsh: str | os.PathLike[str],
        record: ArtifactRecord,
        manifest: bytes | None = None,
        *,
        envelope: bytes | None = None,
    ) -> dict[str, str]:
        """Store an exported .sqsh in every tier and point its name at it.

        Returns {tier name: "published" | "reused" | "repaired"}. `record.manifest_digest` is
        set from `manifest` here; `envelope` is the signed statement, stored beside it. Interrupting it leaves every tier without the object or with
        the complete object, never a partial one; running it again finishes the job.
        """
        check_key(key)
        if manifest is not None:
            record = attrs.evolve(record, manifest_digest=bytes_digest(manifest))
        elif record.manifest_digest is not None:
            record = attrs.evolve(record, manifest_digest=None)  # no manifest stored with it
        results: dict[str, str] = {}
        source, current, current_manifest, current_envelope = Path(sqsh), record, manifest, envelope
        for tier in reversed(self.fs_tiers):  # local first: a link, no copy
            results[tier.name] = tier.publish(key, source, current, current_manifest,
                                              show_progress=self.show_progress, envelope=current_envelope)
            # Later tiers copy what this tier holds (it may have kept an earlier identical export).
            source = tier.sqsh_path(key)
            current = tier.record(key) or current
            current_manifest = tier.manifest(key)
            current_envelope = tier.envelope(key)
            # the name asked for: identical inputs in two graphs share one object under two names
            tier.append_ref(record.name, key)
            if self.s3_settings is not None:
                tier.write_config(store_config_text(self.s3_settings))
        if self.s3 is not None:
            results[S3_TIER] = self.s3.publish(key, source, current, current_manifest, envelope=current_envelope)
            self.s3.append_ref(record.name, key)
        return results

    def name(self, name: str, key: str) -> None:
        """Point `name` (graph:layer) at an artifact the store already holds, in every tier."""
        check_key(key)
        for tier in self.fs_tiers:
            tier.append_ref(name, key)
        if self.s3 is not None:
            self.s3.append_ref(name, key)

    # ---- resolve and lookup
    def resolve(self, ref: str, *, remote: bool = True) -> str:
        """A full key for `ref`: a key, a unique prefix of ≥ 8 hex, or graph:layer."""
        kind, value = classify_ref(ref)
        key = resolve_in([tier.layout for tier in self.fs_tiers], ref)
        if key is not None and kind == "name" and remote and self.s3_settings is not None:
            newest = newest_ref([tier.layout for tier in self.fs_tiers], value)
            if newest is not None and newest.get("via") == S3_TIER:
                # this filesystem only copied the name from S3 at a fetch: a later make may
                # have moved it, and only S3 knows
                try:
                    history = self.s3.read_refs(value)
                    key = history[-1]["key"] if history else key
                except EfabuildError as exc:
                    print(f"efabuild: warning: S3 not reachable, {value} as last fetched: {exc}", file=sys.stderr)
        if key is None and remote and self.s3 is not None:
            if kind == "name":
                history = self.s3.read_refs(value)
                key = history[-1]["key"] if history else None
            else:
                key = pick_one(value, self.s3.resolve_prefix(value))
        if key is None:
            what = f"named {value}" if kind == "name" else f"with key prefix {value}"
            asked = self.describe() if remote else ", ".join(f"{t.name} {t.root}" for t in self.fs_tiers)
            raise NotFound(f"no artifact {what} in {asked}")
        return key

    def lookup(self, ref: str, fetch: bool = True, verify: bool = False) -> Path:
        """Absolute path of the .sqsh on a filesystem tier; fetched from S3 when only S3 has it."""
        key = self.resolve(ref, remote=fetch)
        hit = self.local_hit(key)
        if hit is not None:
            tier, path = hit
            if verify:
                tier.verify(key)
            return path
        if self.s3_settings is None:
            raise NotFound(f"artifact {short(key)} ({ref}) is in no tier of {self.describe()}")
        if not fetch:
            raise NotFound(f"artifact {short(key)} ({ref}) is not on {', '.join(t.name for t in self.fs_tiers)}"
                           f" (--no-fetch: S3 not asked)")
        path = self.fetch(key)  # a fetch always verifies
        kind, value = classify_ref(ref)
        if kind == "name":  # the next lookup finds the object here; S3 still says which key
            s3_history = self.s3.read_refs(value)
            when = s3_history[-1]["time"] if s3_history and s3_history[-1]["key"] == key else None
            self.fetch_tier.append_ref(value, key, when=when, via=S3_TIER)
        return path

    def local_hit(self, key: str) -> tuple[FilesystemTier, Path] | None:
        for tier in self.fs_tiers:
            if tier.has(key):
                return tier, tier.sqsh_path(key)
        return None

    def fetch(self, key: str) -> Path:
        """Copy an artifact from S3 into the shared (else local) tier, once, under its key lock."""
        if self.s3 is None:
            raise NotFound(f"artifact {short(key)}: no S3 tier to fetch from")
        target = self.fetch_tier
        with target.key_lock(key):
            if target.has(key):  # fetched by someone else while we waited
                return target.sqsh_path(key)
            record = self.s3.record(key)
            if record is None:
                raise NotFound(f"artifact {short(key)} is in no tier of {self.describe()}")
            if record.key != key:
                raise EfabuildError(f"{self.s3.url(self.s3.record_object(key))}: record is for "
                                    f"{short(record.key)}, not {short(key)}")
            manifest = self.s3.manifest(key) if record.manifest_digest else None
            if manifest is not None and bytes_digest(manifest) != record.manifest_digest:
                print(f"efabuild: warning: s3 tier: the manifest of {short(key)} does not match its "
                      f"record; fetching the artifact without it", file=sys.stderr)
                manifest = None
            if manifest is None and record.manifest_digest:
                record = attrs.evolve(record, manifest_digest=None)
            envelope = self.s3.envelope(key)  # checked by whoever verifies, like on any tier
            staged = target.staging_path(key)
            try:
                self.s3.download(key, staged, record)
                target.publish_locked(key, staged, record, manifest, show_progress=self.show_progress,
                                      envelope=envelope)
            finally:
                staged.unlink(missing_ok=True)
        return target.sqsh_path(key)

    # ---- metadata
    def record(self, key: str) -> ArtifactRecord | None:
        for tier in self.fs_tiers:
            record = tier.record(key)
            if record is not None:
                return record
        return self.s3.record(key) if self.s3 is not None else None

    def manifest(self, key: str) -> bytes | None:
        for tier in self.fs_tiers:
            if tier.has(key):
                manifest = tier.manifest(key)
                if manifest is not None:
                    return manifest
        return self.s3.manifest(key) if self.s3 is not None else None

    def envelope(self, key: str) -> bytes | None:
        """The signed statement of `key` from the first tier holding the artifact."""
        for tier in self.fs_tiers:
            if tier.has(key):
                return tier.envelope(key)
        return self.s3.envelope(key) if self.s3 is not None else None

    def write_envelope(self, key: str, envelope: bytes) -> list[str]:
        """Store a re-signed statement on every tier holding `key`; the tiers written."""
        written = []
        for tier in self.fs_tiers:
            if tier.has(key):
                tier.write_envelope(key, envelope)
                written.append(tier.name)
        if self.s3 is not None and self.s3.has(key):
            self.s3.write_envelope(key, envelope)
            written.append(S3_TIER)
        return written

    def ls(self, *, remote: bool = True) -> list[Listing]:
        """Every artifact with the tiers holding it, by name then creation time."""
        found: dict[str, tuple[ArtifactRecord, list[str]]] = {}
        for tier in self._tiers(remote):
            for record in tier.list():
                found.setdefault(record.key, (record, []))[1].append(tier.name)
        listings = [Listing(record, tuple(tiers)) for record, tiers in found.values()]
        return sorted(listings, key=lambda l: (l.record.name, l.record.created, l.record.key))

    def _tiers(self, remote: bool) -> list:
        return self.fs_tiers + ([self.s3] if remote and self.s3 is not None else [])

    # ---- garbage collection
    def gc(
        self,
        keep: int | None = None,
        pins: tuple[str, ...] | list[str] | None = None,
        dry_run: bool = True,
        *,
        remote: bool = True,
    ) -> GcReport:
        """Delete all but the newest `keep` keys of every name, the current ref targets and pins.

        Decided over the union of all tiers, so every tier keeps the same keys. Objects being
        published or fetched right now (key lock held) are skipped. Leftovers of interrupted
        writes are removed too.
        """
        keep = self.keep if keep is None else keep
        if keep < 1:
            raise InputError(f"--keep must be at least 1, not {keep}")
        pins = self.pins if pins is None else tuple(pins)
        tiers = self._tiers(remote)
        held = {tier.name: tier.list() for tier in tiers}
        keep_keys = self._keys_to_keep(held, tiers, keep, pins)
        removals = tuple(
            Removal(tier.name, record)
            for tier in tiers
            for record in held[tier.name]
            if record.key not in keep_keys
        )
        debris = tuple((tier.name, str(item)) for tier in tiers for item in tier.debris())
        report = GcReport(keep, dry_run, removals, tuple(sorted(keep_keys)), debris)
        if dry_run:
            return report
        return attrs.evolve(report, busy=self._remove(tiers, removals, debris))

    def _keys_to_keep(self, held: dict, tiers: list, keep: int, pins: tuple[str, ...]) -> set[str]:
        by_name: dict[str, dict[str, str]] = defaultdict(dict)  # name -> key -> created
        for records in held.values():
            for record in records:
                by_name[record.name][record.key] = max(by_name[record.name].get(record.key, ""), record.created)
        keep_keys: set[str] = set()
        for versions in by_name.values():
            newest = sorted(versions, key=lambda k: (versions[k], k), reverse=True)
            keep_keys.update(newest[:keep])
        keep_keys |= _current_targets(tiers)  # what a name currently resolves to stays resolvable
        all_keys = {record.key for records in held.values() for record in records}
        for pin in pins:
            kind, value = classify_ref(pin)
            if kind == "key":
                keep_keys.add(value)
            elif kind == "prefix":
                keep_keys.update(k for k in all_keys if k.startswith(value))
            else:  # a pinned name keeps every version of it
                keep_keys.update(by_name.get(value, {}))
        return keep_keys

    def _remove(self, tiers: list, removals: tuple[Removal, ...], debris: tuple) -> tuple:
        by_name = {tier.name: tier for tier in tiers}
        busy = []
        gone: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        for removal in removals:
            tier, key = by_name[removal.tier], removal.record.key
            if isinstance(tier, FilesystemTier):
                lock = tier.key_lock(key)
                try:
                    lock.acquire(blocking=False)
                except LockBusy:
                    busy.append((tier.name, key))
                    continue
                try:
                    # a make may have made this key current again since gc looked: ask afresh
                    if key in _current_targets(tiers):
                        continue
                    tier.delete(key)
                    lock.remove()  # while held: see FileLock's inode check
                finally:
                    lock.release()
            else:
                if key in _current_targets(tiers):
                    continue
                tier.delete(key)
            gone[tier.name][removal.record.name].add(key)
        for tier_name, names in gone.items():
            for name, keys in names.items():
                by_name[tier_name].drop_ref_entries(name, keys)
        for tier_name, item in debris:
            tier = by_name[tier_name]
            if isinstance(tier, FilesystemTier):
                tier.remove_debris(Path(item))
            else:
                tier.remove_debris(item)
        return tuple(busy)

