"""Audit checks of one artifact: pure functions over facts gathered elsewhere.

Inputs: the store's record, the stored manifest bytes, the stored .sqsh's size and digest as just
computed, the versions measured again from that .sqsh, the policy from BUILD.toml and the host's
facts. Output: one `Check` per rule. A FAIL makes `efabuild audit` exit 1; WARN informs; SKIP says
a rule could not be applied (and why).

Integrity is checked here; the other checks live by concern in `declared`, `pitfalls` and
`policy`, over the vocabulary of `checks`.

| check              | fails when                                                                        |
|--------------------|-----------------------------------------------------------------------------------|
| sqsh-integrity     | the stored .sqsh's size or blake3 differs from its record or manifest; S3's index  |
|                    | differs from the record, or a chunk is missing or fails its id (store/chunked/health.py)   |
| manifest-integrity | no manifest, its blake3 differs from the record's manifest_digest, other key       |
| manifest-vs-image  | the manifest's measured versions differ from the .sqsh measured again              |
| declared-vs-image  | a build arg (EFA_INSTALLER_VERSION, HYBRID_EP_COMMIT...) differs from the image    |
| library-shadowing  | aws-ofi-nccl / libfabric / NCCL at two versions and the older one loads first      |
| host-efa           | the image's EFA installer differs from the host AMI's                              |
| environment        | the .sqsh has no /etc/environment: the container would start without the image ENV |
| net-plugin         | NCCL_NET_PLUGIN is not ofi (NCCL would load the InfiniBand libnccl-net.so)         |
| ld-library-path    | LD_LIBRARY_PATH is not led by /opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib         |
| openmpi            | two Open MPIs in use (loader path, OPAL_PREFIX); one merely present only warns     |
| infiniband-env     | InfiniBand NCCL_* settings (NCCL_IB_*, NCCL_NET=IB...)                             |
| ofi-plugin         | no aws-ofi-nccl plugin on the loader's path                                         |
| elf-machine        | a program, library or plugin (libnccl-net*.so...) of another machine than the       |
|                    | artifact's platform (an amd64 plugin in an arm64 image), or a mixed image           |
| policy-min:NAME    | a component below its minimum version (or unknown)                                 |
| policy-pin:PIN     | a required pin missing (base-digest, deepep-commit, efa-installer, arg:NAME)        |
| policy-known-bad   | a known-bad combination of versions                                                |
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from efabuild.settings import AuditPolicy, COMPONENTS
from efabuild.provenance import manifest as manifests
from efabuild.provenance.checks import FAIL, PASS, SKIP, WARN, Check, FileFacts, HostFacts, failed
from efabuild.provenance.declared import DECLARING_ARGS, DECLARING_BASE, declared_vs_image
from efabuild.provenance.machines import elf_machine
from efabuild.provenance.measured import Component, Measured
from efabuild.provenance.pitfalls import host_efa, pitfalls, shadowing
from efabuild.provenance.policy import policy_checks

# the audit's vocabulary, for callers that know only this module
__all__ = ["DECLARING_ARGS", "DECLARING_BASE", "FAIL", "PASS", "SKIP", "WARN", "Check", "FileFacts",
           "HostFacts", "audit", "failed", "manifest_vs_image", "sqsh_integrity"]


class RecordLike(Protocol):
    key: str
    name: str
    size: int
    digest: str
    manifest_digest: str | None


def audit(
    *,
    record: RecordLike,
    manifest_bytes: bytes | None,
    sqsh: FileFacts | None,
    measured: Measured | None,
    policy: AuditPolicy,
    host: HostFacts,
    probe_error: str | None = None,
) -> list[Check]:
    """Every check for one artifact. `measured` is the stored .sqsh probed again (None if absent,
    with `probe_error` saying why when reading it failed)."""
    manifest, checks = _manifest_checks(record, manifest_bytes)
    checks.insert(0, sqsh_integrity(record, manifest, sqsh))
    stored = manifests.measured_of(manifest) if manifest is not None else None
    if measured is not None and stored is not None:
        checks.append(manifest_vs_image(stored, measured))
    elif measured is None:
        why = probe_error or ("the .sqsh is missing" if sqsh is None else "the .sqsh was not read")
        checks.append(Check("manifest-vs-image", FAIL if probe_error else SKIP,
                            f"could not measure the image again: {why}"))
    image = measured if measured is not None else stored
    if image is None:
        checks.append(Check("image", FAIL, "nothing known about the image: no manifest and no .sqsh"))
        return checks
    args = manifests.declared_args(manifest) if manifest is not None else {}
    checks += declared_vs_image(args, image)
    checks += shadowing(image)
    checks.append(host_efa(image, host))
    checks += pitfalls(image)
    checks.append(elf_machine(image, manifests.platform_of(manifest) if manifest is not None else None))
    checks += policy_checks(policy, image, manifest or {}, args)
    return checks


# ---- integrity -------------------------------------------------------------------------------
def sqsh_integrity(record: RecordLike, manifest: Mapping[str, Any] | None, sqsh: FileFacts | None) -> Check:
    name = "sqsh-integrity"
    if sqsh is None:
        return Check(name, FAIL, "the .sqsh is missing from the store")
    problems = []
    if sqsh.size != record.size:
        problems.append(f"size {sqsh.size} but the record says {record.size}")
    if sqsh.digest != record.digest:
        problems.append(f"digest {sqsh.digest} but the record says {record.digest}")
    artifact = (manifest or {}).get("artifact") or {}
    if manifest is not None and artifact.get("digest") != sqsh.digest:
        problems.append(f"digest {sqsh.digest} but the manifest says {artifact.get('digest')}")
    if manifest is not None and artifact.get("size") != sqsh.size:
        problems.append(f"size {sqsh.size} but the manifest says {artifact.get('size')}")
    if problems:
        return Check(name, FAIL, "the .sqsh was altered or damaged: " + "; ".join(problems))
    return Check(name, PASS, f"{sqsh.size} bytes, {sqsh.digest[:19]}… as recorded")


def _manifest_checks(record: RecordLike, data: bytes | None) -> tuple[dict[str, Any] | None, list[Check]]:
    name = "manifest-integrity"
    if data is None:
        return None, [Check(name, FAIL, "no manifest stored with this artifact")]
    actual = manifests.digest(data)
    if record.manifest_digest is None:
        problem = "the record names no manifest digest, so the manifest cannot be trusted"
        return None, [Check(name, FAIL, problem)]
    if actual != record.manifest_digest:
        return None, [Check(name, FAIL, f"the manifest was edited: digest {actual[:19]}… but the record says "
                                        f"{record.manifest_digest[:19]}…")]
    try:
        manifest = manifests.decode(data)
    except Exception as exc:  # an EfabuildError naming the problem
        return None, [Check(name, FAIL, str(exc))]
    if manifest.get("key") != record.key:
        return None, [Check(name, FAIL, f"the manifest is for key {str(manifest.get('key'))[:12]}, not this artifact")]
    return manifest, [Check(name, PASS, "matches the recorded digest")]


# ---- manifest against the image --------------------------------------------------------------
def manifest_vs_image(stored: Measured, image: Measured) -> Check:
    differences = []
    recorded = {c.name for c in stored.components}
    for name in COMPONENTS:
        if name not in recorded:
            continue  # a component probed since the manifest was made (cublas, triton): not recorded then
        a, b = stored.component(name), image.component(name)
        for field in ("version", "commit", "loads"):
            if getattr(a, field) != getattr(b, field):
                differences.append(f"{name} {field}: manifest {getattr(a, field)}, image {getattr(b, field)}")
        if _copies(a) != _copies(b):
            differences.append(f"{name} copies: manifest {_show_copies(a)}, image {_show_copies(b)}")
    a_mpi = sorted((m.real_path, m.version) for m in stored.openmpi)
    b_mpi = sorted((m.real_path, m.version) for m in image.openmpi)
    if a_mpi != b_mpi:
        differences.append(f"Open MPI: manifest {a_mpi}, image {b_mpi}")
    if stored.elf and stored.elf != image.elf:  # manifests made before the machine was read lack it
        changed = sorted({p for p, _ in set(stored.elf) ^ set(image.elf)})
        differences.append(f"machine of {', '.join(changed[:4])}{' ...' if len(changed) > 4 else ''}: "
                           "manifest and image differ")
    if image.env_source is not None and stored.env_dict != image.env_dict:
        changed = sorted(set(stored.env_dict.items()) ^ set(image.env_dict.items()))
        names = sorted({k for k, _ in changed})
        differences.append(f"env {', '.join(names)}: manifest and {image.env_source} differ")
    if differences:
        return Check("manifest-vs-image", FAIL, "the manifest does not describe this image: " + "; ".join(differences))
    return Check("manifest-vs-image", PASS, "measured versions match the image")


def _copies(component: Component) -> list[tuple[str, str | None]]:
    return sorted((c.path, c.version) for c in component.copies)


def _show_copies(component: Component) -> str:
    return ", ".join(f"{v} at {p}" for p, v in _copies(component)) or "none"
