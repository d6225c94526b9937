"""A router's checks of its tiers' copies: every copy re-hashed against its record (`verify`),
S3's by store/chunked/health.py's check of its chunks, never downloaded whole. The quick checks a
make's plan asks (a stat, S3's chunk listing) are the router's own (`Router.where`)."""

from __future__ import annotations

from efabuild.errors import EfabuildError
from efabuild.store.router import Router
from efabuild.store.tiers.base import S3_TIER
from efabuild.store.transfer import DamagedCopy, verified_copy


def check_copies(store: Router, key: str, *, remote: bool, deep: bool = False) -> None:
    """One EfabuildError naming every tier whose copy of `key` `verify` finds damaged."""
    damaged = [str(exc) for _, exc in verify(store, key, remote=remote, deep=deep) if exc is not None]
    if damaged:
        raise EfabuildError("; ".join(damaged))


def check_s3(store: Router, key: str, *, deep: bool = False) -> None:
    """health.S3Damaged (one line naming the artifact and each chunk) unless S3 can deliver
    `key` or does not hold it."""
    from efabuild.store.chunked.health import S3Damaged

    health = store.s3_health(key, deep=deep) if store.s3 is not None else None
    if health is not None and not health.ok:
        raise S3Damaged(health)


def verify(store: Router, key: str, *, remote: bool = True, deep: bool = False) -> list[tuple[str, DamagedCopy | None]]:
    """Every tier's copy of `key` re-hashed against its record: [(tier, None or what is wrong)].
    An S3 copy by store/chunked/health.py's check: its index and every chunk's presence, and with
    `deep` every chunk's bytes (read, never written to disk)."""
    found = []
    for tier in store.tiers(remote):
        if not tier.has(key):
            continue
        if tier is store.s3:  # the chunks' check: a download would write the whole file
            found += _s3_verdict(store, key, deep)
            continue
        try:
            with verified_copy(key, tier, store.local_tier):
                found.append((tier.name, None))
        except DamagedCopy as exc:
            found.append((tier.name, exc))
    return found


def _s3_verdict(store: Router, key: str, deep: bool) -> list:
    """verify's [(tier, None or what is wrong)] for S3's copy of `key` ([] when S3 lacks it)."""
    from efabuild.store.chunked.health import S3Damaged

    health = store.s3_health(key, deep=deep)
    return [] if health is None else [(S3_TIER, None if health.ok else S3Damaged(health))]
