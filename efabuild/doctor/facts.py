"""What a job's logs showed, and what doctor concludes from it: the data the diagnosis rules share.

Pure: `Facts` groups scanned observations by kind and value, keeping the first few
lines of each as evidence; a `Diagnosis` is one conclusion with its evidence, explanation and fix.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from efabuild.doctor.scan import LogLine, Observation

SEVERITIES = ("problem", "warning", "ok", "info", "harmless")
EVIDENCE_PER_DIAGNOSIS = 3


@attrs.frozen
class Evidence:
    file: str
    line: int
    text: str

    @classmethod
    def of(cls, line: LogLine) -> Evidence:
        return cls(file=line.file, line=line.number, text=line.text)


@attrs.frozen
class Diagnosis:
    id: str
    severity: str  # problem | warning | ok | info | harmless
    title: str
    explanation: str
    fix: str
    evidence: tuple[Evidence, ...] = ()

    def to_json(self) -> dict:
        return attrs.asdict(self)


class Facts:
    """Observations grouped by kind and value, keeping the first lines of each."""

    def __init__(self, observations: Iterable[Observation] = ()) -> None:
        self.groups: dict[tuple[str, str | None], list[Observation]] = {}
        self.busbw: list[tuple[float, LogLine]] = []
        for observation in observations:
            self.add(observation)

    def add(self, observation: Observation) -> None:
        if observation.kind in ("busbw-row", "busbw", "busbw-avg"):
            values = [observation.value, observation.extra] if observation.kind == "busbw-row" else \
                [observation.value]
            for value in values:
                if value:
                    self.busbw.append((float(value), observation.line))
            key = (observation.kind, None)
        else:
            key = (observation.kind, observation.value)
        group = self.groups.setdefault(key, [])
        if len(group) < EVIDENCE_PER_DIAGNOSIS:
            group.append(observation)

    def of(self, kind: str) -> list[Observation]:
        return [o for (k, _), group in self.groups.items() if k == kind for o in group]

    def values(self, kind: str) -> list[str]:
        """Distinct values seen for a kind, in first-seen order."""
        return [v for (k, v) in self.groups if k == kind and v is not None]

    def has(self, kind: str) -> bool:
        return any(k == kind for k, _ in self.groups)

    def evidence(self, *kinds: str, values: Iterable[str] | None = None) -> tuple[Evidence, ...]:
        wanted = set(values) if values is not None else None
        found = [Evidence.of(o.line) for kind in kinds for o in self.of(kind)
                 if wanted is None or o.value in wanted]
        unique = sorted(set(found), key=lambda e: (e.file, e.line))
        return tuple(unique[:EVIDENCE_PER_DIAGNOSIS])

    def peak_busbw(self) -> tuple[float, LogLine] | None:
        rows = [(v, line) for v, line in self.busbw]
        return max(rows, key=lambda item: item[0]) if rows else None
