"""What a make ends with: each layer's outcome and, for the job side, each name's key per platform."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from efabuild.make.schedule import FAILED, SKIPPED, STATUSES, Outcome


class MakeResult(NamedTuple):
    outcomes: tuple[Outcome, ...]
    skipped_tiers: dict[str, str]  # store tier -> why nothing went there
    # outcome name (graph:layer, or graph:layer@os/arch with several platforms) -> (graph:layer, platform)
    layers: dict[str, tuple[str, str]] = {}
    artifacts: frozenset[str] = frozenset()  # the outcome names of artifact layers

    def artifact(self, name: str) -> bool:
        return name in self.artifacts

    def platform_of(self, name: str) -> str | None:
        return self.layers.get(name, (None, None))[1]

    @property
    def failed(self) -> bool:
        return any(o.status == FAILED for o in self.outcomes)

    def counts(self) -> dict[str, int]:
        """How many layers ended in each status, in STATUSES order, zeros left out."""
        counts = {s: sum(o.status == s for o in self.outcomes) for s in STATUSES}
        return {s: n for s, n in counts.items() if n}


def published_platforms(result: MakeResult, built_for: Mapping[str, tuple[str, ...]]) -> dict[str, dict[str, str]]:
    """name -> {platform: key} of every artifact this make left available (built, exported,
    copied or already stored): what a per-name platform index publishes, so that a job on an
    arm64 node finds the arm64 key of `demo:train`. `built_for`: every platform of each name
    (its layer's resolved platforms). A name is left out unless each of them is available: an
    index without the arm64 key of a failed or untargeted (`make demo:train@linux/amd64`) arm64
    layer would take the name from every arm64 node."""
    index: dict[str, dict[str, str]] = {}
    for outcome in result.outcomes:
        if outcome.status in (FAILED, SKIPPED) or not result.artifact(outcome.qualname):
            continue
        layer, platform = result.layers[outcome.qualname]
        index.setdefault(layer, {})[platform] = outcome.key
    return {name: keys for name, keys in index.items() if set(built_for.get(name, ())) <= set(keys)}


def unpublished_platforms(result: MakeResult, built_for: Mapping[str, tuple[str, ...]]) -> dict[str, list[str]]:
    """name -> the platforms it lacks, of every artifact name this make made something of but
    published no index for (see published_platforms)."""
    published = published_platforms(result, built_for)
    made: dict[str, set[str]] = {}
    for outcome in result.outcomes:
        if result.artifact(outcome.qualname):
            layer, platform = result.layers[outcome.qualname]
            made.setdefault(layer, set()).update([platform] if outcome.status not in (FAILED, SKIPPED) else [])
    return {name: [p for p in built_for.get(name, ()) if p not in ok] for name, ok in sorted(made.items())
            if name not in published}
