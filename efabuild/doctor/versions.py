"""The versions of NCCL, aws-ofi-nccl and libfabric a job logged, and whether its ranks agree.

Pure: read from `Facts`; compared in a normal form, as every NCCL log shows them.
"""

from __future__ import annotations

from efabuild.doctor.facts import EVIDENCE_PER_DIAGNOSIS, Diagnosis, Evidence, Facts


def versions_seen(facts: Facts) -> dict[str, list[tuple[str, Evidence]]]:
    """component -> [(version, first line showing it)] for nccl, aws-ofi-nccl and libfabric."""
    out: dict[str, list[tuple[str, Evidence]]] = {}
    for component, kind in (("nccl", "nccl-version"), ("aws-ofi-nccl", "ofi-version"),
                            ("libfabric", "libfabric-version")):
        seen = [(o.value, Evidence.of(o.line)) for o in facts.of(kind) if o.value]
        first: dict[str, Evidence] = {}
        for version, evidence in seen:
            first.setdefault(version, evidence)
        if first:
            out[component] = list(first.items())
    return out


def mixed_versions(seen: dict[str, list[tuple[str, Evidence]]]) -> list[Diagnosis]:
    out = []
    for component, versions in seen.items():
        distinct = {normal_version(component, v) for v, _ in versions}
        if len(distinct) > 1:
            out.append(Diagnosis(
                "mixed-versions", "warning", f"{component}: {' and '.join(v for v, _ in versions)} in one job",
                "Ranks loaded different versions: nodes run different images, or a host library shadows the "
                "image's on some nodes.",
                "run every node from the same .sqsh and drop host library mounts",
                tuple(e for _, e in versions[:EVIDENCE_PER_DIAGNOSIS])))
    return out


def normal_version(component: str, version: str) -> str:
    """Comparable form: aws-ofi-nccl without '-aws'; libfabric as major.minor (all NCCL logs show)."""
    version = version.strip().removeprefix("v")
    if component == "aws-ofi-nccl":
        return version.removesuffix("-aws")
    if component == "libfabric":
        return ".".join(version.split(".")[:2])
    return version
