"""Versions a job logged against the versions an artifact's manifest measured.

Pure: the manifest is the parsed JSON dict. Its measured components live under
`measured.components.<name>.version` (the provenance manifest); a flat `measured.<name>.version`
is read too. Unknown values (absent or null) are reported as unknown, never compared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from efabuild.doctor.facts import Diagnosis, Evidence
from efabuild.doctor.versions import normal_version

COMPARED = ("nccl", "aws-ofi-nccl", "libfabric")


def manifest_versions(manifest: Mapping[str, Any]) -> dict[str, str | None]:
    measured = manifest.get("measured")
    measured = measured if isinstance(measured, Mapping) else {}
    components = measured.get("components") if isinstance(measured.get("components"), Mapping) else measured
    out: dict[str, str | None] = {}
    for name in COMPARED:
        entry = components.get(name) if isinstance(components, Mapping) else None
        version = entry.get("version") if isinstance(entry, Mapping) else None
        out[name] = version if isinstance(version, str) and version else None
    return out


def compare_with_manifest(seen: Mapping[str, list[tuple[str, Evidence]]], manifest: Mapping[str, Any],
                          artifact: str, ref: str | None = None) -> list[Diagnosis]:
    """A problem per component the job ran at another version than the artifact pins.

    `artifact` names the manifest in messages; `ref` (a store ref) lets the fix show the lookup.
    """
    start = (f"start the job from {ref}'s .sqsh (`efabuild lookup {ref}`)" if ref
             else "start the job from the artifact's .sqsh")
    pinned = manifest_versions(manifest)
    out: list[Diagnosis] = []
    matching, unknown = [], []
    for name in COMPARED:
        logged = seen.get(name, [])
        if not logged:
            continue
        expected = pinned.get(name)
        if expected is None:
            unknown.append(name)
            continue
        # NCCL logs libfabric as major.minor only: 2.6 matches a manifest's 2.6.0
        wrong = [(v, e) for v, e in logged if normal_version(name, v) != normal_version(name, expected)]
        if wrong:
            versions = " / ".join(v for v, _ in wrong)
            out.append(Diagnosis(
                "version-mismatch", "problem", f"{name} {versions} in the job, {expected} in {artifact}",
                f"The job did not run what the image pins: {name} {expected} was measured in the artifact, the "
                "log shows another. The job used another image, or a host library (mount, LD_LIBRARY_PATH) "
                "shadowed the image's.",
                f"{start}, drop host library mounts and LD_LIBRARY_PATH exports", tuple(e for _, e in wrong[:3])))
        else:
            matching.append(f"{name} {expected}")
    if matching:
        out.append(Diagnosis(
            "versions-match", "ok", f"the job ran what {artifact} pins: {', '.join(matching)}",
            "These versions in the log equal the ones measured in the artifact.", "nothing to do"))
    if unknown:
        out.append(Diagnosis(
            "versions-unknown", "info", f"{artifact}'s manifest does not record {', '.join(unknown)}",
            "The manifest leaves these unknown (not measurable in the image), so they were not compared.",
            "nothing to do"))
    return out

