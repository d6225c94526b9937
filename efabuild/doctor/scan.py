"""Recognise the lines of NCCL (`NCCL_DEBUG=INFO`), aws-ofi-nccl, libfabric, Open MPI, apt,
nccl-tests, srun, Pyxis and Enroot output that tell how a job or build went.

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


# `X/Plugin: Could not find: libnccl-net-ofi.so. Using internal network plugin.`: the value is the
# file name alone; the sentence after it is NCCL's, not part of the name.
_COULD_NOT_FIND = r"{}/Plugin: Could not find:\s*(\S+?)\.?(?:\s|$)"

# (kind, text the line must contain, pattern, group for value, group for extra). The literal text
# lets most lines skip most patterns. First match per kind and line wins; a line may give several
# kinds (a provider line gives the nic count too).
# A value that runs to the end of its line ends at its last non-space character, matched greedily
# (`(.*\S)`): a lazy group before `\s*$` retries that tail at every character, hours for one line
# of a million spaces.
_PATTERNS: tuple[tuple[str, str, re.Pattern[str], int | None, int | None], ...] = tuple(
    (kind, needle, re.compile(pattern), value, extra) for kind, needle, pattern, value, extra in (
        # versions
        ("nccl-version", "NCCL version", r"NCCL version (\d+\.\d+\.\d+)", 1, None),
        ("ofi-version", "aws-ofi-nccl ", r"NET/OFI (?:Initializing|Using) aws-ofi-nccl (\d+\.\d+\.\d+[\w.-]*)", 1,
         None),
        ("libfabric-version", "Libfabric version", r"NET/OFI Using Libfabric version (\d+\.\d+)", 1, None),
        ("libfabric-version", "libfabric: ", r"^\s*libfabric: (\d+\.\d+\.\d+)\S*\s*$", 1, None),  # fi_info --version
        # the network NCCL uses
        ("provider", " nics)", r"NET/OFI Selected [Pp]rovider is (\S+?),? (?:fabric is (\S+) )?\(found (\d+) nics\)",
         1, 2),
        ("network", "Using network ", r"Using network (AWS Libfabric|Libfabric|Socket|IB)\b", 1, None),
        ("network", "Using internal Network", r"Using internal Network (Socket|IB)\b", 1, None),
        ("network", "via NET/", r"via NET/(AWS Libfabric|Libfabric|Socket|IB)/\d", 1, None),
        ("socket-transport", "NET/Socket", r"NET/Socket ?: Using \[?\d*\]?(\S+)", 1, None),
        ("bootstrap", "Bootstrap", r"Bootstrap ?: Using \[?\d*\]?(\S+)", 1, None),
        # plugin loading
        ("plugin-missing", "NET/Plugin", r"NET/Plugin ?: ?Plugin load (?:\(([^)]*)\) )?returned \d+ ?: ?(.*)", 1, 2),
        ("plugin-missing", "NET/Plugin", r"NET/Plugin ?: ?dlerror=([^:\s]+)(?::\s*(.*?))?(?: No plugin found.*)?$", 1, 2),
        ("plugin-missing", "NET/Plugin", r"NET/Plugin ?: ?No plugin found \(?([^),]*)\)?", 1, None),
        ("plugin-missing", "NET/Plugin", _COULD_NOT_FIND.format("NET"), 1, None),
        ("plugin-missing", "NET/Plugin", r"NET/Plugin: (\S+\.so): (.*)$", 1, 2),
        ("plugin-internal", "NET/Plugin",
         r"NET/Plugin ?: ?(?:Using internal network plugin|No plugin found, using internal)", None, None),
        ("plugin-unsupported", "External network plugin", r"External network plugin (\S+) is unsupported", 1, None),
        ("plugin-init-failed", "Failed to initialize", r"Failed to initialize NET plugin (\S+)", 1, None),
        ("plugin-init-failed", "Failed to initialize", r"Failed to initialize any NET plugin", None, None),
        ("plugin-init-failed", "NET/OFI", r"NET/OFI (?:aws-ofi-nccl initialization failed|Unable to find a protocol "
                                          r"that worked)", None, None),
        ("plugin-loaded", "plugin", r"(?:Successfully loaded external network plugin|NET/Plugin: Loaded net plugin) "
                                    r"(\S+)", 1, None),
        ("tuner-missing", "TUNER/Plugin", _COULD_NOT_FIND.format("TUNER"), 1, None),
        ("optional-plugin-missing", "/Plugin: Could not find",
         _COULD_NOT_FIND.format("(PROFILER|GIN|ENV)"), 1, 2),
        ("harmless-collnet", "ncclCollNetPlugin", r"NET/Plugin ?: ?Failed to find ncclCollNetPlugin\S* symbol", None,
         None),
        # EFA device visibility and libfabric
        ("no-device", "fi_getinfo", r"NET/OFI OFI fi_getinfo\(\) call failed: (No data available|.*)", 1, None),
        ("no-device", "fi_getinfo", r"fi_getinfo: provider efa output empty list", None, None),
        ("no-device", "NET/OFI", r"NET/OFI Couldn't find any optimal provider", None, None),
        ("no-device", "NET/OFI", r"NET/OFI No eligible providers", None, None),
        ("libfabric-too-old", "requires at least libfabric",
         r"EFA provider requires at least libfabric version (\S+?)\.?$", 1, None),
        # environment NCCL reports
        ("env", "set by environment", r"(NCCL_[A-Z0-9_]+) set by environment to ((?:.*[^\s.])?)", 1, 2),
        # two Open MPIs
        ("mpi-clash", "opal_shmem", r"opal_shmem_base_select failed", None, None),
        ("mpi-clash", "MPI_INIT", r"MPI_INIT (?:has )?failed", None, None),
        ("mpi-clash", "MPI_Init", r"An error occurred in MPI_Init\b", None, None),
        ("mpi-clash", "mca_", r"unable to open mca_\w+: .*(?:undefined symbol|compiled for a different version)",
         None, None),
        # EFA installer build failures
        ("apt-lists-empty", "Unable to locate package", r"E: Unable to locate package (environment-modules|\S+)", 1,
         None),
        ("apt-lists-empty", "third-party dependencies", r"failed to install third-party dependencies", None, None),
        # container start (Pyxis and Enroot): mounting the .sqsh with squashfuse, or unpacking it.
        # Enroot passes squashfuse's stderr on as [WARN] lines before its own [ERROR]; Pyxis prefixes
        # each line of Enroot's log it prints with "pyxis:" and spaces.
        ("fuse-open-failed", "fuse: ", r"fuse: failed to open /dev/fuse: (.*\S)", 1, None),
        ("fuse-open-failed", "fuse: ", r"fuse: (device not found), try 'modprobe fuse' first", 1, None),
        ("squashfs-mount-failed", "Failed to mount: ", r"\[ERROR\] Failed to mount: (\S+)", 1, None),
        ("squashfs-tool-missing", "Command not found: ",
         r"\[ERROR\] Command not found: (squashfuse|fuse-overlayfs|mountpoint|unsquashfs)\b", 1, None),
        ("invalid-image", "Invalid image format: ", r"\[ERROR\] Invalid image format: (\S+)", 1, None),
        ("unpack-failed", "failed to create container filesystem", r"pyxis: failed to create container filesystem",
         None, None),
        ("import-failed", "failed to import docker image", r"pyxis: failed to import docker image", None, None),
        # what efabuild's importer said (one line, on stderr, which Pyxis prints with Enroot's log)
        ("importer-said", "efabuild: ", r"efabuild: ((?:refusing |no artifact |\S+ tier: )(?:.*\S)?)", 1, None),
        ("unpacked", "creating container filesystem", r"pyxis: creating container filesystem", None, None),
        # a named container started again (Pyxis keeps it after the job: container_scope=global)
        ("container-reused", "reusing existing container", r"pyxis: reusing existing container (filesystem|namespaces)",
         1, None),
        # an srun that names its container (`set -x` in the job script, or a user's paste)
        ("named-start", "--container-name", r"\bsrun\b(.*--container-name.*)$", 1, None),
        ("unpacked", "Extracting squashfs filesystem", r"\[INFO\] Extracting squashfs filesystem", None, None),
        ("no-space", "No space left on device", r"No space left on device", None, None),
        # host vs container CUDA
        ("cuda-forward-compat", "Forward Compatibility", r"CUDA Forward Compatibility mode ENABLED", None, None),
        # bandwidth: nccl-tests rows (size count type redop root time algbw busbw #wrong ...) and summaries
        ("busbw-row", "", r"^(?:\S*:\s*)?\s*(\d+)\s+\d+\s+\w+\s+\w+\s+-?\d+\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s+\S+"
                          r"(?:\s+[\d.]+\s+[\d.]+\s+([\d.]+))?", 2, 3),
        ("busbw-avg", "Avg bus bandwidth", r"# Avg bus bandwidth\s*:\s*([\d.]+)", 1, None),
        ("busbw", "GB/s", r"(?i)\bbus ?(?:bw|bandwidth)\b[^0-9\n]{0,20}?([\d.]+)\s*GB/s", 1, None),
    )
)

# Patterns grouped by their literal text, and one search for any of those texts: most lines of a
# big log (training output) are skipped after that single search.
_BY_NEEDLE: dict[str, list[tuple[str, re.Pattern[str], int | None, int | None]]] = {}
for _kind, _needle, _pattern, _value, _extra in _PATTERNS:
    _BY_NEEDLE.setdefault(_needle, []).append((_kind, _pattern, _value, _extra))
_ANY_NEEDLE = re.compile("|".join(re.escape(n) for n in _BY_NEEDLE if n))
_TABLE_ROW = re.compile(r"^(?:\S*:\s*)?\s*\d+\s+\d+\s")  # a candidate nccl-tests row (the "" needle)


def scan_lines(file: str, lines: Iterable[str]) -> Iterator[Observation]:
    for number, raw in enumerate(lines, 1):
        row = _TABLE_ROW.match(raw) is not None
        if not row and _ANY_NEEDLE.search(raw) is None:
            continue
        text = raw.rstrip("\r\n")
        line = LogLine(file=file, number=number, text=text.strip())
        seen: set[str] = set()
        for needle, patterns in _BY_NEEDLE.items():
            if needle not in text if needle else not row:
                continue
            for kind, pattern, value_group, extra_group in patterns:
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
