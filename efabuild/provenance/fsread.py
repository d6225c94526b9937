"""Small readers of an image's files, shared by the probes: C `#define`s, the first file that
exists, the Python site directories and the version in a dist-info's METADATA."""

from __future__ import annotations

import re
from collections.abc import Iterable

from efabuild.provenance.fsview import FsView

SITE_DIRS = (
    "/usr/local/lib/python3*/dist-packages",
    "/usr/local/lib/python3*/site-packages",
    "/usr/lib/python3/dist-packages",
    "/usr/lib/python3*/site-packages",
    "/opt/conda/lib/python3*/site-packages",
)
MAX_LIB_SCAN = 64 << 20  # bytes of a library searched for a version string


def defines(text: str, names: Iterable[str]) -> dict[str, str]:
    out = {}
    for name in names:
        match = re.search(rf"^\s*#\s*define\s+{name}\s+(\S+)", text, re.MULTILINE)
        if match:
            out[name] = match.group(1).strip('"')
    return out


def first_existing(fs: FsView, paths: Iterable[str]) -> str | None:
    for path in paths:
        if fs.is_file(path):
            return path
    return None


def site_dirs(fs: FsView) -> list[str]:
    found = []
    for pattern in SITE_DIRS:
        for path in fs.glob(pattern):
            if fs.is_dir(path) and path not in found:
                found.append(path)
    return found


def dist_info_dirs(fs: FsView, sites: list[str], pattern: str) -> list[str]:
    return [path for site in sites for path in fs.glob(f"{site}/{pattern}") if fs.is_dir(path)]


def metadata_version(fs: FsView, dist_info: str) -> str | None:
    text = fs.read_text(f"{dist_info}/METADATA")
    if text is None:
        return None
    for line in text.splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
        if not line.strip():
            break
    return None
