"""Audit checks of one artifact: pure functions over facts gathered elsewhere.

Inputs: the store's record, the stored manifest bytes, the stored .sqsh's size and digest as just
computed, the versions measured again from that .sqsh, the policy from BUILD.toml and the host's
facts. Output: one `Check` per rule. A FAIL makes `efabuild audit` exit 1; WARN informs; SKIP says
a rule could not be applied (and why).

| check              | fails when                                                                        |
|--------------------|-----------------------------------------------------------------------------------|
| sqsh-integrity     | the stored .sqsh's size or blake3 differs from its record or manifest              |
| manifest-integrity | no manifest, its blake3 differs from the record's manifest_digest, other key       |
| manifest-vs-image  | the manifest's measured versions differ from the .sqsh measured again              |
| declared-vs-image  | a build arg (EFA_INSTALLER_VERSION, HYBRID_EP_COMMIT...) differs from the image    |
| library-shadowing  | aws-ofi-nccl / libfabric / NCCL at two versions and the older one loads first      |
| host-efa           | the image's EFA installer differs from the host AMI's                              |
| environment        | the .sqsh has no /etc/environment: the container would start without the image ENV |
| net-plugin         | NCCL_NET_PLUGIN is not ofi (NCCL would load the InfiniBand libnccl-net.so)         |
| ld-library-path    | LD_LIBRARY_PATH is not led by /opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib         |
| openmpi            | more than one Open MPI installation                                                |
| infiniband-env     | InfiniBand NCCL_* settings (NCCL_IB_*, NCCL_NET=IB...)                             |
| ofi-plugin         | no aws-ofi-nccl plugin on the loader's path                                         |
| policy-min:NAME    | a component below its minimum version (or unknown)                                 |
| policy-pin:PIN     | a required pin missing (base-digest, deepep-commit, efa-installer, arg:NAME)        |
| policy-known-bad   | a known-bad combination of versions                                                |
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any, Protocol

import attrs

from efabuild.model import COMPONENTS, KNOWN_PINS, AuditPolicy
from efabuild.nccl import forces_other_network, is_infiniband_setting, is_ofi_plugin
from efabuild.provenance import manifest as manifests
from efabuild.provenance import versions
from efabuild.provenance.measured import Component, Measured

PASS, FAIL, WARN, SKIP = "ok", "FAIL", "warn", "skip"
EFA_LD_PREFIX = ("/opt/amazon/ofi-nccl/lib", "/opt/amazon/efa/lib")

# Build args that declare what a layer installs: arg -> (component, field)
DECLARING_ARGS = {
    "EFA_INSTALLER_VERSION": ("efa-installer", "version"),
    "AWS_OFI_NCCL_VERSION": ("aws-ofi-nccl", "version"),
    "LIBFABRIC_VERSION": ("libfabric", "version"),
    "NCCL_VERSION": ("nccl", "version"),
    "DEEPEP_COMMIT": ("deepep", "commit"),
    "DEEP_EP_COMMIT": ("deepep", "commit"),
    "HYBRID_EP_COMMIT": ("deepep", "commit"),
}
# Base image env vars and labels that declare versions -> component
DECLARING_BASE = {
    "NCCL_VERSION": "nccl",
    "CUDA_VERSION": "cuda",
    "CUDNN_VERSION": "cudnn",
    "PYTORCH_VERSION": "pytorch",
    "com.nvidia.nccl.version": "nccl",
    "com.nvidia.cudnn.version": "cudnn",
    "com.nvidia.cuda.version": "cuda",
    "com.nvidia.pytorch.version": "pytorch",
}
SHADOWABLE = ("aws-ofi-nccl", "libfabric", "nccl")
# An older NCCL first on the loader's path only warns: PyTorch may load its own copy by RUNPATH.
SHADOWING_FAILS = ("aws-ofi-nccl", "libfabric")


@attrs.frozen
class Check:
    name: str
    status: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"check": self.name, "status": self.status, "message": self.message}


@attrs.frozen
class FileFacts:
    """The stored .sqsh as found now."""

    size: int
    digest: str  # blake3:<hex>


@attrs.frozen
class HostFacts:
    efa_installer: str | None = None
    source: str | None = None  # "--host-efa", a file path, or "BUILD.toml [audit]"


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
    checks += policy_checks(policy, image, manifest or {}, args)
    return checks


def failed(checks: list[Check]) -> bool:
    return any(c.status == FAIL for c in checks)


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
    for name in COMPONENTS:
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


# ---- declared against measured ---------------------------------------------------------------
def declared_vs_image(args: Mapping[str, tuple[str, str]], image: Measured) -> list[Check]:
    checks = []
    for arg, (component_name, field) in DECLARING_ARGS.items():
        if arg not in args:
            continue
        value, layer = args[arg]
        component = image.component(component_name)
        name = f"declared:{arg}"
        if field == "commit":
            actual = component.commit
            short = _short_commit(component)
            if actual is None and short is None:
                checks.append(Check(name, FAIL, f"{arg}={value} declared in {layer}, but no {component_name} "
                                                f"commit is recorded in the image"))
            elif _commit_matches(value, actual or short):
                checks.append(Check(name, PASS, f"{component_name} at commit {(actual or short)[:12]}"))
            else:
                where = component.commit_source or component.source
                checks.append(Check(name, FAIL, f"{arg}={value[:12]} declared in {layer}, but {component_name} "
                                                f"was built from {(actual or short)[:12]} ({where})"))
            continue
        actual = component.version
        if actual is None:
            checks.append(Check(name, FAIL, f"{arg}={value} declared in {layer}, but no {component_name} "
                                            f"found in the image"))
        elif versions.same_release(value, actual):
            checks.append(Check(name, PASS, f"{component_name} {actual} as declared"))
        else:
            checks.append(Check(name, FAIL, f"{arg}={value} declared in {layer}, but {component_name} {actual} "
                                            f"is installed ({component.source})"))
    for declared in image.declared_by_base:
        component_name = DECLARING_BASE.get(declared.name)
        if component_name is None:
            continue
        actual = image.component(component_name).version
        if actual is not None and versions.consistent(declared.value, actual) is False:
            checks.append(Check(f"base-declared:{declared.name}", WARN,
                                f"{declared.source}={declared.value}, but {component_name} {actual} is installed "
                                f"(a later layer changed it; the base's declaration is stale)"))
    return checks


def _short_commit(component: Component) -> str | None:
    # DeepEP's setup.py appends "+<git rev-parse --short HEAD>" to its version
    if component.version and "+" in component.version:
        label = component.version.split("+", 1)[1]
        if len(label) >= 7 and all(c in "0123456789abcdef" for c in label):
            return label
    return None


def _commit_matches(declared: str, actual: str) -> bool:
    shorter = min(len(declared), len(actual))
    return shorter >= 7 and declared[:shorter].lower() == actual[:shorter].lower()


# ---- shadowed libraries ----------------------------------------------------------------------
def shadowing(image: Measured) -> list[Check]:
    """Copies of one library the loader can reach by name: the first found loads, the rest never do."""
    checks = []
    for name in SHADOWABLE:
        component = image.component(name)
        hits = list(component.on_path)
        known = [h for h in hits if h.version is not None]
        if not hits or len({h.version for h in known}) < 2:
            continue
        first = hits[0]
        newest = max(known, key=lambda h: versions.numeric(h.version) or ())
        others = ", ".join(f"{h.version or 'unknown'} at {h.path}" for h in hits)
        check = f"library-shadowing:{name}"
        if first.version is not None and versions.compare(first.version, newest.version) == -1:
            where = _search_source(image, first.path)
            checks.append(Check(check, FAIL if name in SHADOWING_FAILS else WARN,
                                f"{name} {first.version} at {first.path} loads first ({where}); the newer "
                                f"{newest.version} at {newest.path} is shadowed"))
        else:
            checks.append(Check(check, WARN, f"{name} reachable at several versions ({others}); "
                                             f"{first.version or 'an unknown version'} loads first"))
    return checks


def _search_source(image: Measured, path: str) -> str:
    parent = posixpath.dirname(path)
    for libdir in image.library_path:
        if libdir.dir == parent:
            return f"{parent} from {libdir.source}"
    return parent


# ---- host ------------------------------------------------------------------------------------
def host_efa(image: Measured, host: HostFacts) -> Check:
    if host.efa_installer is None:
        return Check("host-efa", SKIP, "host EFA installer version unknown (give --host-efa or "
                                       "[audit] host_efa_installer)")
    mine = image.component("efa-installer").version
    if mine is None:
        return Check("host-efa", FAIL, f"the image has no EFA installer (it uses the base's EFA stack); the host has "
                                       f"{host.efa_installer} ({host.source})")
    if versions.same_release(mine, host.efa_installer):
        return Check("host-efa", PASS, f"EFA installer {mine} on image and host ({host.source})")
    return Check("host-efa", FAIL, f"image has EFA installer {mine}, host has {host.efa_installer} ({host.source})")


# ---- known NGC + EFA pitfalls -------------------------------------------------------------------
def pitfalls(image: Measured) -> list[Check]:
    checks = []
    env = image.env_dict
    if image.env_source is None:
        checks.append(Check("environment", FAIL, "the image has no /etc/environment: Enroot/Pyxis would start it "
                                                 "without its ENV (NCCL_NET_PLUGIN, LD_LIBRARY_PATH)"))
        checks.append(Check("net-plugin", SKIP, "image environment unknown"))
        checks.append(Check("ld-library-path", SKIP, "image environment unknown"))
    else:
        checks.append(_net_plugin(env))
        checks.append(_ld_library_path(env, image))
    checks.append(_openmpi(image))
    checks.append(_infiniband_env(env))
    checks.append(_ofi_plugin(image))
    return checks


def _net_plugin(env: Mapping[str, str]) -> Check:
    value = env.get("NCCL_NET_PLUGIN")
    if is_ofi_plugin(value):
        return Check("net-plugin", PASS, f"NCCL_NET_PLUGIN={value}")
    shown = "not set" if value is None else f"is {value!r}"
    return Check("net-plugin", FAIL, f"NCCL_NET_PLUGIN {shown}: NCCL loads the default libnccl-net.so "
                                     f"(the InfiniBand plugin) instead of aws-ofi-nccl; keep NCCL_NET_PLUGIN=ofi")


def _ld_library_path(env: Mapping[str, str], image: Measured) -> Check:
    if image.component("efa-installer").version is None:
        return Check("ld-library-path", SKIP, "no EFA installer in the image: the base's ld.so.conf entries apply")
    value = env.get("LD_LIBRARY_PATH", "")
    lead = [p.rstrip("/") for p in value.split(":")][:2]
    if tuple(lead) == EFA_LD_PREFIX:
        return Check("ld-library-path", PASS, f"led by {':'.join(EFA_LD_PREFIX)}")
    return Check("ld-library-path", FAIL, f"LD_LIBRARY_PATH={value or '(unset)'} is not led by "
                                          f"{':'.join(EFA_LD_PREFIX)}: the base's older EFA libraries may win")


def _openmpi(image: Measured) -> Check:
    """Two Open MPIs break MPI programs only when both are used: the EFA installer leaves its own
    under /opt/amazon/openmpi*, harmless until the loader path or OPAL_PREFIX leads into it."""
    def describe(m) -> str:
        return m.path + (f" -> {m.real_path}" if m.real_path != m.path else "") + f" ({m.version or 'version unknown'})"

    env = dict(image.env)
    used_dirs = [d.dir for d in image.library_path] + [env.get("OPAL_PREFIX", "")]

    def in_use(m) -> bool:
        if m.path == "/usr/local/mpi":  # the NGC image's own
            return True
        roots = {m.path.rstrip("/"), m.real_path.rstrip("/")}
        return any(d and any(d == r or d.startswith(r + "/") for r in roots) for d in used_dirs)

    found = list(image.openmpi)
    used = [m for m in found if in_use(m)]
    if len({m.real_path for m in used}) > 1:
        return Check("openmpi", FAIL, f"{len(used)} Open MPI installations in use: {'; '.join(map(describe, used))}; "
                                      f"programs mixing them fail with opal_shmem_base_select/MPI_INIT errors")
    idle = [m for m in found if m not in used]
    if idle and used:
        return Check("openmpi", WARN, f"{describe(used[0])} in use; also present, on no loader path or OPAL_PREFIX: "
                                      f"{'; '.join(map(describe, idle))} (keep them off PATH too)")
    return Check("openmpi", PASS, "; ".join(map(describe, found)) if found else "no Open MPI found")


def _infiniband_env(env: Mapping[str, str]) -> Check:
    bad = []
    for name, value in sorted(env.items()):
        if is_infiniband_setting(name, value) or forces_other_network(name, value):
            bad.append(f"{name}={value}")
    if bad:
        return Check("infiniband-env", FAIL, f"InfiniBand/non-EFA NCCL settings push NCCL off EFA: {', '.join(bad)}")
    return Check("infiniband-env", PASS, "no InfiniBand NCCL_* settings")


def _ofi_plugin(image: Measured) -> Check:
    component = image.component("aws-ofi-nccl")
    if component.loads is not None:
        version = component.version or "(version unknown)"
        return Check("ofi-plugin", PASS, f"aws-ofi-nccl {version} at {component.loads}")
    if component.copies:
        where = ", ".join(c.path for c in component.copies)
        return Check("ofi-plugin", FAIL, f"aws-ofi-nccl is installed ({where}) but NCCL would not load it: not on "
                                         f"the library path or NCCL_NET_PLUGIN names another plugin")
    return Check("ofi-plugin", FAIL, "no aws-ofi-nccl plugin (libnccl-net-ofi.so) in the image")


# ---- policy ----------------------------------------------------------------------------------
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
        found = {m.version for m in image.openmpi if m.version}
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
