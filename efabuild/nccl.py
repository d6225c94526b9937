"""NCCL settings that keep a job on EFA, shared by lint (Dockerfiles, job scripts), doctor (logs)
and audit (images), so the three never disagree."""

from __future__ import annotations

import posixpath

OFI_PLUGIN_FILE = "libnccl-net-ofi.so"


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
