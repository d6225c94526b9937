"""NCCL settings that keep a job on EFA, shared by lint (Dockerfiles, job scripts), doctor (logs)
and audit (images), so the three never disagree."""

from __future__ import annotations

import posixpath

OFI_PLUGIN_FILE = "libnccl-net-ofi.so"
OFI_LIB_DIR, EFA_LIB_DIR = "/opt/amazon/ofi-nccl/lib", "/opt/amazon/efa/lib"
# newer EFA installers put aws-ofi-nccl in a directory per triplet (provenance.elf.TRIPLETS)
TRIPLETS = ("x86_64-linux-gnu", "aarch64-linux-gnu")
OFI_LIB_DIRS = (OFI_LIB_DIR, *(f"{OFI_LIB_DIR}/{t}" for t in TRIPLETS))


def is_ofi_plugin(value: str | None) -> bool:
    """NCCL_NET_PLUGIN selects aws-ofi-nccl: `ofi`, or a path to the plugin library itself."""
    return bool(value) and (value == "ofi" or posixpath.basename(value) == OFI_PLUGIN_FILE)


EFA_NET_NAMES = frozenset({"libfabric", "aws libfabric", "ofi"})
INFINIBAND_PREFIXES = ("NCCL_IB_", "NCCL_IBEXT_", "NCCL_SHARP", "NCCL_UCX")


def forces_other_network(name: str, value: str) -> bool:
    """NCCL_NET naming a network other than EFA's Libfabric."""
    return name == "NCCL_NET" and value.strip().lower() not in EFA_NET_NAMES


def is_infiniband_setting(name: str, value: str) -> bool:
    """An InfiniBand/SHARP/UCX/CollNet leftover; disabling the IB transport is harmless on EFA."""
    if name in ("NCCL_IB_DISABLE", "NCCL_IBEXT_DISABLE") and value.strip() == "1":
        return False
    return name.startswith(INFINIBAND_PREFIXES) or (name == "NCCL_COLLNET_ENABLE" and value.strip() not in ("", "0"))


def efa_lead(ld_library_path: str | None, triplet: str | None) -> str | None:
    """The leading LD_LIBRARY_PATH entries that put the installed aws-ofi-nccl and libfabric before
    the base image's (the guide's `/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib`, or the plugin's
    per-triplet directories before /opt/amazon/efa/lib), or None. One plugin directory must be the
    plain one or `triplet`'s (any triplet's when None): an arm64 loader skips the x86_64 one."""
    entries = [entry.rstrip("/") for entry in (ld_library_path or "").split(":")]
    if EFA_LIB_DIR not in entries:
        return None
    lead = entries[:entries.index(EFA_LIB_DIR)]
    own = [triplet] if triplet else list(TRIPLETS)
    usable = {OFI_LIB_DIR, *(f"{OFI_LIB_DIR}/{t}" for t in own)}
    if lead and all(d in OFI_LIB_DIRS for d in lead) and any(d in usable for d in lead):
        return ":".join([*lead, EFA_LIB_DIR])
    return None
