"""NCCL settings that keep a job on EFA, shared by lint (Dockerfiles, job scripts), doctor (logs)
and audit (images), so the three never disagree."""

from __future__ import annotations

import posixpath

OFI_PLUGIN_FILE = "libnccl-net-ofi.so"


def is_ofi_plugin(value: str | None) -> bool:
    """NCCL_NET_PLUGIN selects aws-ofi-nccl: `ofi`, or a path to the plugin library itself."""
    return bool(value) and (value == "ofi" or posixpath.basename(value) == OFI_PLUGIN_FILE)
