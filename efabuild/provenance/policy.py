"""The `[audit]` policy of BUILD.toml: minimum versions, required pins, known-bad combinations."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from efabuild.settings import AuditPolicy, KNOWN_PINS
from efabuild.provenance import versions
from efabuild.provenance.checks import FAIL, PASS, SKIP, Check
from efabuild.provenance.declared import DECLARING_ARGS
from efabuild.provenance.measured import Measured
from efabuild.provenance.pitfalls import openmpi_in_use


def policy_checks(
    policy: AuditPolicy, image: Measured, manifest: Mapping[str, Any], args: Mapping[str, tuple[str, str]]
) -> list[Check]:
    checks = []
    for component_name, minimum in policy.min_versions:
        actual = _version_of(image, component_name)
        name = f"policy-min:{component_name}"
        if actual is None:
            checks.append(Check(name, FAIL, f"{component_name} version unknown; policy requires >= {minimum}"))
        elif versions.compare(actual, minimum) == -1:
            checks.append(Check(name, FAIL, f"{component_name} {actual} is older than the policy minimum {minimum}"))
        else:
            checks.append(Check(name, PASS, f"{component_name} {actual} >= {minimum}"))
    for pin in policy.required_pins:
        checks.append(_pin(pin, image, manifest, args))
    for a_name, a_spec, b_name, b_spec, why in policy.known_bad:
        a, b = _version_of(image, a_name), _version_of(image, b_name)
        a_hit, b_hit = versions.satisfies(a, a_spec), versions.satisfies(b, b_spec)
        label = f"{a_name}{a_spec} with {b_name}{b_spec}"
        if a_hit and b_hit:
            checks.append(Check("policy-known-bad", FAIL, f"{a_name} {a} with {b_name} {b}: {why}"))
        elif a_hit is False or b_hit is False:
            checks.append(Check("policy-known-bad", PASS, f"not {label}"))
        else:
            unknown = [n for n, v in ((a_name, a), (b_name, b)) if v is None]
            detail = f"{' and '.join(unknown)} unknown" if unknown else "unparsable version"
            checks.append(Check("policy-known-bad", SKIP, f"{label}: {detail}"))
    return checks


def _version_of(image: Measured, component_name: str) -> str | None:
    if component_name == "openmpi":
        # the one programs use when one is (the EFA installer's beside NGC's is not used), else
        # the one release every installation agrees on
        used = {m.real_path: m.version for m in openmpi_in_use(image)}
        if len(used) == 1:
            return next(iter(used.values()))
        found = {m.version for m in image.openmpi}
        return found.pop() if len(found) == 1 else None
    return image.component(component_name).version


def _pin(pin: str, image: Measured, manifest: Mapping[str, Any], args: Mapping[str, tuple[str, str]]) -> Check:
    name = f"policy-pin:{pin}"
    if pin == "base-digest":
        digest = ((manifest.get("base") or {}).get("digest")) if manifest else None
        if digest:
            return Check(name, PASS, f"base pinned at {digest[:19]}…")
        ref = (manifest.get("base") or {}).get("ref") if manifest else None
        return Check(name, FAIL, f"base {ref or '(unknown)'} is not pinned by digest")
    if pin == "deepep-commit":
        declared = [a for a, (component, field) in DECLARING_ARGS.items() if component == "deepep" and a in args]
        if not declared:
            return Check(name, FAIL, "no DeepEP commit declared (HYBRID_EP_COMMIT / DEEPEP_COMMIT build arg)")
        value = args[declared[0]][0]
        if len(value) != 40:
            return Check(name, FAIL, f"{declared[0]}={value} is not a full commit hash")
        return Check(name, PASS, f"{declared[0]}={value[:12]}")
    if pin == "efa-installer":
        if "EFA_INSTALLER_VERSION" in args:
            return Check(name, PASS, f"EFA_INSTALLER_VERSION={args['EFA_INSTALLER_VERSION'][0]}")
        return Check(name, FAIL, "no EFA_INSTALLER_VERSION build arg in the layer chain")
    if pin.startswith("arg:"):
        arg = pin[4:]
        if arg in args:
            return Check(name, PASS, f"{arg}={args[arg][0]}")
        return Check(name, FAIL, f"build arg {arg} is not set in the layer chain")
    return Check(name, FAIL, f"unknown pin {pin!r} (known: {', '.join(KNOWN_PINS)}, arg:NAME)")
