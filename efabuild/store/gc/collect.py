"""Which artifacts gc keeps: a pure decision over what the tiers hold (no I/O).

`Store.gc` gathers the facts (every tier's records, what every name currently points at), asks
`keys_to_keep`, and deletes the rest.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from efabuild.refs import classify_ref
from efabuild.store.record import ArtifactRecord


def keys_to_keep(held: Mapping[str, Iterable[ArtifactRecord]], current: set[str], keep: int,
                 pins: Iterable[str]) -> set[str]:
    """The keys to keep over the union of all tiers (so every tier keeps the same keys): the
    newest `keep` of every name on every platform (an arm64 build never pushes out the amd64
    ones), every name's current target, and pins (a key, a key prefix, or a name: all its
    versions, every platform's). A record without a platform is of the one-platform store it
    came from: one group with the others that lack it."""
    by_name: dict[str, dict[str, str]] = defaultdict(dict)  # name -> key -> newest created
    by_group: dict[tuple[str, str | None], dict[str, str]] = defaultdict(dict)  # (name, platform) -> same
    for records in held.values():
        for record in records:
            by_name[record.name][record.key] = max(by_name[record.name].get(record.key, ""), record.created)
            group = by_group[(record.name, record.platform)]
            group[record.key] = max(group.get(record.key, ""), record.created)
    kept: set[str] = set()
    for versions in by_group.values():
        newest = sorted(versions, key=lambda k: (versions[k], k), reverse=True)
        kept.update(newest[:keep])
    kept |= current  # what a name currently resolves to stays resolvable
    all_keys = {key for versions in by_name.values() for key in versions}
    for pin in pins:
        kind, value = classify_ref(pin)
        if kind == "key":
            kept.add(value)
        elif kind == "prefix":
            kept.update(k for k in all_keys if k.startswith(value))
        else:
            kept.update(by_name.get(value, {}))
    return kept
