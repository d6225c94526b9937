"""Which key a name has on the node's platform: the newest history entry of the name, and the
platform index it names (efabuild/platforms.py), read from a tier and never trusted alone.

- An entry without an index (a store from before platforms, or a one-platform name) resolves to
  its key, as it always did.
- An entry with one: the index is read bounded from a tier (never through a link), must hash to
  the sha256 the entry names and be for that name, is vetted (a trusted signature, with
  --require-signature), and gives the key of the platform wanted; that key's record must then say
  the same name and platform (`check_record`), or the artifact is refused.

Stdlib only: `efabuild lookup`'s fast path resolves names through it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import NamedTuple, TYPE_CHECKING

from efabuild import notices
from efabuild.errors import EfabuildError, InputError
from efabuild.grammar import PLATFORM
from efabuild.host import fsutil
from efabuild.host.machine import node_platform
from efabuild.platforms import (PLATFORM_ENV, MissingPlatform, checked_platform, missing_platform, parse_index, pick,
                                record_disagrees,
                                split_platform, with_platform)
from efabuild.refs import short
from efabuild.store.layout import MANIFEST_LIMIT

if TYPE_CHECKING:
    from efabuild.store.layout import Layout

# (index bytes, envelope bytes or None, where the index was read): raises to refuse the index
IndexVet = Callable[[bytes, "bytes | None", str], None]


class Wanted(NamedTuple):
    """A ref as typed, split into what it names and the platform asked for (None: the node's)."""
    ref: str  # without @platform
    platform: str | None = None
    environ: Mapping[str, str] | None = None  # where $EFABUILD_PLATFORM is read (None: os.environ)

    @classmethod
    def of(cls, ref: str, platform: str | None = None, environ: Mapping[str, str] | None = None) -> Wanted:
        bare, at = split_platform(ref)
        if platform is not None:  # checked when given, not when first needed: a name's index may never be read
            checked_platform(platform, "--platform")
        if at and platform and at != platform:
            raise InputError(f"{ref} names {at}, --platform says {platform}: give one")
        return cls(bare, at or platform, environ)

    def node(self) -> tuple[str, bool]:
        """(the platform to pick, whether it was asked for), read when first needed."""
        return node_platform(self.platform, self.environ)

    def from_env(self) -> bool:
        """Whether $EFABUILD_PLATFORM, not the ref, --platform or the node's machine, chose the platform."""
        environ = os.environ if self.environ is None else self.environ
        return self.platform is None and bool(environ.get(PLATFORM_ENV))


class Resolved(NamedTuple):
    key: str
    via_s3: bool = False
    platform: str | None = None  # the platform its index gave it for; None: no index said


def choose(entry: dict, name: str, wanted: Wanted, read_index: Callable, where: Callable[[str], str],
           vet: IndexVet | None = None) -> Resolved:
    """The key `entry` (the newest of `name`'s history) gives the platform wanted."""
    via_s3 = entry.get("via") == "s3"
    digest = entry.get("index")
    if digest is None:
        return Resolved(entry["key"], via_s3)
    data, envelope = read_index(digest)
    if data is None:
        raise EfabuildError(f"{name}: its history names platform index {short(str(digest))}, which is not "
                            f"at {where(digest)}")
    index = parse_index(data, digest, where(digest))
    if index["name"] != name:
        raise EfabuildError(f"{where(digest)}: the platform index is for {index['name']}, not {name}")
    if vet is not None:
        vet(data, envelope, where(digest))
    platform, _ = wanted.node()
    return Resolved(pick(index, platform, wanted.from_env()), via_s3, platform)


def check_record(resolved: Resolved, wanted: Wanted, record: dict,
                 manifest_platform: Callable[[], str | None] | None = None, *, signed: bool = False) -> None:
    """Refuse the record of the key a name's index picked unless it says that name and platform.
    A name's entry without an index is checked too, whoever wrote it: a record of another platform
    than the one wanted (the node's, or asked for) is refused as that platform missing, and one of
    another name is refused where signatures are required (`signed`: whoever writes the store could
    point a name at any signed artifact), else handed out with a warning (identical inputs in two
    graphs share one key: the record names the first). For a key or prefix, refuse only a platform
    asked for that the record contradicts (a record from before platforms: its manifest's, read
    only then), and warn when it is not the node's."""
    recorded = record.get("platform")
    name = wanted.ref if ":" in wanted.ref else str(record.get("name"))
    if resolved.platform is None and ":" in wanted.ref and record.get("name") != wanted.ref:
        other = str(record.get("name"))[:80]
        if signed:
            raise EfabuildError(f"refusing {wanted.ref}: its history names {short(resolved.key)}, whose record is "
                                f"{other}'s (a rewritten history?); look it up as {other} or by its key")
        notices.warn(f"{wanted.ref} ({short(resolved.key)}) is recorded as {other}: the same inputs, or a "
                     "rewritten history (--require-signature refuses it)")
    if recorded is None and wanted.platform and ":" in wanted.ref and manifest_platform is not None:
        recorded = manifest_platform()  # NAME@os/arch of an old store: the manifest names its platform
    if resolved.platform is not None:
        why = record_disagrees(record, wanted.ref, resolved.platform)
        if why is not None:
            raise EfabuildError(f"refusing {with_platform(wanted.ref, resolved.platform)}: its platform index names "
                                f"{short(resolved.key)}, whose record {why} (a rewritten index?)")
        return
    if not isinstance(recorded, str):
        return  # a record from before platforms: what it always was
    try:
        platform, asked = wanted.node()
    except EfabuildError:
        return  # a machine of no known platform: a key still names its one artifact
    if recorded == platform:
        return
    if ":" in wanted.ref:  # a name's artifact of another platform is never what a node wants
        raise MissingPlatform(missing_platform(name, platform, [recorded], wanted.from_env()))
    what = f"{wanted.ref} ({short(resolved.key)})" if ":" in wanted.ref else short(resolved.key)
    wants = f"{PLATFORM_ENV} asks for {platform}" if wanted.from_env() else f"this node is {platform}"
    notices.warn(f"{what} is a {recorded} artifact, {wants}")


def manifest_platform_of(layout: Layout, key: str) -> Callable[[], str | None]:
    """The platform the manifest beside `key` names, read when called (bounded, never through a
    link); None when there is none or it does not say."""
    def read() -> str | None:
        try:
            return platform_in_manifest(fsutil.read_under(layout.root, layout.manifest_path(key), MANIFEST_LIMIT))
        except EfabuildError:
            return None

    return read


def platform_in_manifest(data: bytes | None) -> str | None:
    """The `platform` a manifest's bytes name, when they are JSON and it is os/arch[/variant]."""
    try:
        manifest = json.loads(data) if data is not None else None
    except (ValueError, RecursionError):
        return None
    platform = manifest.get("platform") if isinstance(manifest, dict) else None
    return platform if isinstance(platform, str) and PLATFORM.fullmatch(platform) else None
