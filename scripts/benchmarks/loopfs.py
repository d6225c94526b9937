"""A loop-mounted XFS made with reflink=1, for the fetch rows that clone a seed's blocks.

Needs root, loop devices and xfsprogs (scripts/setup-host.sh); `loop_xfs` yields None, with the
reason logged, where they are missing, and the rows that need it are left out.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def loop_xfs(directory: Path, size: int, log: Callable[[str], None]) -> Iterator[Path | None]:
    if shutil.which("mkfs.xfs") is None:
        log("xfs: mkfs.xfs is not installed (xfsprogs); the XFS rows are left out")
        yield None
        return
    image, mount = directory / "xfs.img", directory / "xfs"
    mount.mkdir(parents=True, exist_ok=True)
    with open(image, "wb") as handle:
        handle.truncate(size)  # sparse
    subprocess.run(["mkfs.xfs", "-q", "-f", "-m", "reflink=1", str(image)], check=True, capture_output=True)
    done = subprocess.run(["mount", "-o", "loop", str(image), str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        log(f"xfs: cannot loop-mount an XFS image here ({done.stderr.strip()}); the XFS rows are left out")
        image.unlink()
        yield None
        return
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)
        image.unlink()
