"""The content-addressed artifact store: `Store` over a local, a shared and an S3 tier.

Kept import-free on purpose: `efabuild lookup` imports `efabuild.store.layout` without paying
for attrs, boto3 or the tiers. `from efabuild.store import Store` still works (loaded on use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from efabuild.store.tiered import GcReport, Listing, Store
    from efabuild.store.record import ArtifactRecord

__all__ = ["ArtifactRecord", "GcReport", "Listing", "Store"]


def __getattr__(name: str) -> Any:
    if name in ("Store", "Listing", "GcReport"):
        from efabuild.store import tiered

        return getattr(tiered, name)
    if name == "ArtifactRecord":
        from efabuild.store.record import ArtifactRecord

        return ArtifactRecord
    raise AttributeError(f"module 'efabuild.store' has no attribute {name!r}")
