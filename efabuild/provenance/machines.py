"""Whether the image's programs, libraries and plugins are of the artifact's machine.

The dynamic loader refuses a library of another machine: an amd64 libnccl-net-ofi.so in an arm64
image is passed over, and NCCL falls back to another network plugin or to TCP sockets without
failing. The files judged are the probe's sample (`libraries.machine_files`): the loaders, shell,
Python and EFA/CUDA tools, libc, every copy of NCCL, cuDNN, libfabric and aws-ofi-nccl, NCCL's
net/tuner/profiler plugins and libfabric's providers; not every file of the image.
"""

from __future__ import annotations

from collections import Counter

from efabuild.provenance import elf
from efabuild.provenance.checks import FAIL, PASS, SKIP, Check
from efabuild.provenance.measured import Measured

_NAMED = 8  # foreign files named in the message; the rest counted


def elf_machine(image: Measured, platform: str | None) -> Check:
    """`platform` is the artifact's (its key's input, from the manifest); without one the image's
    own majority machine is the reference and only a mixed image fails."""
    name = "elf-machine"
    expected = elf.machine_of_platform(platform)
    reference = f"the artifact's platform {platform}" if expected else None
    if expected is None:
        expected, reference = image.machine, f"most of the image's files ({image.machine_source or 'ELF headers'})"
    if not image.elf or expected is None:
        return Check(name, SKIP, "no ELF program, library or plugin read (none in the image, or the manifest "
                                 "was made before efabuild recorded machines)")
    foreign = [(path, machine) for path, machine in image.elf if machine != expected]
    if not foreign:
        return Check(name, PASS, f"{len(image.elf)} programs, libraries and plugins are {expected}")
    counts = Counter(machine for _, machine in image.elf)
    mix = ", ".join(f"{counts[m]} {m}" for m in sorted(counts))
    shown = "; ".join(f"{path} is {machine}" for path, machine in foreign[:_NAMED])
    more = f"; and {len(foreign) - _NAMED} more" if len(foreign) > _NAMED else ""
    return Check(name, FAIL, f"{shown}{more}: not {expected} as {reference} (the loader would pass them over; "
                             f"files read: {mix})")
