"""efabuild doctor: what NCCL, srun and build logs say about a job's EFA path, as diagnoses.

    report = examine([("job.out", open("job.out"))], expect_nics=8, baseline_gbps=180)
    print(render_text(report)); sys.exit(1 if report.problems else 0)

Each diagnosis has an id, a severity (problem, warning, ok, info, harmless), the evidence lines,
an explanation and a fix, following the guide's troubleshooting table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from efabuild.doctor.compare import compare_with_manifest
from efabuild.doctor.diagnose import diagnose
from efabuild.doctor import start as _start  # noqa: F401 (the container start's rules, registered after diagnose's)
from efabuild.doctor.facts import SEVERITIES, Diagnosis, Evidence, Facts
from efabuild.doctor.versions import mixed_versions, versions_seen
from efabuild.doctor.scan import scan_lines

__all__ = ["Diagnosis", "Evidence", "Report", "examine", "render_text", "to_json"]


@attrs.frozen
class Report:
    diagnoses: tuple[Diagnosis, ...]
    versions: Mapping[str, tuple[tuple[str, Evidence], ...]]  # component -> (version, first line)

    @property
    def problems(self) -> list[Diagnosis]:
        return [d for d in self.diagnoses if d.severity == "problem"]


def examine(sources: Iterable[tuple[str, Iterable[str]]], expect_nics: int | None = None,
            baseline_gbps: float | None = None, manifest: Mapping[str, Any] | None = None,
            artifact: str | None = None, ref: str | None = None) -> Report:
    """Diagnose log lines from (name, lines) sources; with a manifest, compare versions with it.

    `artifact` names the manifest in messages; `ref` is the store ref it came from, if any.
    """
    facts = Facts()
    for name, lines in sources:
        for observation in scan_lines(name, lines):
            facts.add(observation)
    diagnoses = diagnose(facts, expect_nics=expect_nics, baseline_gbps=baseline_gbps)
    seen = versions_seen(facts)
    diagnoses += mixed_versions(seen)
    if manifest is not None:
        diagnoses += compare_with_manifest(seen, manifest, artifact or "the artifact", ref)
    order = {severity: index for index, severity in enumerate(SEVERITIES)}
    diagnoses.sort(key=lambda d: order[d.severity])
    return Report(diagnoses=tuple(diagnoses), versions={k: tuple(v) for k, v in seen.items()})


def render_text(report: Report) -> str:
    lines: list[str] = []
    for d in report.diagnoses:
        lines.append(f"{d.severity.upper()} {d.id}: {d.title}")
        for e in d.evidence:
            lines.append(f"  {e.file}:{e.line}: {e.text}")
        lines.append(f"  why: {d.explanation}")
        lines.append(f"  fix: {d.fix}")
    if report.versions:
        seen = "; ".join(f"{component} {', '.join(v for v, _ in versions)}"
                         for component, versions in report.versions.items())
        lines.append(f"versions seen: {seen}")
    else:
        lines.append("versions seen: none (NCCL prints them with NCCL_DEBUG=INFO)")
    totals = {s: sum(1 for d in report.diagnoses if d.severity == s) for s in ("problem", "warning")}
    lines.append(f"doctor: {totals['problem']} problem{'s' if totals['problem'] != 1 else ''}, "
                 f"{totals['warning']} warning{'s' if totals['warning'] != 1 else ''}")
    return "\n".join(lines)


def to_json(report: Report) -> dict[str, Any]:
    return {
        "diagnoses": [d.to_json() for d in report.diagnoses],
        "versions": {component: [{"version": v, "file": e.file, "line": e.line} for v, e in versions]
                     for component, versions in report.versions.items()},
        "problems": len(report.problems),
    }
