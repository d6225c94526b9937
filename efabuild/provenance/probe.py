"""Measure the versions inside an image from its files: no GPU, no container start.

`probe_tree(fs, image_env)` reads an `FsView` (a directory or a .sqsh) and returns `Measured`.
Where a library can exist in several copies (NCCL, cuDNN, the CUDA runtime, libfabric, aws-ofi-nccl),
every copy is listed with its path, and the reported version is the one the dynamic loader picks
given the image's LD_LIBRARY_PATH and ld.so.conf, or, for pip's NVIDIA wheels beside torch, the one
torch's $ORIGIN-relative RUNPATH finds. Base-image env vars and labels (NCCL_VERSION...) are kept apart
as `declared_by_base`: they describe the base as it was built, not what later layers installed.
The loader-chosen libraries are read in `libraries`, the env and labels in `imageenv`.

Where each version is read:

| component     | evidence, in order of preference                                                    |
|---------------|-------------------------------------------------------------------------------------|
| ngc-release   | env NVIDIA_PYTORCH_VERSION (the NGC container release, e.g. 26.08)                   |
| cuda          | /usr/local/cuda/version.json, version.txt, cuda.h CUDA_VERSION (major.minor); the     |
|               | nvidia-cuda-runtime wheel's METADATA (conda's cuda-cudart record) when torch loads   |
|               | its libcudart (`wheels`)                                                              |
| nccl          | libnccl.so.2 the loader finds (real file name libnccl.so.2.X.Y), the nvidia-nccl     |
|               | wheel's METADATA (conda's nccl record) for its copy, nccl.h defines                   |
| cudnn         | cudnn_version.h defines, libcudnn.so.X.Y.Z file names; with an nvidia-cudnn wheel,    |
|               | or conda's cudnn, the copy torch loads decides (the wheel's METADATA, conda-meta)     |
| cublas        | cublas_api.h CUBLAS_VER_* defines, libcublas.so.X.Y.Z file names; with an nvidia-cublas|
|               | wheel or conda's libcublas, the copy torch loads decides                               |
| pytorch       | torch/version.py in the Python site directories (first on sys.path wins)              |
| triton        | triton-*.dist-info (or pytorch_triton-*) METADATA (first on sys.path wins)             |
| libfabric     | the libfabric.so.1 the loader finds: pkgconfig/libfabric.pc beside it (for the file   |
|               | libfabric.so points to), the dpkg package owning it, or "libfabric: X.Y.Z" inside it   |
| aws-ofi-nccl  | the plugin NCCL loads (NCCL_NET_PLUGIN): "aws-ofi-nccl X.Y.Z" inside it, or its dpkg  |
|               | package owning the file (libnccl-ofi, libnccl-ofi-ngc-v2/-v3)                          |
| efa-installer | /opt/amazon/efa_installed_packages: "# EFA installer version:" and the package list  |
| openmpi       | each installation's include/mpi.h, lib/pkgconfig/ompi.pc, or "Open MPI X.Y.Z" in libmpi;|
|               | Debian's (libmpi.so.40 in the triplet directory): its -dev mpi.h or ompi.pc, the dpkg |
|               | package owning libmpi, or the release libmpi keeps for ompi_info                      |
| deepep        | deep_ep-*.dist-info: Version; commit from direct_url.json vcs_info.commit_id, else    |
|               | the .git/HEAD of the source directory pip recorded (`url: file://...`)                |
| machine       | the layer's platform; else the ELF headers (e_machine) of the programs, libraries and  |
|               | plugins read (`libraries.machine_files`): most of them decide                         |

Libraries and headers are looked for in every supported triplet's directories (x86_64-linux-gnu,
aarch64-linux-gnu), the image's machine first; the loader's own default directories are its
machine's only, and a library of another machine on the path is passed over, as ld.so does.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping

import attrs

from efabuild.provenance import dpkg, elf, ldpath, openmpi
from efabuild.provenance.fsread import defines, dist_info_dirs, metadata_version, site_dirs
from efabuild.provenance.fsview import FsView
from efabuild.provenance.imageenv import (
    ENVIRONMENT_FILE,
    RC_FILE,
    declared_by_base,
    efa_relevant,
    env_dict,
    parse_environment,
    parse_rc_labels,
    shown_value,
)
from efabuild.provenance.libraries import (
    PROGRAMS, aws_ofi_nccl, cublas, cublas_headers, cuda_runtime, cudnn, cudnn_headers, libfabric, machine_files,
    nccl, nccl_headers,
)
from efabuild.provenance.measured import Component, Copy, Measured, MpiInstall

EFA_PACKAGES_FILE = "/opt/amazon/efa_installed_packages"
CUDA_HOME = "/usr/local/cuda"
_RELEVANT_PACKAGE_PREFIXES = (
    "libfabric", "libnccl", "efa", "openmpi", "libcudnn", "rdma-core", "ibverbs", "libibverbs",
)
_FULL_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def probe_tree(
    fs: FsView,
    image_env: Mapping[str, str] | Iterable[str] | None = None,
    image_labels: Mapping[str, str] | None = None,
    platform: str | None = None,
) -> Measured:
    """Measure an image. `image_env` is the image config's Env (dict or "K=V" list); without it
    the env is read from /etc/environment as Enroot wrote it. Labels likewise from /etc/rc.
    `platform` ("linux/arm64", or the config's architecture "arm64") is the machine whose
    directories are searched first; without it the ELF headers of the files found decide."""
    if image_env is not None:
        env, env_source = env_dict(image_env), "image config"
    else:
        text = fs.read_text(ENVIRONMENT_FILE)
        env, env_source = (parse_environment(text), ENVIRONMENT_FILE) if text is not None else ({}, None)
    labels = dict(image_labels) if image_labels is not None else parse_rc_labels(fs.read_text(RC_FILE) or "")

    packages = dpkg.installed_packages(fs)
    sites = site_dirs(fs)
    given = elf.machine_of_platform(platform)
    # without the platform: the ELF headers of the files found decide, searched first as the
    # image's programs (/bin/sh, the loader...) say, else as on x86_64; libraries of another
    # machine found there are measured again under their own
    machine = given or _programs_machine(fs) or "x86_64"
    search, libraries, machines = _libraries(fs, env, packages, sites, machine)
    if given is None:
        found = _majority(machines)
        if found in elf.SUPPORTED and found != machine:
            machine = found
            search, libraries, machines = _libraries(fs, env, packages, sites, machine)
        machine = _majority(machines)
    components = _components(fs, env, search, sites, libraries, machine)
    return Measured(
        components=components,
        openmpi=openmpi.installations(fs, machine, packages),
        env=tuple(sorted((k, shown_value(k, v)) for k, v in env.items() if efa_relevant(k))),
        env_source=env_source,
        declared_by_base=declared_by_base(env, labels),
        library_path=search,
        packages=tuple(
            sorted((p.name, p.version) for p in packages.values() if p.name.startswith(_RELEVANT_PACKAGE_PREFIXES))
        ),
        machine=machine,
        machine_source=(f"platform {platform}" if given else "ELF headers") if machine else None,
        elf=tuple(sorted(machines.items())),
    )


def _components(fs: FsView, env: dict[str, str], search: tuple, sites: list[str], libraries: tuple,
                machine: str | None) -> tuple[Component, ...]:
    """Every component in display order; an unknown one names where the probe looked."""
    nccl_, cudnn_, libfabric_, ofi = libraries
    components = (
        _ngc_release(env),
        cuda_runtime(fs, search, sites, _cuda(fs), machine),
        nccl_,
        cudnn_,
        cublas(fs, search, machine, sites),
        _pytorch(fs, sites),
        _python_package(fs, sites, "triton", ("triton-*.dist-info", "pytorch_triton-*.dist-info")),
        libfabric_,
        ofi,
        _efa_installer(fs),
        _deepep(fs, sites),
    )
    return tuple(c if c.version is not None else attrs.evolve(c, looked_at=looked_at(c, sites, machine))
                 for c in components)


def _libraries(fs: FsView, env: dict[str, str], packages: dict, sites: list[str], machine: str):  # noqa: ANN202
    """The loader's search order on `machine`, the libraries it finds and the machine of each
    file that decides whether the image runs (path -> machine; files that are not ELF left out)."""
    search = ldpath.search_path(fs, env, machine)
    found = (nccl(fs, search, sites, machine), cudnn(fs, search, machine, sites),
             libfabric(fs, search, packages, machine), aws_ofi_nccl(fs, search, env, packages, machine))
    files = machine_files(fs, search, env, (found[0], found[2], found[3]), machine)
    heads = fs.read_heads(files, elf.HEAD_BYTES)
    machines = {path: m for path in files if (m := elf.machine(heads.get(path, b""))) is not None}
    return search, found, machines


def looked_at(component: Component, sites: list[str], machine: str | None) -> tuple[str, ...]:
    """Where the probe looked for a component whose version it could not read (pure): the copies
    it found first, then the files and names it reads the version from."""
    def wheel(pattern: str) -> list[str]:
        return [f"{site}/{pattern}/METADATA" for site in sites]

    copies = [c.path for c in component.copies if c.version is None]
    places = {
        "ngc-release": ["env:NVIDIA_PYTORCH_VERSION"],
        "cuda": [f"{CUDA_HOME}/version.json", f"{CUDA_HOME}/version.txt", f"{CUDA_HOME}/include/cuda.h",
                 *wheel("nvidia_cuda_runtime*.dist-info")],
        "nccl": ["libnccl.so.2.X.Y on the loader's path", *nccl_headers(machine), *wheel("nvidia_nccl_cu*.dist-info")],
        "cudnn": [*cudnn_headers(machine), "libcudnn.so.X.Y.Z on the loader's path",
                  *wheel("nvidia_cudnn_cu*.dist-info")],
        "cublas": [*cublas_headers(machine), "libcublas.so.X.Y.Z on the loader's path",
                   *wheel("nvidia_cublas*.dist-info")],
        "pytorch": [f"{site}/torch/version.py" for site in sites] or ["torch/version.py in no Python site directory"],
        "triton": [*wheel("triton-*.dist-info"), *wheel("pytorch_triton-*.dist-info")],
        "libfabric": ["libfabric.so.1 on the loader's path: pkgconfig/libfabric.pc beside it, the dpkg package "
                      "owning it, a release string in it"],
        "aws-ofi-nccl": ["the plugin NCCL_NET_PLUGIN names on the loader's path: a release string in it, the dpkg "
                         "package owning it"],
        "efa-installer": [EFA_PACKAGES_FILE],
        "deepep": wheel("deep_ep-*.dist-info"),
    }.get(component.name, [])
    return tuple(copies + places)


def _programs_machine(fs: FsView) -> str | None:
    heads = fs.read_heads(PROGRAMS, elf.HEAD_BYTES)
    found = _majority({path: m for path, head in heads.items() if (m := elf.machine(head)) is not None})
    return found if found in elf.SUPPORTED else None


def _majority(machines: Mapping[str, str]) -> str | None:
    """The machine most of the files are built for (x86_64 on a tie, then by name)."""
    counts = Counter(machines.values())
    if not counts:
        return None
    return min(counts, key=lambda m: (-counts[m], m != "x86_64", m))


# ---- components read from their own files ----------------------------------------------------
def _ngc_release(env: dict[str, str]) -> Component:
    if env.get("NVIDIA_PYTORCH_VERSION"):
        return Component("ngc-release", env["NVIDIA_PYTORCH_VERSION"], "env:NVIDIA_PYTORCH_VERSION")
    return Component("ngc-release")


def _cuda(fs: FsView) -> Component:
    path = f"{CUDA_HOME}/version.json"
    text = fs.read_text(path)
    if text is not None:
        try:
            version = json.loads(text).get("cuda", {}).get("version")
        except (ValueError, AttributeError, RecursionError):  # the image's file: any shape, any depth
            version = None
        if isinstance(version, str):
            return Component("cuda", version, path)
    path = f"{CUDA_HOME}/version.txt"
    text = fs.read_text(path)
    if text is not None:
        match = re.search(r"CUDA Version (\d+(?:\.\d+)+)", text)
        if match:
            return Component("cuda", match.group(1), path)
    path = f"{CUDA_HOME}/include/cuda.h"
    text = fs.read_text(path)
    if text is not None:
        value = defines(text, ["CUDA_VERSION"]).get("CUDA_VERSION", "")
        if value.isdigit():
            number = int(value)
            return Component("cuda", f"{number // 1000}.{number % 1000 // 10}", path)
    return Component("cuda")


def _pytorch(fs: FsView, sites: list[str]) -> Component:
    copies = []
    for site in sites:
        path = f"{site}/torch/version.py"
        text = fs.read_text(path)
        if text is None:
            continue
        match = re.search(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", text, re.MULTILINE)
        copies.append(Copy(path, match.group(1) if match else None, path))
    first = copies[0] if copies else None  # the first site directory on sys.path wins
    return Component(
        "pytorch",
        first.version if first else None,
        first.source if first else None,
        copies=tuple(copies) if len(copies) > 1 else (),
    )


def _python_package(fs: FsView, sites: list[str], name: str, patterns: tuple[str, ...]) -> Component:
    """A Python package's version from its dist-info's METADATA: the first site directory on
    sys.path that holds one wins."""
    for site in sites:
        for pattern in patterns:
            for info in dist_info_dirs(fs, [site], pattern):
                version = metadata_version(fs, info)
                if version is not None:
                    return Component(name, version, f"{info}/METADATA")
    return Component(name)


def _efa_installer(fs: FsView) -> Component:
    text = fs.read_text(EFA_PACKAGES_FILE)
    if text is None:
        return Component("efa-installer")
    match = re.search(r"^#\s*EFA installer version:\s*(\S+)", text, re.MULTILINE)
    package_list = tuple(
        token for line in text.splitlines() if not line.lstrip().startswith("#") for token in line.split()
    )
    return Component(
        "efa-installer", match.group(1) if match else None, EFA_PACKAGES_FILE if match else None,
        packages=package_list,
    )


def _deepep(fs: FsView, sites: list[str]) -> Component:
    infos = dist_info_dirs(fs, sites, "deep_ep-*.dist-info")
    if not infos:
        return Component("deepep")
    info = infos[0]
    version = metadata_version(fs, info)
    commit, commit_source = _deepep_commit(fs, info)
    return Component("deepep", version, f"{info}/METADATA" if version else None,
                     commit=commit, commit_source=commit_source)


def _deepep_commit(fs: FsView, dist_info: str) -> tuple[str | None, str | None]:
    path = f"{dist_info}/direct_url.json"
    text = fs.read_text(path)
    if text is None:
        return None, None
    try:
        direct_url = json.loads(text)
    except (ValueError, RecursionError):  # the image's file: any depth
        return None, None
    if not isinstance(direct_url, dict):
        return None, None
    vcs_info = direct_url.get("vcs_info")
    commit = vcs_info.get("commit_id") if isinstance(vcs_info, dict) else None
    if isinstance(commit, str) and _FULL_COMMIT.match(commit):
        return commit, f"{path} (vcs_info.commit_id)"
    url = direct_url.get("url", "")
    if isinstance(url, str) and url.startswith("file://"):
        return _git_head(fs, url[len("file://") :])
    return None, None


def _git_head(fs: FsView, checkout: str) -> tuple[str | None, str | None]:
    """The commit a source checkout was at: a detached HEAD, or the branch it names."""
    head_path = f"{checkout.rstrip('/')}/.git/HEAD"
    head = (fs.read_text(head_path) or "").strip()
    if _FULL_COMMIT.match(head):
        return head, head_path
    if head.startswith("ref: "):
        ref = head[5:].strip()
        ref_path = f"{checkout.rstrip('/')}/.git/{ref}"
        value = (fs.read_text(ref_path) or "").strip()
        if _FULL_COMMIT.match(value):
            return value, ref_path
        packed = f"{checkout.rstrip('/')}/.git/packed-refs"
        for line in (fs.read_text(packed) or "").splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] == ref and _FULL_COMMIT.match(parts[0]):
                return parts[0], packed
    return None, None
