"""The one way mksquashfs runs: its options (Enroot's, the export's, never a pseudo-file or path
option from settings), the bound on its memory, and its environment."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import IO

from efabuild.errors import EfabuildError, InputError
from efabuild.grammar import extra_options_problem
from efabuild.host import children
from efabuild.settings import ExportSettings


def mksquashfs_options(options: ExportSettings, *, epoch: int = 0) -> tuple[str, ...]:
    """Every mksquashfs option of an export, input and output paths aside.

    Extra options are checked here too, not only when BUILD.toml is read: whatever builds the
    settings, no pseudo-file or path option reaches mksquashfs.
    """
    problem = extra_options_problem(options.extra_options)
    if problem:
        raise InputError(problem, "[export] extra_options")
    return (
        "-tar", "-noappend", "-all-root", "-no-xattrs",
        # a tar stream has no root directory entry: give it the one Enroot's rootfs dir has
        "-root-mode", "755", "-root-time", str(epoch), "-mkfs-time", str(epoch),
        "-exit-on-error", "-quiet", "-no-progress",
        *options.mksquashfs_options(),
    )


# mksquashfs's caches take a quarter of the node's memory by default (6 GB here): its peak grew with
# the image (4.1-4.8 GB for a 5.5 GB one). Bounded to 1 GiB (an eighth of a smaller node's memory,
# 256 MiB at least) it exported a 1 GB image in the same time (1.02 s against 1.06 s) at a peak of
# 476 MiB against 705 MiB. No byte of the .sqsh depends on it, so it is not recorded with the
# export's options; an `[export] extra_options` -mem comes after it and wins.
MKSQUASHFS_MEMORY_CAP = 1 << 30


def mksquashfs_memory() -> tuple[str, ...]:
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        physical = 8 * MKSQUASHFS_MEMORY_CAP
    mib = max(256, min(MKSQUASHFS_MEMORY_CAP, physical // 8) >> 20)
    return ("-mem", f"{mib}M")


def start_mksquashfs(tmp: Path, opts: tuple[str, ...], log: IO[bytes]) -> subprocess.Popen:
    try:
        return children.popen(["mksquashfs", "-", str(tmp), *mksquashfs_memory(), *opts], stdin=subprocess.PIPE,
                              stdout=log,
                                stderr=subprocess.STDOUT, env=_squash_env())
    except FileNotFoundError:
        raise EfabuildError(
            "mksquashfs not found: install squashfs-tools 4.6 or later (scripts/setup-host.sh)"
        ) from None


def _squash_env() -> dict[str, str]:
    # with SOURCE_DATE_EPOCH set, mksquashfs clamps every file time to it and refuses the
    # explicit -mkfs-time: the export's times come from its options only
    return {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}
