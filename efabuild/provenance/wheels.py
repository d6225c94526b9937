"""Libraries pip installed from wheels (`nvidia-cudnn-cu12`, `nvidia-nccl-cu12`,
`nvidia-cuda-runtime-cu12`...), and which copy PyTorch loads.

A wheel's version is its dist-info's METADATA `Version:`; where its libraries are is its RECORD
(paths relative to the site directory), else the directory its package puts them in. PyTorch's
libraries find these by a RUNPATH relative to themselves (`$ORIGIN/../../nvidia/cudnn/lib`), which
the loader searches after LD_LIBRARY_PATH and before ld.so.conf and its default directories.
"""

from __future__ import annotations

import posixpath
from fnmatch import fnmatchcase

from efabuild.provenance import ldpath
from efabuild.provenance.fsread import dist_info_dirs, metadata_version
from efabuild.provenance.fsview import FsView
from efabuild.provenance.measured import Copy, LibDir

MAX_RECORD = 1 << 20  # a RECORD of the biggest NVIDIA wheel is under 20 KB
MAX_WHEELS = 8  # dist-infos of one project read: an image has one, a hostile one may have thousands


def library_copies(fs: FsView, sites: list[str], dist_pattern: str, lib_pattern: str,
                   known_dir: str) -> list[Copy]:
    """Each installed wheel's library files matching `lib_pattern` (real paths, inside the image),
    with the wheel's version read from its METADATA. `known_dir` (relative to the site directory)
    is looked in when the RECORD is missing or names none."""
    copies: list[Copy] = []
    for dist_info in dist_info_dirs(fs, sites, dist_pattern)[:MAX_WHEELS]:
        site = posixpath.dirname(dist_info)
        version = metadata_version(fs, dist_info)
        source = f"{dist_info}/METADATA" if version else None
        for path in _recorded(fs, dist_info, site, lib_pattern) or fs.glob(f"{site}/{known_dir}/{lib_pattern}"):
            real = fs.resolve(path)
            if real is not None and fs.is_file(real) and all(c.path != real for c in copies):
                copies.append(Copy(real, version, source))
    return copies


def _recorded(fs: FsView, dist_info: str, site: str, lib_pattern: str) -> list[str]:
    text = fs.read_text(f"{dist_info}/RECORD", max_size=MAX_RECORD) or ""
    found = []
    for line in text.splitlines():
        relative = line.split(",", 1)[0]
        parts = relative.split("/")
        # the image's file: a path out of the site directory is not the wheel's
        if relative.startswith("/") or ".." in parts or not fnmatchcase(parts[-1], lib_pattern):
            continue
        found.append(posixpath.join(site, relative))
    return found


def torch_site(fs: FsView, sites: list[str]) -> str | None:
    """The real path of the first site directory holding PyTorch (the one `import torch` finds)."""
    for site in sites:
        if fs.is_dir(f"{site}/torch/lib") or fs.is_file(f"{site}/torch/version.py"):
            return fs.resolve(site)
    return None


def picked(fs: FsView, search: tuple[LibDir, ...], sites: list[str], wheel: list[Copy], name: str,
           machine: str | None) -> str | None:
    """The copy of library `name` (a soname, e.g. "libcudnn.so.9") a process importing torch
    loads: one on LD_LIBRARY_PATH first, then the wheel's beside torch (its $ORIGIN-relative
    RUNPATH), then the loader's own search. None when none is found."""
    env_dirs = tuple(d for d in search if d.source == "env:LD_LIBRARY_PATH")
    first = ldpath.find_library(fs, env_dirs, name, machine)
    if first is not None:
        return first
    site = torch_site(fs, sites)
    if site is not None:
        for copy in wheel:
            if copy.path.startswith(f"{site}/nvidia/") and posixpath.basename(copy.path) == name:
                return copy.path
    return ldpath.find_library(fs, search, name, machine)
