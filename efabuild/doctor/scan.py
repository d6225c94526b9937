"""Recognise the lines of NCCL (`NCCL_DEBUG=INFO`), aws-ofi-nccl, libfabric, Open MPI, apt,
nccl-tests and srun output that tell how a job or build went.

Pure: lines in, observations out. The formats mirror real output of NCCL 2.4-2.2x, aws-ofi-nccl
1.6 (`NET/OFI Using aws-ofi-nccl 1.6.0`), 1.7-1.13 (`Selected Provider is efa (found 4 nics)`,
network `AWS Libfabric`) and 1.14+ (`Initializing aws-ofi-nccl 1.19.0`, `Selected provider is efa,
fabric is efa-direct (found 8 nics)`, network `Libfabric`). Prefixes such as `host:pid:tid [0] NCCL
INFO`, srun's `0: ` labels, mpirun's `[1,0]<stdout>:` and timestamps are ignored by searching.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import attrs


@attrs.frozen
class LogLine:
    file: str  # as given on the command line; "-" for stdin
    number: int  # 1-based
    text: str


@attrs.frozen
class Observation:
    kind: str
    line: LogLine
    value: str | None = None
    extra: str | None = None


# (kind, pattern, group for value, group for extra). First match per kind and line wins; a line
# may give several kinds (e.g. a provider line gives the nic count too).
_PATTERNS: tuple[tuple[str, re.Pattern[str], int | None, int | None], ...] = tuple(
    (kind, re.compile(pattern), value, extra) for kind, pattern, value, extra in (
        # versions
        ("nccl-version", r"NCCL version (\d+\.\d+\.\d+)", 1, None),
        ("ofi-version", r"NET/OFI (?:Initializing|Using) aws-ofi-nccl (\d+\.\d+\.\d+[\w.-]*)", 1, None),
        ("libfabric-version", r"NET/OFI Using Libfabric version (\d+\.\d+)", 1, None),
        ("libfabric-version", r"^\s*libfabric: (\d+\.\d+\.\d+)\s*$", 1, None),  # fi_info --version
        # the network NCCL uses
        ("provider", r"NET/OFI Selected [Pp]rovider is (\S+?),? (?:fabric is (\S+) )?\(found (\d+) nics\)", 1, 2),
        ("network", r"Using network (AWS Libfabric|Libfabric|Socket|IB)\b", 1, None),
        ("network", r"Using internal Network (Socket|IB)\b", 1, None),
        ("network", r"via NET/(AWS Libfabric|Libfabric|Socket|IB)/\d", 1, None),
        ("socket-transport", r"NET/Socket ?: Using \[?\d*\]?(\S+)", 1, None),
        ("bootstrap", r"Bootstrap ?: Using \[?\d*\]?(\S+)", 1, None),
        # plugin loading
        ("plugin-missing", r"NET/Plugin ?: ?Plugin load (?:\(([^)]*)\) )?returned \d+ ?: ?(.*)", 1, 2),
        ("plugin-missing", r"NET/Plugin ?: ?dlerror=(.*?)(?: No plugin found.*)?$", 1, None),
        ("plugin-missing", r"NET/Plugin ?: ?No plugin found \(?([^),]*)\)?", 1, None),
        ("plugin-missing", r"NET/Plugin: Could not find:\s*(.*?)\.?\s*$", 1, None),
        ("plugin-missing", r"NET/Plugin: (\S+\.so): (.*)$", 1, 2),
        ("plugin-internal", r"NET/Plugin ?: ?(?:Using internal network plugin|No plugin found, using internal)", None,
         None),
        ("plugin-unsupported", r"External network plugin (\S+) is unsupported", 1, None),
        ("plugin-init-failed", r"Failed to initialize NET plugin (\S+)", 1, None),
        ("plugin-init-failed", r"Failed to initialize any NET plugin", None, None),
        ("plugin-init-failed", r"NET/OFI (?:aws-ofi-nccl initialization failed|Unable to find a protocol that "
                               r"worked)", None, None),
        ("plugin-loaded", r"(?:Successfully loaded external network plugin|NET/Plugin: Loaded net plugin) (\S+)", 1,
         None),
        ("tuner-missing", r"TUNER/Plugin: Could not find:\s*(.*?)\.?\s*$", 1, None),
        ("profiler-missing", r"PROFILER/Plugin: Could not find:\s*(.*?)\.?\s*$", 1, None),
        ("harmless-collnet", r"NET/Plugin ?: ?Failed to find ncclCollNetPlugin\S* symbol", None, None),
        # EFA device visibility and libfabric
        ("no-device", r"NET/OFI OFI fi_getinfo\(\) call failed: (No data available|.*)", 1, None),
        ("no-device", r"fi_getinfo: provider efa output empty list", None, None),
        ("no-device", r"NET/OFI Couldn't find any optimal provider", None, None),
        ("no-device", r"NET/OFI No eligible providers", None, None),
        ("libfabric-too-old", r"EFA provider requires at least libfabric version (\S+?)\.?$", 1, None),
        # environment NCCL reports
        ("env", r"(NCCL_[A-Z0-9_]+) set by environment to (.*?)\.?\s*$", 1, 2),
        # two Open MPIs
        ("mpi-clash", r"opal_shmem_base_select failed", None, None),
        ("mpi-clash", r"MPI_INIT (?:has )?failed", None, None),
        ("mpi-clash", r"An error occurred in MPI_Init\b", None, None),
        ("mpi-clash", r"unable to open mca_\w+: .*(?:undefined symbol|compiled for a different version)", None,
         None),
        # EFA installer build failures
        ("apt-lists-empty", r"E: Unable to locate package (environment-modules|\S+)", 1, None),
        ("apt-lists-empty", r"failed to install third-party dependencies", None, None),
        # host vs container CUDA
        ("cuda-forward-compat", r"CUDA Forward Compatibility mode ENABLED", None, None),
        # bandwidth: nccl-tests rows (size count type redop root time algbw busbw #wrong ...) and summaries
        ("busbw-row", r"^(?:\S*:\s*)?\s*(\d+)\s+\d+\s+\w+\s+\w+\s+-?\d+\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s+\S+"
                      r"(?:\s+[\d.]+\s+[\d.]+\s+([\d.]+))?", 2, 3),
        ("busbw-avg", r"# Avg bus bandwidth\s*:\s*([\d.]+)", 1, None),
        ("busbw", r"(?i)\bbus ?(?:bw|bandwidth)\b[^0-9\n]{0,20}?([\d.]+)\s*GB/s", 1, None),
    )
)

# A cheap pre-filter: a line without any of these cannot match (most of a big log is skipped).
_KEYWORDS = re.compile(
    r"NCCL|NET/|libfabric|fi_getinfo|MPI|opal|mca_|Unable to locate|third-party|Forward Compat|bus|"
    r"^\S*:?\s*\d+\s+\d+\s", re.IGNORECASE)


def scan_lines(file: str, lines: Iterable[str]) -> Iterator[Observation]:
    for number, raw in enumerate(lines, 1):
        text = raw.rstrip("\r\n")
        if not _KEYWORDS.search(text):
            continue
        line = LogLine(file=file, number=number, text=text.strip())
        seen: set[str] = set()
        for kind, pattern, value_group, extra_group in _PATTERNS:
            if kind in seen:
                continue
            match = pattern.search(text)
            if not match:
                continue
            seen.add(kind)
            value = match.group(value_group) if value_group else None
            extra = match.group(extra_group) if extra_group else None
            yield Observation(kind=kind, line=line, value=value, extra=extra)
            if kind == "provider":
                yield Observation(kind="nics", line=line, value=match.group(3))
