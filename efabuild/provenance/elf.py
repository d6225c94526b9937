"""Which machine an ELF file is built for, from its first 20 bytes (`e_ident` and `e_machine`).

Pure: callers hand in a file's head. Twenty bytes are all a loader needs to refuse a library of
another machine, so nothing more is read (pyelftools parses whole files from a seekable stream,
which a .sqsh read with `unsquashfs -cat` is not). Machines are named as the Debian triplets'
first part (x86_64, aarch64); `architecture` maps them to the OCI/Docker names (amd64, arm64).
"""

from __future__ import annotations

HEAD_BYTES = 20  # e_ident (16) + e_type (2) + e_machine (2)
MAGIC = b"\x7fELF"

# e_machine values (the System V ABI's registry, as <elf.h> names them) -> machine
_MACHINES = {3: "i386", 20: "ppc", 21: "ppc64", 40: "arm", 62: "x86_64", 183: "aarch64", 243: "riscv64"}
# machine -> (OCI architecture, Debian multiarch triplet): the platforms an image is built for
SUPPORTED = {"x86_64": ("amd64", "x86_64-linux-gnu"), "aarch64": ("arm64", "aarch64-linux-gnu")}
TRIPLETS = tuple(triplet for _, triplet in SUPPORTED.values())
_BY_ARCHITECTURE = {arch: machine for machine, (arch, _) in SUPPORTED.items()}


def machine(head: bytes) -> str | None:
    """The machine of an ELF file from its head; None when it is not ELF (a script, a text stub).
    A machine without a name here is `e_machine N`."""
    if len(head) < HEAD_BYTES or not head.startswith(MAGIC):
        return None
    order = {1: "little", 2: "big"}.get(head[5])  # EI_DATA
    if order is None or head[4] not in (1, 2):  # EI_CLASS: ELF32 or ELF64
        return None
    number = int.from_bytes(head[18:20], order)
    return _MACHINES.get(number, f"e_machine {number}")


def machine_of_platform(platform: str | None) -> str | None:
    """"linux/arm64" or "arm64" -> "aarch64"; None for a platform efabuild has no triplet for."""
    if not platform:
        return None
    parts = platform.split("/")
    return _BY_ARCHITECTURE.get(parts[1] if len(parts) > 1 else parts[0])


def architecture(machine_name: str | None) -> str | None:
    return SUPPORTED[machine_name][0] if machine_name in SUPPORTED else None


def triplet(machine_name: str | None) -> str | None:
    return SUPPORTED[machine_name][1] if machine_name in SUPPORTED else None


def triplets_for(machine_name: str | None) -> tuple[str, ...]:
    """Every supported triplet, the image's own first (x86_64 first when the machine is unknown)."""
    own = triplet(machine_name)
    return (own, *(t for t in TRIPLETS if t != own)) if own else TRIPLETS
