"""Libraries pip installed from wheels (`nvidia-cudnn-cu12`, `nvidia-nccl-cu12`,
`nvidia-cuda-runtime-cu12`...) or conda from its packages (`cudnn`, `nccl`, `cuda-cudart`), and
which copy PyTorch loads.

A wheel's version is its dist-info's METADATA `Version:`; where its libraries are is its RECORD
(paths relative to the site directory), else the directory its package puts them in. PyTorch's
libraries find these by a RUNPATH relative to themselves (`$ORIGIN/../../nvidia/cudnn/lib`), which
the loader searches after LD_LIBRARY_PATH and before ld.so.conf and its default directories.
A conda environment records each package in `conda-meta/<name>-<version>-<build>.json` (its
`version` and the `files` it installed, relative to the environment); conda's torch finds the
environment's `lib/` by its RUNPATH the same way.
"""

from __future__ import annotations

import json
import posixpath
from fnmatch import fnmatchcase

from efabuild.provenance import ldpath
from efabuild.provenance.fsread import dist_info_dirs, metadata_version
from efabuild.provenance.fsview import FsView
from efabuild.provenance.measured import Copy, LibDir

MAX_RECORD = 1 << 20  # a RECORD of the biggest NVIDIA wheel is under 20 KB
MAX_WHEELS = 8  # dist-infos of one project read: an image has one, a hostile one may have thousands
MAX_LIBS = 64  # library files of one package looked up: cuDNN's wheel has a dozen, a hostile record millions
CONDA_ENVS = ("/opt/conda", "/opt/conda/envs/*")
MAX_CONDA_RECORD = 8 << 20  # conda-meta of the biggest CUDA package is a few hundred KB


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
        if len(found) >= MAX_LIBS:
            break
    return found


def conda_copies(fs: FsView, package: str, lib_pattern: str) -> list[Copy]:
    """The library files matching `lib_pattern` that conda `package` installed in each
    environment, with the version its conda-meta record gives."""
    copies: list[Copy] = []
    records = [r for env in CONDA_ENVS for env_dir in fs.glob(env)
               for r in fs.glob(f"{env_dir}/conda-meta/{package}-[0-9]*.json")][:MAX_WHEELS]
    for record in records:
        try:
            data = json.loads(fs.read_text(record, max_size=MAX_CONDA_RECORD) or "null")
        except (ValueError, RecursionError):  # the image's file: any shape, any depth
            continue
        if not isinstance(data, dict) or data.get("name") != package or not isinstance(data.get("files"), list):
            continue
        version = data.get("version") if isinstance(data.get("version"), str) else None
        env_dir = posixpath.dirname(posixpath.dirname(record))
        libs = [f for f in data["files"] if isinstance(f, str) and not f.startswith("/")
                and ".." not in f.split("/") and fnmatchcase(posixpath.basename(f), lib_pattern)]
        for relative in libs[:MAX_LIBS]:
            real = fs.resolve(posixpath.join(env_dir, relative))
            if real is not None and fs.is_file(real) and all(c.path != real for c in copies):
                copies.append(Copy(real, version, record if version else None))
    return copies


def _beside_torch(path: str, site: str) -> bool:
    """Whether torch's $ORIGIN-relative RUNPATH reaches `path`: a wheel's library under the site
    directory's nvidia/, or the lib/ of the conda environment the site directory is in."""
    if path.startswith(f"{site}/nvidia/"):
        return True
    marker = "/lib/python"
    return marker in site and posixpath.dirname(path) == site[: site.index(marker)] + "/lib"


def torch_site(fs: FsView, sites: list[str]) -> str | None:
    """The real path of the first site directory holding PyTorch (the one `import torch` finds)."""
    for site in sites:
        if fs.is_dir(f"{site}/torch/lib") or fs.is_file(f"{site}/torch/version.py"):
            return fs.resolve(site)
    return None


def picked(fs: FsView, search: tuple[LibDir, ...], sites: list[str], wheel: list[Copy], name: str,
           machine: str | None) -> str | None:
    """The copy of library `name` (a soname, e.g. "libcudnn.so.9") a process importing torch
    loads: one on LD_LIBRARY_PATH first, then a wheel's or conda's beside torch (its
    $ORIGIN-relative RUNPATH), then the loader's own search. None when none is found."""
    env_dirs = tuple(d for d in search if d.source == "env:LD_LIBRARY_PATH")
    first = ldpath.find_library(fs, env_dirs, name, machine)
    if first is not None:
        return first
    site = torch_site(fs, sites)
    if site is not None:
        for copy in wheel:
            by_name = posixpath.join(posixpath.dirname(copy.path), name)
            if _beside_torch(copy.path, site) and fs.resolve(by_name) == copy.path:
                return by_name
    return ldpath.find_library(fs, search, name, machine)
