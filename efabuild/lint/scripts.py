"""Rules over Slurm job scripts (by default the workspace's `scripts/`): what a job does to the
container's EFA stack from the outside.

A file counts as a job script when it is a shell script (by suffix or shebang) that mentions
`srun`, `salloc`, `sbatch` or `#SBATCH`. With Pyxis the job's environment is passed into the
container, so host paths exported before `srun` end up on the container's library path.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from efabuild.configfile import read_bytes
from efabuild.lint.finding import Finding, finding
from efabuild.lint.rules.nccl_env import nccl_env_problems
from efabuild.lint.shell import Command, split_commands

_HEAD_BYTES = 200_000  # enough of a file to tell a job script
SCRIPT_SUFFIXES = {".sh", ".bash", ".sbatch", ".slurm", ".job"}
_JOB_MARKERS = re.compile(r"\bsrun\b|\bsalloc\b|\bsbatch\b|^#SBATCH", re.MULTILINE)
_SBATCH_CPUS = re.compile(r"^#SBATCH\s+(?:--cpus-per-task\b|--cpus-per-gpu\b|-c\s*\d)", re.MULTILINE)
_CPU_OPTIONS = ("--cpus-per-task", "--cpus-per-gpu", "-c")
_SLURM_LAUNCHERS = {"srun", "salloc", "sbatch"}
_HOST_EFA_PATH = re.compile(r"^/opt/amazon(/|$)|libfabric|libnccl|ofi-nccl|aws-ofi-nccl")
_HOST_LIBRARY_DIR = re.compile(r"^/opt/amazon(/|$)")
_LAUNCHED = {"srun", "mpirun", "torchrun", "python", "python3", "bash", "sh"}


def job_scripts(root: Path) -> list[Path]:
    """Job scripts under `root/scripts`, sorted."""
    base = root / "scripts"
    if not base.is_dir():
        return []
    found = []
    for path in sorted(base.rglob("*")):
        if path.is_file() and is_job_script(path):
            found.append(path)
    return found


def is_job_script(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:  # a regular file (checked by the caller): open cannot block
            head = handle.read(_HEAD_BYTES)
    except OSError:
        return False
    if b"\0" in head:
        return False
    text = head.decode("utf-8", errors="replace")
    shell = path.suffix in SCRIPT_SUFFIXES or re.match(r"^#!.*\b(ba|z|k)?sh\b", text) is not None
    return shell and _JOB_MARKERS.search(text) is not None


def _options(command: Command) -> list[tuple[str, str | None]]:
    """(`--name`, value) for each long or short option of a Slurm command."""
    out: list[tuple[str, str | None]] = []
    words = list(command.argv[1:])
    for index, word in enumerate(words):
        if word.startswith("--"):
            name, sep, value = word.partition("=")
            if not sep and index + 1 < len(words) and not words[index + 1].startswith("-"):
                value = words[index + 1]
            out.append((name, value if (sep or value) else None))
        elif re.match(r"^-[A-Za-z]", word):
            value = word[2:] or (words[index + 1] if index + 1 < len(words) else "")
            out.append((word[:2], value))
    return out


def lint_script(path: Path, display: str) -> list[Finding]:
    text = read_bytes(path, display).decode("utf-8", errors="replace")
    starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def line_of(offset: int) -> int:
        return bisect.bisect_right(starts, offset)

    loops = _loop_bodies(text)

    findings: list[Finding] = []
    containers: list[int] = []  # lines of srun/salloc with a container
    launches: list[_Start] = []  # their container options
    has_cpus = _SBATCH_CPUS.search(text) is not None
    local: dict[str, str] = {}
    for command in split_commands(text, local=local):
        line = line_of(command.offset)
        findings.extend(_exported(command, display, line))
        if command.program not in _SLURM_LAUNCHERS:
            continue
        options = _options(command)
        if any(name in _CPU_OPTIONS for name, _ in options):
            has_cpus = True
        if any(name in ("--container-image", "--container-name") for name, _ in options):
            containers.append(line)
            launches.append(_Start.of(options, line, looped=_inside(loops, command.offset)))
            findings.extend(_stale_container(dict(options), local, display, line))
        for name, value in options:
            if name == "--container-mounts" and value:
                findings.extend(_mounts(value, display, line))
            elif name == "--export" and value:
                # --export=ALL,NAME=value,...: variables handed to the job like exports
                pairs = [item.partition("=") for item in value.split(",")]
                findings.extend(_checked(((n, v) for n, sep, v in pairs if sep), display, line))
    if containers and not has_cpus:
        findings.append(finding(
            "EFA015", display, containers[0], None,
            "containers start without --cpus-per-task: on the EFA path bandwidth drops to 1/4-1/10 of "
            "baseline when ranks get too few CPU cores",
            "give each rank enough cores, e.g. `#SBATCH --cpus-per-task=24` (needed on 2 x P6-B200)"))
    findings.extend(_start_modes(launches, display))
    return findings


_NAME_FLAGS = {"create", "exec", "no_create", "no_exec"}  # Pyxis's --container-name=NAME:FLAG


class _Start(NamedTuple):
    line: int
    image: bool  # --container-image: this step creates the container (unless its name exists)
    name: str | None
    save: bool
    looped: bool = False  # in a for/while/until body: run again, reusing its name

    @classmethod
    def of(cls, options: list[tuple[str, str | None]], line: int, looped: bool = False) -> _Start:
        given = dict(options)
        name = given.get("--container-name")
        # NAME:FLAG (create, exec, no_create, ...) names the same container as NAME
        if name and name.rpartition(":")[2] in _NAME_FLAGS:
            name = name.rpartition(":")[0]
        return cls(line, "--container-image" in given, name, "--container-save" in given, looped)


# `do` and `done` where a command starts (a line's start or after ; & | ( ), not an argument or a comment
_LOOP_WORD = re.compile(r"(?:^|[;&|()])[ \t]*(do|done)(?=[ \t;&|()<>]|$)", re.MULTILINE)


def _loop_bodies(text: str) -> list[tuple[int, int]]:
    """(start, end) offsets of the loops' bodies, outermost ones: a command there runs repeatedly."""
    bodies, depth, start = [], 0, 0
    for match in _LOOP_WORD.finditer(text):
        if match.group(1) == "do":
            depth += 1
            start = match.start(1) if depth == 1 else start  # `do srun ...` starts at its `do`
        elif depth:
            depth -= 1
            if depth == 0:
                bodies.append((start, match.start(1)))
    if depth:
        bodies.append((start, len(text)))
    return bodies


def _inside(bodies: list[tuple[int, int]], offset: int) -> bool:
    return any(start <= offset < end for start, end in bodies)


# Measured with the bench's 1.44 GB image (Slurm 22.05, Pyxis 0.24, Enroot 4.1.2; medians of 5)
_UNPACK_COST = "`enroot create` unpacks the whole image (8.45 s for a 1.44 GB image)"
_MOUNT_COST = "squashfuse mounts it instead (1.17 s cold, 0.44 s warm)"


def _start_modes(starts: list[_Start], display: str) -> Iterator[Finding]:
    """Which start mode the script chose (one note per mode), and starts that unpack although an
    unnamed container would mount. Pyxis >= 0.22 with `use_squashfuse=1` starts a container from
    the squashfs only when it is unnamed and not saved (--container-save); any other start unpacks."""
    reused = Counter(start.name for start in starts if start.name is not None)
    noted: set[str] = set()
    for start in starts:
        if not start.image:
            continue  # reuses a named container: no start of its own
        if start.save:
            yield finding("EFA020", display, start.line, None,
                          "--container-save: Pyxis unpacks the image for this step even with use_squashfuse=1 "
                          f"({_UNPACK_COST}; an unnamed, unsaved container starts from the .sqsh: {_MOUNT_COST})",
                          "save only from the step that must keep its changes; start the others unnamed")
        elif start.name is not None and reused[start.name] == 1 and not start.looped:
            yield finding("EFA020", display, start.line, None,
                          f"names its container ({start.name}) but no other srun uses the name: the name makes "
                          f"Pyxis unpack the image ({_UNPACK_COST}) where, with use_squashfuse=1, {_MOUNT_COST}",
                          "drop --container-name to mount per step, or reuse the name in the later sruns (keep it "
                          "where a later job reuses it: Pyxis's container_scope=global)")
        elif start.name is not None and "unpack" not in noted:
            noted.add("unpack")
            yield finding("EFA019", display, start.line, None,
                          f"start mode: unpack once per node and reuse by name ({start.name}): {_UNPACK_COST} at "
                          "this step, the later sruns with the name start at once",
                          "nothing to do; for one step per image, an unnamed --container-image mounts with "
                          "squashfuse (use_squashfuse=1 in plugstack.conf, Pyxis 0.22 or later)")
        elif start.name is None and "mount" not in noted:
            noted.add("mount")
            yield finding("EFA019", display, start.line, None,
                          "start mode: mount per step (unnamed --container-image): with use_squashfuse=1 in "
                          f"plugstack.conf (Pyxis 0.22 or later) {_MOUNT_COST}; without it {_UNPACK_COST} at "
                          "every such step",
                          "nothing to do where the nodes have use_squashfuse=1 and /dev/fuse open to users; "
                          "elsewhere name the container and reuse it")


# `efabuild lookup ... REF` in a command substitution, and REF: its last word
_LOOKUP = re.compile(r"""(?:\$\(|`)\s*(?:\S*/)?efabuild\s+lookup\b([^)`]*)""")
_VARIABLE = re.compile(r"""^["']?\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?["']?$""")
_HEX_REF = re.compile(r"^[0-9a-fA-F]{8,64}$")


def _moving_ref(ref: str, local: dict[str, str], depth: int = 0) -> str | None:
    """The name `ref` stands for when it names an artifact by graph:layer (which a make moves to a
    new build), None for a key, a path, or what this reader cannot tell."""
    ref = ref.strip().strip("'\"")
    variable = _VARIABLE.match(ref)
    if variable and depth < 4:
        value = local.get(variable.group(1))
        if value is None:
            return None
        lookup = _LOOKUP.search(value)
        if lookup is not None:
            words = lookup.group(1).split()
            # `lookup --key NAME` too: the key is fixed for this job, the next job's is the next build's
            return _moving_ref(words[-1], local, depth + 1) if words else None
        return _moving_ref(value, local, depth + 1)
    if ref.startswith("efabuild://"):
        ref = ref[len("efabuild://"):]
    name = ref.partition("@")[0]
    return name if ":" in name and "$" not in name and "/" not in name and not _HEX_REF.match(name) else None


def _fixed(name: str | None, local: dict[str, str]) -> str | None:
    """The container name a job gives whatever build it runs: written out, or a variable set to a
    value written out (NAME=train); None for one that varies (train-${KEY:0:12}) or is not given."""
    for _ in range(4):
        if name is None:
            return None
        name = name.strip().strip("'\"")
        variable = _VARIABLE.match(name)
        if variable is None:
            return None if "$" in name or "`" in name or not name else name
        name = local.get(variable.group(1))
    return None


def _stale_container(given: dict[str, str | None], local: dict[str, str], display: str,
                     line: int) -> Iterator[Finding]:
    """A fixed --container-name with an image that a make changes: Pyxis (container_scope=global,
    its default) keeps the named container after the job, and a later job with the same name starts
    that container, the previous build's, whatever image it asks for."""
    image, name = given.get("--container-image"), _fixed(given.get("--container-name"), local)
    if not image or not name:
        return
    lookup = _LOOKUP.search(image)
    if lookup is not None:
        words = lookup.group(1).split()
        moving = _moving_ref(words[-1], local) if words else None
    else:
        moving = _moving_ref(image, local)
    if moving is None:
        return
    base = name.rpartition(":")[0] if name.rpartition(":")[2] in _NAME_FLAGS else name
    yield finding("EFA024", display, line, None,
                  f"--container-name={base} is fixed but the image follows {moving}: Pyxis keeps the named "
                  "container after the job (container_scope=global), so the next job after a new build starts "
                  "the previous build's container (slurmd: \"reusing existing container filesystem\")",
                  f"name the container by the artifact's key: KEY=$(efabuild lookup --key {moving}), "
                  f"--container-image=\"$(efabuild lookup \"$KEY\")\" --container-name=\"{base}-${{KEY:0:12}}\"; "
                  f"remove old ones with `efabuild prune-containers {base} --keep \"$KEY\"`")


def _mounts(value: str, display: str, line: int) -> Iterator[Finding]:
    for entry in value.split(","):
        source = entry.split(":", 1)[0].strip()
        if not source:
            continue
        if source == "/dev/infiniband" or source.startswith("/dev/infiniband/"):
            yield finding("EFA016", display, line, None,
                          f"mounts {source}: with ENROOT_RESTRICT_DEV n in enroot.conf the EFA devices are "
                          "visible in the container without a mount",
                          "drop the mount (keep it only where enroot restricts devices)")
        elif _HOST_EFA_PATH.search(source):
            yield finding("EFA008", display, line, None,
                          f"mounts the host's {source} into the container: the host's EFA/NCCL libraries mix "
                          "with the image's and versions drift apart",
                          "drop the mount; match versions by building the host AMI's EFA installer version "
                          "into the image")


def _exported(command: Command, display: str, line: int) -> Iterator[Finding]:
    """Variables the job passes on: `export X=...` and `X=... srun ...`."""
    pairs: list[tuple[str, str]] = []
    if command.argv and command.argv[0] == "export":
        for word in command.argv[1:]:
            name, sep, value = word.partition("=")
            if sep:
                pairs.append((name, value))
    elif command.program in _LAUNCHED or command.program in _SLURM_LAUNCHERS:
        pairs.extend(command.assigns)
    return _checked(pairs, display, line)


def _checked(pairs: Iterable[tuple[str, str]], display: str, line: int) -> Iterator[Finding]:
    for name, value in pairs:
        if name == "LD_LIBRARY_PATH":
            host_dirs = [d for d in value.split(":") if _HOST_LIBRARY_DIR.match(d)]
            if host_dirs:
                yield finding("EFA009", display, line, None,
                              f"puts host library paths ({', '.join(host_dirs)}) on LD_LIBRARY_PATH before the "
                              "job starts: it reaches the container and mixes host and image EFA libraries",
                              "leave LD_LIBRARY_PATH to the image (its ENV leads with the EFA libraries)")
        elif name.startswith("NCCL_"):
            problem = nccl_env_problems(name, value)
            if problem:
                rule_id, message, fix = problem
                yield finding(rule_id, display, line, None, f"the job {message[0].lower()}{message[1:]}"
                              if message.startswith(("sets", "removes")) else message, fix)
