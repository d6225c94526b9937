"""The guide's pitfalls, read from the measured image: an older library loading first, an EFA
installer other than the host's, NCCL pushed off EFA, a second Open MPI in use, no ofi plugin."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping

from efabuild.nccl import efa_lead, forces_other_network, is_infiniband_setting, is_ofi_plugin
from efabuild.provenance import elf, versions
from efabuild.provenance.checks import FAIL, PASS, SKIP, WARN, Check, HostFacts
from efabuild.provenance.measured import Measured, MpiInstall

EFA_LD_PREFIX = ("/opt/amazon/ofi-nccl/lib", "/opt/amazon/efa/lib")
SHADOWABLE = ("aws-ofi-nccl", "libfabric", "nccl")
# An older NCCL first on the loader's path only warns: PyTorch may load its own copy by RUNPATH.
SHADOWING_FAILS = ("aws-ofi-nccl", "libfabric")


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
    lead = efa_lead(value, elf.triplet(image.machine))
    if lead is not None:
        return Check("ld-library-path", PASS, f"led by {lead}")
    return Check("ld-library-path", FAIL, f"LD_LIBRARY_PATH={value or '(unset)'} is not led by "
                                          f"{':'.join(EFA_LD_PREFIX)}: the base's older EFA libraries may win")


def openmpi_in_use(image: Measured) -> list[MpiInstall]:
    """The Open MPI installations a program of the image uses: NGC's own (/usr/local/mpi), and any
    the loader's path (Debian's libmpi.so.40 in the triplet directory, on its default path) or
    OPAL_PREFIX leads into. The EFA installer's under /opt/amazon/openmpi* is used by neither."""
    env = dict(image.env)
    used_dirs = [d.dir for d in image.library_path] + [env.get("OPAL_PREFIX", "")]

    def in_use(m: MpiInstall) -> bool:
        if m.path == "/usr/local/mpi":  # the NGC image's own
            return True
        roots = {m.path.rstrip("/"), m.real_path.rstrip("/")}
        return any(d and any(d == r or d.startswith(r + "/") for r in roots) for d in used_dirs)

    return [m for m in image.openmpi if in_use(m)]


def _openmpi(image: Measured) -> Check:
    """Two Open MPIs break MPI programs only when both are used: the EFA installer leaves its own
    under /opt/amazon/openmpi*, harmless until the loader path or OPAL_PREFIX leads into it."""
    def describe(m) -> str:
        return m.path + (f" -> {m.real_path}" if m.real_path != m.path else "") + f" ({m.version or 'version unknown'})"

    found = list(image.openmpi)
    used = openmpi_in_use(image)
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
