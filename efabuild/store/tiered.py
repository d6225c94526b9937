"""`Store`: the router (store/router.py) with what is done over its tiers as its methods.

- publish goes to every tier: local first (a hard link of the export when it is on the same
  filesystem), then shared, then the remote tier (S3); later tiers copy what the first one holds,
  so all tiers hold the same bytes and record (publishing.py).
- lookup looks at the filesystem tiers without locks (shared first: every node sees that path),
  and only when none holds a copy of the recorded size asks the remote tier and fetches into the
  shared tier (else local, over a damaged copy) under the key's lock, verified before it becomes
  visible (fetching.py).
- names ("graph:layer") resolve through the filesystem tiers' refs (lookup.local_choice, also
  `efabuild lookup`'s); S3's only when no filesystem tier knows the name, or only as copied from
  S3 (a shared tier makes builders and jobs agree) (naming.py).
- verify re-hashes every tier's copy (tierhealth.py); gc keeps what gc.keys_to_keep decides over
  every tier and deletes the rest (gc/sweep.py).

Each operation is a function of the router in its own module; the class only names them, so a
caller holds one object and the modules stay apart.
"""

from __future__ import annotations

from efabuild.store import fetching, naming, publishing, tierhealth
from efabuild.store.gc.sweep import GcReport, collect_garbage
from efabuild.store.router import Listing, Router

__all__ = ["Listing", "Store"]


class Store(Router):
    publish = publishing.publish
    complete = publishing.complete
    name = publishing.name
    send_ahead = publishing.send_ahead
    withdraw_damaged = publishing.withdraw_damaged
    lookup = fetching.lookup
    fetch = fetching.fetch_remote
    resolve = naming.resolve
    resolve_choice = naming.resolve_choice
    publish_index = naming.publish_index
    verify = tierhealth.verify
    check_copies = tierhealth.check_copies
    check_s3 = tierhealth.check_s3

    def gc(self, keep: int | None = None, pins: tuple[str, ...] | list[str] | None = None, dry_run: bool = True,
           *, remote: bool = True, delete_remote: bool = True) -> GcReport:
        """All but the newest `keep` keys of every name, the current ref targets and pins, deleted
        from every tier (the remote one only with `delete_remote`; see sweep.collect_garbage)."""
        keep = self.keep if keep is None else keep
        pins = self.pins if pins is None else tuple(pins)
        return collect_garbage(self.tiers(remote), keep, pins, dry_run=dry_run, delete_remote=delete_remote,
                               chunk_grace=self.chunk_grace)
