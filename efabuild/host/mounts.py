"""Whether a path is a mount point, read from /proc/self/mountinfo: a stat cannot tell, since a
FUSE mount whose process died answers every stat with ENOTCONN (and a hung one never answers)."""

from __future__ import annotations

import os
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")


def _escaped(path: str) -> str:
    """A path as mountinfo writes it: space, tab, newline and backslash as octal escapes."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in path)


def is_mounted(path: Path) -> bool:
    """Whether something is mounted at `path` (not resolved through links: an absolute path as given)."""
    wanted = _escaped(os.path.abspath(path))
    try:
        with open(MOUNTINFO, encoding="utf-8", errors="surrogateescape") as table:
            return any(line.split(" ", 5)[4] == wanted for line in table if line.count(" ") >= 5)
    except OSError:
        return os.path.ismount(path)
