"""What differs between two artifacts' manifests: declared inputs and measured versions (pure).

Outputs of a build that always differ between two keys (digests, sizes, times) are left out; the
point is to say *why* two artifacts differ.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from efabuild.settings import COMPONENTS

INPUTS, MEASURED, TOOLS = "input", "measured", "tool"


@attrs.frozen
class Difference:
    kind: str  # INPUTS, MEASURED or TOOLS
    what: str
    a: str | None
    b: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "what": self.what, "a": self.a, "b": self.b}


def diff_manifests(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Difference]:
    flat_a, flat_b = flatten(a), flatten(b)
    out = []
    for (kind, what) in sorted(set(flat_a) | set(flat_b), key=_order(flat_a, flat_b)):
        va, vb = flat_a.get((kind, what)), flat_b.get((kind, what))
        if va != vb:
            out.append(Difference(kind, what, va, vb))
    return out


def _order(flat_a: dict, flat_b: dict):
    # inputs, then measured versions, then tools; within each, the order facts are listed in
    # (base first, layers bottom-up, components in display order), B's extra facts after A's
    kinds = {INPUTS: 0, MEASURED: 1, TOOLS: 2}
    position = {k: i for i, k in enumerate(list(flat_a) + [k for k in flat_b if k not in flat_a])}
    return lambda k: (kinds[k[0]], position[k])


def flatten(manifest: Mapping[str, Any]) -> dict[tuple[str, str], str | None]:
    """(kind, what) -> value as text, for every compared fact of a manifest."""
    flat: dict[tuple[str, str], str | None] = {}
    base = manifest.get("base") or {}
    flat[(INPUTS, "base ref")] = base.get("ref")
    flat[(INPUTS, "base digest")] = base.get("digest")
    for option, value in sorted(((manifest.get("artifact") or {}).get("export") or {}).items()):
        flat[(INPUTS, f"export {option}")] = _text(value)
    for entry in manifest.get("chain") or []:
        layer = entry.get("layer", "?")
        inputs = entry.get("inputs") or {}
        flat[(INPUTS, f"{layer} key")] = entry.get("key")
        flat[(INPUTS, f"{layer} Dockerfile")] = inputs.get("dockerfile_digest")
        flat[(INPUTS, f"{layer} platform")] = inputs.get("platform")
        for arg, value in sorted((inputs.get("args") or {}).items()):
            flat[(INPUTS, f"{layer} arg {arg}")] = _text(value)
        for item in inputs.get("context") or []:
            if isinstance(item, (list, tuple)) and len(item) == 3:
                path, mode, digest = item
                flat[(INPUTS, f"{layer} file {path}")] = f"{mode} {str(digest)[:12]}"
    measured = manifest.get("measured") or {}
    if isinstance(measured.get("machine"), dict):  # manifests made before it was recorded lack it
        flat[(MEASURED, "machine")] = _text(measured["machine"].get("name"))
    components = measured.get("components") or {}
    for name in list(COMPONENTS) + sorted(set(components) - set(COMPONENTS)):
        component = components.get(name) or {}
        flat[(MEASURED, name)] = component.get("version")
        if component.get("commit") is not None:
            flat[(MEASURED, f"{name} commit")] = component["commit"]
        if component.get("loads") is not None:
            flat[(MEASURED, f"{name} loads")] = component["loads"]
        for copy in component.get("copies") or []:
            flat[(MEASURED, f"{name} at {copy.get('path')}")] = copy.get("version")
    for install in measured.get("openmpi") or []:
        flat[(MEASURED, f"openmpi at {install.get('real_path')}")] = install.get("version")
    for name, value in sorted(((measured.get("env") or {}).get("vars") or {}).items()):
        flat[(MEASURED, f"env {name}")] = value
    for name, declared in sorted((measured.get("declared_by_base") or {}).items()):
        flat[(MEASURED, f"declared {name}")] = (declared or {}).get("value")
    for tool, version in sorted((manifest.get("builder") or {}).items()):
        flat[(TOOLS, tool)] = _text(version)
    return flat


# what must agree between the platforms of one name: a job on either partition talks to the other
# through them (NCCL's wire protocol, the EFA provider, the plugin) or runs the same model code
ACROSS_PLATFORMS = ("nccl", "libfabric", "aws-ofi-nccl", "pytorch", "cuda")


@attrs.frozen
class Agreement:
    component: str
    a: str | None
    b: str | None

    @property
    def agrees(self) -> bool:
        return self.a == self.b

    def to_dict(self) -> dict[str, Any]:
        return {"component": self.component, "a": self.a, "b": self.b, "agree": self.agrees}


def platform_agreement(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Agreement]:
    """Whether the versions of ACROSS_PLATFORMS measured in two artifacts (a name on two
    platforms) are the same: one row each, absent ones as None."""
    def version(manifest: Mapping[str, Any], name: str) -> str | None:
        component = ((manifest.get("measured") or {}).get("components") or {}).get(name) or {}
        return component.get("version") if isinstance(component, dict) else None

    return [Agreement(name, version(a, name), version(b, name)) for name in ACROSS_PLATFORMS]


def agreement_verdict(rows: list[Agreement], platform_a: str, platform_b: str) -> str:
    differ = [row for row in rows if not row.agrees]
    if not differ:
        return f"{', '.join(row.component for row in rows)} agree across {platform_a} and {platform_b}"
    shown = "; ".join(f"{row.component} {row.a or '-'} on {platform_a}, {row.b or '-'} on {platform_b}"
                      for row in differ)
    return f"differ across platforms: {shown}"


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return str(value)
