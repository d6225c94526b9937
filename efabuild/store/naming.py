"""A router's names: which key a ref names over the tiers (a name's platform index picking the
node's platform), a name's index published on every tier, and a name fetched from the remote
tier copied to the fetch tier.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from efabuild import notices
from efabuild.errors import EfabuildError, NotFound
from efabuild.platforms import index_bytes, index_digest, parse_index, primary_key
from efabuild.refs import classify_ref, pick_one
from efabuild.store.lookup import local_choice
from efabuild.store.names import platform_index
from efabuild.store.platformindex import IndexVet, Resolved, Wanted, check_record, choose, platform_in_manifest
from efabuild.store.record import utc_now
from efabuild.store.router import Router
from efabuild.store.tiers.base import S3_TIER

if TYPE_CHECKING:
    from efabuild.store.tiers.base import Tier


def publish_index(store: Router, name: str, platforms: dict[str, str], *, envelope: bytes | None = None,
                  data: bytes | None = None, sign: Callable[[bytes], bytes] | None = None) -> str:
    """Point `name` at its platform index (platform -> key of each platform built from the same
    inputs), stored on every tier with its envelope (`sign(data)`: make's [sign] key), before
    the name's new history entry names it by its sha256. Returns the sha256 ('' when every tier's
    current index already lists these keys)."""
    tiers = list(store.tiers(remote=True))
    if data is None:
        # a make that changed none of the name's keys leaves its index as it is (a new one
        # would differ only by its time): no write, no signature, no history entry
        tiers = [tier for tier in tiers if _current_platforms(tier, name, signed=sign is not None) != dict(platforms)]
        if not tiers:
            return ""
    data = index_bytes(name, platforms, utc_now()) if data is None else data
    envelope = sign(data) if sign is not None else envelope
    digest = index_digest(data)
    primary = primary_key(parse_index(data, digest, f"platform index of {name}"))
    for tier in tiers:
        tier.names.write_index(digest, data, envelope)
        tier.names.append(name, primary, index=digest)
    return digest


def resolve(store: Router, ref: str, *, remote: bool = True, platform: str | None = None,
            vet_index: IndexVet | None = None) -> str:
    """A full key for `ref`: a key, a unique prefix of ≥ 8 hex, or graph:layer (its key on
    the node's platform, or `@os/arch`'s, by its platform index, which `vet_index` may refuse)."""
    wanted = Wanted.of(ref, platform)
    resolved = resolve_choice(store, wanted, remote=remote, vet_index=vet_index)
    if resolved.platform is not None or wanted.platform:  # never the index alone: its key's record must agree
        record = store.record(resolved.key)
        if record is not None:
            check_record(resolved, wanted, record.to_dict(),
                         lambda: platform_in_manifest(store.manifest(resolved.key)), signed=vet_index is not None)
    return resolved.key


def resolve_choice(store: Router, wanted: Wanted, *, remote: bool = True,
                   vet_index: IndexVet | None = None) -> Resolved:
    ref = wanted.ref
    kind, value = classify_ref(ref)
    resolved = local_choice([tier.layout for tier in store.fs_tiers], wanted, vet_index)
    if resolved is not None and resolved.via_s3 and remote and store.remote is not None:
        # this filesystem only copied the name from S3 at a fetch: a later make may have
        # moved it, and only S3 knows
        try:
            history = store.remote.names.read(value)
        except EfabuildError as exc:
            notices.warn(f"S3 not reachable, {value} as last fetched: {exc}")
        else:
            resolved = _remote_choice(store, value, history, wanted, vet_index) or resolved
    if resolved is None and remote and store.remote is not None:
        if kind == "name":
            resolved = _remote_choice(store, value, store.remote.names.read(value), wanted, vet_index)
        else:
            key = pick_one(value, [record.key for record in store.remote.list(value)])
            resolved = None if key is None else Resolved(key)
    if resolved is None:
        what = f"named {value}" if kind == "name" else f"with key prefix {value}"
        asked = store.describe() if remote else ", ".join(f"{t.name} {t.root}" for t in store.fs_tiers)
        raise NotFound(f"no artifact {what} in {asked}")
    return resolved


def _remote_choice(store: Router, name: str, history: list[dict], wanted: Wanted,
                   vet_index: IndexVet | None) -> Resolved | None:
    if not history:
        return None
    return choose(history[-1], name, wanted, store.remote.names.read_index, store.remote.names.index_url, vet_index)


def copy_name(store: Router, name: str, key: str) -> None:
    """S3's newest entry of `name`, and the index it names, onto the fetch tier (via S3)."""
    s3_history = store.remote.names.read(name)
    newest = s3_history[-1] if s3_history else {}
    digest = newest.get("index")
    if digest is not None:
        data, envelope = store.remote.names.read_index(digest)
        if data is not None:
            store.fetch_tier.names.write_index(digest, data, envelope)
        store.fetch_tier.names.append(name, newest["key"], when=newest["time"], via=S3_TIER, index=digest)
        return
    when = newest["time"] if newest.get("key") == key else None
    store.fetch_tier.names.append(name, key, when=when, via=S3_TIER)


def _current_platforms(tier: Tier, name: str, signed: bool) -> dict | None:
    """{platform: key} of the index `name`'s newest entry names on `tier`; None when there is
    none, it cannot be read as an intact index, or it lacks the signature a signing make gives
    (then a new one is written)."""
    try:
        history = tier.names.read(name)
        digest = history[-1].get("index") if history else None
        if not digest:
            return None
        index, envelope = platform_index(tier.names, digest)
        if index is None or (signed and envelope is None):
            return None
        return dict(index["platforms"])
    except EfabuildError:
        return None
