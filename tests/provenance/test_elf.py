"""The ELF machine reader: e_ident and e_machine from a file's first 20 bytes."""

from __future__ import annotations

import pytest

from efabuild.provenance import elf
from tests.data.rootfs.mini_ngc import EM_AARCH64, EM_X86_64, fake_elf


def header(machine: int, *, elf_class: int = 2, order: str = "little") -> bytes:
    data = 1 if order == "little" else 2
    return b"\x7fELF" + bytes([elf_class, data, 1]) + b"\x00" * 9 + (3).to_bytes(2, order) + machine.to_bytes(2, order)


@pytest.mark.parametrize("head, machine", [
    (fake_elf("x", machine=EM_X86_64), "x86_64"),
    (fake_elf("x", machine=EM_AARCH64), "aarch64"),
    (header(EM_AARCH64, elf_class=1), "aarch64"),  # ELF32 header of the same layout up to e_machine
    (header(21, order="big"), "ppc64"),  # big-endian: e_machine read in the file's byte order
    (header(EM_X86_64, order="big"), "x86_64"),
    (header(EM_X86_64, order="big")[:5] + b"\x01" + header(EM_X86_64, order="big")[6:], "e_machine 15872"),
    (header(9999), "e_machine 9999"),
    (b"#!/bin/sh\nexec python3 \"$@\"\n", None),  # a script
    (b"fixture shared library stand-in\n", None),
    (b"\x7fELF\x02\x01", None),  # cut short
    (header(EM_X86_64, elf_class=7), None),  # no such class
])
def test_machine_from_the_header(head: bytes, machine: str | None) -> None:
    assert elf.machine(head[:elf.HEAD_BYTES]) == machine


def test_platforms_map_to_machines_and_triplets() -> None:
    assert elf.machine_of_platform("linux/arm64") == "aarch64"
    assert elf.machine_of_platform("linux/amd64") == "x86_64"
    assert elf.machine_of_platform("arm64") == "aarch64"  # an image config's architecture
    assert elf.machine_of_platform("linux/ppc64le") is None
    assert elf.triplets_for("aarch64") == ("aarch64-linux-gnu", "x86_64-linux-gnu")
    assert elf.triplets_for(None) == ("x86_64-linux-gnu", "aarch64-linux-gnu")
    assert elf.architecture("aarch64") == "arm64"
