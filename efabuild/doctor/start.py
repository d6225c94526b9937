"""Diagnoses of a container's start under Pyxis and Enroot: a .sqsh mounted with squashfuse (Pyxis
use_squashfuse=1), or unpacked with `enroot create`. Registered with diagnose.RULES like the others."""

from __future__ import annotations

import re
from collections.abc import Iterator

from efabuild.doctor.diagnose import Seen, rule
from efabuild.doctor.facts import Diagnosis

# Measured on Slurm 22.05 + Pyxis 0.24 + Enroot 4.1.2 with a 1.44 GB image (`srun ... true`, medians of 5)
_UNPACK_COST = "8.45 s for a 1.44 GB image; an NGC PyTorch image takes minutes"
_MOUNT = ("mount it per step instead: use_squashfuse=1 in plugstack.conf (Pyxis 0.22 or later) and an unnamed "
          "--container-image without --container-save (1.17 s cold, 0.44 s warm)")
_UNPACK_INSTEAD = ("meanwhile unpack it: give the srun --container-name (Pyxis then runs `enroot create`), or drop "
                   "use_squashfuse=1")


@rule("fuse-permission", "squashfs-tool-missing", "squashfs-mount-failed",
      catches="a .sqsh started without unpacking that Enroot could not mount: /dev/fuse closed to the job's user "
              "or absent, squashfuse missing, or another mount failure")
def squashfs_mount(seen: Seen) -> Iterator[Diagnosis]:
    facts = seen.facts
    if facts.has("fuse-open-failed"):
        reason = facts.values("fuse-open-failed")[0]
        absent = reason == "device not found" or "No such file" in reason
        yield Diagnosis(
            "fuse-permission", "problem",
            "squashfuse could not open /dev/fuse" + (" (no such device)" if absent else f" ({reason})"),
            "A container started straight from its .sqsh (Pyxis use_squashfuse=1, `enroot start x.sqsh`) is "
            "mounted by squashfuse running as the job's user: "
            + ("the node has no /dev/fuse (the fuse module is not loaded)" if absent else
               "the node's /dev/fuse is not readable and writable by that user")
            + ", so Enroot could not mount the image ('Failed to mount').",
            ("on every node `modprobe fuse` (and load it at boot)" if absent else
             "on every node make /dev/fuse mode 0666, as udev's default rules set it (`chmod 0666 /dev/fuse`; a udev "
             "rule KERNEL==\"fuse\", MODE=\"0666\" keeps it across reboots)") + f"; {_UNPACK_INSTEAD}",
            facts.evidence("fuse-open-failed", "squashfs-mount-failed"))
    elif facts.has("squashfs-tool-missing"):
        tools = ", ".join(facts.values("squashfs-tool-missing"))
        yield Diagnosis(
            "squashfs-tool-missing", "problem", f"Enroot could not find {tools} on the node",
            "Enroot mounts a .sqsh with squashfuse (and fuse-overlayfs where kernel overlayfs is not used), and "
            "unpacks one with unsquashfs: the command it needs for this start is not installed.",
            f"install {tools} on every node (Debian/Ubuntu packages squashfuse, fuse-overlayfs, squashfs-tools); "
            f"{_UNPACK_INSTEAD}" if "unsquashfs" not in tools else f"install {tools} on every node",
            facts.evidence("squashfs-tool-missing"))
    elif facts.has("squashfs-mount-failed"):
        yield Diagnosis(
            "squashfs-mount-failed", "problem", "Enroot could not mount the .sqsh",
            "squashfuse or the overlay over it failed to mount the image; the [WARN] lines Pyxis prints just "
            "before 'Failed to mount' are squashfuse's and say why.",
            "check on the node that squashfuse is installed, /dev/fuse is open to the job's user and the path is a "
            f"squashfs (`unsquashfs -s PATH`); {_UNPACK_INSTEAD}",
            facts.evidence("squashfs-mount-failed"))


@rule("invalid-image", catches="'Invalid image format': the image Enroot was given is not a squashfs it can read")
def invalid_image(seen: Seen) -> Iterator[Diagnosis]:
    if seen.facts.has("invalid-image"):
        path = seen.facts.values("invalid-image")[0]
        yield Diagnosis(
            "invalid-image", "problem", f"Enroot cannot read {path} as a squashfs",
            "`unsquashfs -s` refused the file Enroot was to unpack: a copy cut short or damaged, or a path that "
            "is not a .sqsh at all.",
            "check the artifact with `efabuild lookup --verify REF` (it names a damaged copy; the next lookup "
            "fetches a good one from S3) and that --container-image names the .sqsh",
            seen.facts.evidence("invalid-image"))


@rule("unpack-failed", "unpacked-start",
      catches="Pyxis unpacking the image (`enroot create`): a failure (a full disk named), or the cost of a start")
def unpacking(seen: Seen) -> Iterator[Diagnosis]:
    facts = seen.facts
    if facts.has("unpack-failed") and facts.has("invalid-image"):
        return  # said with its cause: invalid-image
    if facts.has("unpack-failed"):
        full = facts.has("no-space")
        yield Diagnosis(
            "unpack-failed", "problem",
            "Pyxis could not unpack the image" + (": no space left on the node's disk" if full else ""),
            "`enroot create` unpacks the whole .sqsh into ENROOT_DATA_PATH on the node"
            + (", and that disk filled up: an unpacked image takes its whole uncompressed size, once per "
               "named container kept there." if full else
               "; the lines Pyxis prints after 'printing contents of log file' say what failed."),
            ("free the disk under ENROOT_DATA_PATH (`enroot list`, `enroot remove` of old named containers) or put "
             "it on local NVMe with room for the unpacked image" if full else
             "act on the Enroot lines Pyxis printed after 'printing contents of log file'") + "; or " + _MOUNT,
            facts.evidence("unpack-failed", "no-space"))
    elif facts.has("unpacked"):
        yield Diagnosis(
            "unpacked-start", "info", "the container was started by unpacking the image (enroot create)",
            f"This step unpacked the whole .sqsh onto the node ({_UNPACK_COST}) before the job's command ran.",
            "reuse it in later sruns with the same --container-name (no second unpack), or " + _MOUNT,
            facts.evidence("unpacked"))


@rule("import-failed", catches="Pyxis failing to import the image (enroot import, or efabuild's importer, whose "
                               "own line is shown)")
def import_failed(seen: Seen) -> Iterator[Diagnosis]:
    facts = seen.facts
    if not facts.has("import-failed"):
        return
    said = facts.values("importer-said")
    yield Diagnosis(
        "import-failed", "problem",
        "Pyxis could not import the image" + (f": efabuild's importer said {said[0][:200]}" if said else ""),
        "Before a container starts, Pyxis imports its image: `enroot import`, or the importer of plugstack.conf "
        "(efabuild's, for efabuild:// images), which prints the .sqsh path or one line saying why not: "
        + ("a missing, damaged or unsigned artifact is refused there, before anything is unpacked or mounted."
           if said else "the lines Pyxis prints after 'printing contents of log file' are its output."),
        "on the node, `efabuild lookup --require-signature REF` (or `efabuild verify REF`) gives the same answer "
        "with the details; republish or re-fetch the artifact it names" if said else
        "act on the lines Pyxis printed after 'printing contents of log file'",
        facts.evidence("import-failed", "importer-said"))


_NAME_OPTION = re.compile(r"--container-name[= ]['\"]?([^\s'\":]+)")
_IMAGE_OPTION = re.compile(r"--container-image[= ]['\"]?([^\s'\"]+)")
_KEY_IN_NAME = re.compile(r"-([0-9a-f]{12})$")
_KEY_IN_IMAGE = re.compile(r"(?:^|[/:])([0-9a-f]{64})(?:\.sqsh)?$")
_NAME_BY_KEY = ("name the container by the artifact's key: KEY=$(efabuild lookup --key NAME), "
                "--container-image=\"$(efabuild lookup \"$KEY\")\" --container-name=\"train-${KEY:0:12}\" "
                "(scripts/example-job.sbatch); `efabuild prune-containers train --keep \"$KEY\"` removes the old ones")


@rule("stale-container", "container-reused",
      catches="a step that started a container Pyxis kept from an earlier job by its name, whatever image it asked "
              "for: the previous build when the name is fixed")
def reused_container(seen: Seen) -> Iterator[Diagnosis]:
    facts = seen.facts
    if not facts.has("container-reused"):
        return
    observed = sorted(facts.of("named-start"), key=lambda o: (o.line.file, o.line.number))
    starts = [(o, _NAME_OPTION.search(o.value or ""), _IMAGE_OPTION.search(o.value or "")) for o in observed]
    ordered = [(o, name.group(1), image.group(1) if image else None) for o, name, image in starts if name]
    pairs = [(name, image) for _, name, image in ordered]
    stale, same = [], []
    for name, image in pairs:
        in_name = _KEY_IN_NAME.search(name)
        in_image = _KEY_IN_IMAGE.search(image) if image else None
        if in_name and in_image:
            (same if in_image.group(1).startswith(in_name.group(1)) else stale).append(
                (name, in_name.group(1), in_image.group(1)))
    evidence = facts.evidence("container-reused", "named-start")
    if stale:
        name, ran, asked = stale[0]
        yield Diagnosis(
            "stale-container", "problem",
            f"the step started container {name} (artifact {ran}…), not the artifact it asked for ({asked[:12]}…)",
            "Pyxis found a container of that name on the node ('reusing existing container filesystem') and "
            "started it without looking at --container-image: the image that ran is the one the container was "
            "created from.",
            _NAME_BY_KEY, evidence)
    elif same and len(same) == len(pairs):
        yield Diagnosis(
            "container-reused", "info",
            f"the step reused container {same[0][0]}, created from the artifact it asked for ({same[0][1]}…)",
            "Pyxis kept the named container from an earlier step or job; its name carries the artifact's key, so "
            "it is the image asked for, started without a second unpack.",
            "nothing to do; `efabuild prune-containers NAME --keep KEY` removes containers of earlier builds",
            evidence)
    elif (earlier := _created_from_another_image(ordered, facts.of("container-reused"))) is not None:
        name, (first, made), (later, asked) = earlier
        yield Diagnosis(
            "stale-container", "problem",
            f"the step that asked for {_shown_image(asked)} ({_at(later, first)}) started container {name}, created "
            f"from {_shown_image(made)} ({_at(first, later)})",
            "Pyxis found a container of that name on the node ('reusing existing container filesystem') and "
            "started it without looking at --container-image: the image that ran is the one the container was "
            "created from, by the first srun in this log that named it.",
            _NAME_BY_KEY, evidence)
    else:
        named = f" {pairs[0][0]}" if pairs else ""
        yield Diagnosis(
            "stale-container", "warning",
            f"the step reused container{named}, kept on the node: it may hold an earlier build than the image asked "
            "for",
            "Pyxis keeps a named container after the job (container_scope=global, its default) and starts it again "
            "for the same --container-name whatever --container-image says; this log does not show which artifact "
            "it was created from.",
            _NAME_BY_KEY, evidence)


def _created_from_another_image(ordered, reused):  # noqa: ANN001, ANN202 - (observation, name, image) in log order
    """(name, (first start, its image), (later start, its image)) for a container name the log's sruns
    give two images: Pyxis created it from the first one's and started that for the later one, which
    a reuse reported after the later start (or in another file: slurmd's log) shows."""
    first: dict[str, tuple] = {}
    for observation, name, image in ordered:
        if image is None:
            continue
        if name not in first:
            first[name] = (observation, image)
        elif image != first[name][1] and any(_follows(r, observation) for r in reused):
            return name, first[name], (observation, image)
    return None


def _follows(reuse, start) -> bool:  # noqa: ANN001 - Observations
    return reuse.line.file != start.line.file or reuse.line.number > start.line.number


def _shown_image(image: str) -> str:
    """An image as a person compares two: the artifact's key (12 hex) when it names one."""
    key = _KEY_IN_IMAGE.search(image)
    return f"artifact {key.group(1)[:12]}…" if key else image[:120]


def _at(observation, other) -> str:  # noqa: ANN001 - Observations
    """Where a start is: its line, with its file when the other start is in another file."""
    line = observation.line
    return f"line {line.number}" if line.file == other.line.file else f"{line.file}:{line.number}"
