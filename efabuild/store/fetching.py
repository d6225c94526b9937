"""A router's lookup: the path of an intact `.sqsh` for a ref, fetched from the remote tier (S3)
into the shared (else local) tier when no filesystem tier holds one, verified before it becomes
visible. The CLI, job scripts and the Pyxis importer reach it through store/lookup.py's
`lookup_path`, whose fast path answers a hit without loading this module.
"""

from __future__ import annotations

from pathlib import Path

from efabuild.errors import NotFound
from efabuild.host import treecache
from efabuild.refs import classify_ref, short
from efabuild.store import naming, tierhealth as health
from efabuild.store.lookup import first_intact
from efabuild.store.platformindex import IndexVet, Wanted, check_record, manifest_platform_of
from efabuild.store.record import ArtifactRecord
from efabuild.store.router import Router
from efabuild.store.transfer import Vet, transfer


def lookup(store: Router, ref: str, fetch: bool = True, verify: bool = False, vet: Vet | None = None,
           deep: bool = False, check_s3: bool = False, *, platform: str | None = None,
           vet_index: IndexVet | None = None, environ: dict[str, str] | None = None) -> Path:
    """The .sqsh on a tier whose copy is intact by a stat, else fetched from S3 (`verify`: see
    verify). A name's platform index picks the node's platform (or `@os/arch`'s), and the
    record of the key it picks must agree, before a fetch writes a byte."""
    wanted = Wanted.of(ref, platform, environ)
    resolved = naming.resolve_choice(store, wanted, remote=fetch, vet_index=vet_index)
    key, signed = resolved.key, vet is not None or vet_index is not None  # signed: a name's record is its own
    hit, damaged = first_intact([tier.layout for tier in store.fs_tiers], key)
    if hit is not None:
        check_record(resolved, wanted, hit[1], manifest_platform_of(hit[0], key), signed=signed)
        if verify:
            health.check_copies(store, key, remote=fetch and check_s3, deep=deep)
        return hit[0].sqsh_path(key)

    def vetted(record: ArtifactRecord, sidecars: dict[str, bytes]) -> None:
        check_record(resolved, wanted, record.to_dict(), signed=signed)
        if vet is not None:
            vet(record, sidecars)

    try:
        if store.remote is None:
            raise NotFound(f"artifact {short(key)} ({ref}) is in no tier of {store.describe()}")
        if not fetch:
            raise NotFound(f"artifact {short(key)} ({ref}) is not on {', '.join(t.name for t in store.fs_tiers)}"
                           f" (--no-fetch: {'S3' if store.s3_settings else store.remote_name} not asked)")
        path = fetch_remote(store, key, vet=vetted)  # a fetch always verifies
    except NotFound as exc:  # what is wrong with a copy here says more than where it is not
        raise (damaged[0] if damaged else exc) from None
    if verify:  # its chunks taken from seeds say nothing of the bucket's
        health.check_copies(store, key, remote=check_s3, deep=deep)
    kind, value = classify_ref(wanted.ref)
    if kind == "name":  # the next lookup finds the object here; S3 still says which key
        naming.copy_name(store, value, key)
    return path


def fetch_remote(store: Router, key: str, vet: Vet | None = None) -> Path:
    """Copy an artifact from the remote tier (S3) into the shared (else local) tier, once, under
    its key lock, over a damaged copy there; `vet` may refuse it before a byte is written
    (transfer.Vet)."""
    remote = store.remote
    if remote is None:
        raise NotFound(f"artifact {short(key)}: no S3 tier to fetch from")
    target = store.fetch_tier
    with target.key_lock(key):
        if first_intact([target.layout], key)[0] is None:  # else fetched meanwhile (the caller vets it)
            transfer(key, remote, [target], target, locked=True, show_progress=store.show_progress, vet=vet)
            store.fetched[key] = (target.sqsh_path(key).absolute(), remote.last_fetched)
            if remote.last_tree is not None and remote.last_fetched is not None:  # for the next fetch onto it
                treecache.remember(target.sqsh_path(key), remote.last_fetched, *remote.last_tree)
    return target.sqsh_path(key)
