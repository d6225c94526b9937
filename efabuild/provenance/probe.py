"""Measure the versions inside an image from its files: no GPU, no container start.

`probe_tree(fs, image_env)` reads an `FsView` (a directory or a .sqsh) and returns `Measured`.
Where a library can exist in several copies (NCCL, libfabric, aws-ofi-nccl), every copy is listed
with its path, and the reported version is the one the dynamic loader picks given the image's
LD_LIBRARY_PATH and ld.so.conf. Base-image env vars and labels (NCCL_VERSION...) are kept apart
as `declared_by_base`: they describe the base as it was built, not what later layers installed.

Where each version is read:

| component     | evidence, in order of preference                                                    |
|---------------|-------------------------------------------------------------------------------------|
| ngc-release   | env NVIDIA_PYTORCH_VERSION (the NGC container release, e.g. 26.08)                   |
| cuda          | /usr/local/cuda/version.json, version.txt, cuda.h CUDA_VERSION (major.minor)          |
| nccl          | libnccl.so.2 the loader finds (real file name libnccl.so.2.X.Y), nccl.h defines       |
| cudnn         | cudnn_version.h defines, libcudnn.so.X.Y.Z file names                                 |
| pytorch       | torch/version.py in the Python site directories (first on sys.path wins)              |
| libfabric     | the libfabric.so.1 the loader finds: pkgconfig/libfabric.pc beside it (for the file   |
|               | libfabric.so points to), the dpkg package owning it, or "libfabric: X.Y.Z" inside it   |
| aws-ofi-nccl  | the plugin NCCL loads (NCCL_NET_PLUGIN): "aws-ofi-nccl X.Y.Z" inside it, or its dpkg  |
|               | package owning the file (libnccl-ofi, libnccl-ofi-ngc-v2/-v3)                          |
| efa-installer | /opt/amazon/efa_installed_packages: "# EFA installer version:" and the package list  |
| openmpi       | each installation's include/mpi.h, lib/pkgconfig/ompi.pc, or "Open MPI X.Y.Z" in libmpi |
| deepep        | deep_ep-*.dist-info: Version; commit from direct_url.json vcs_info.commit_id, else    |
|               | the .git/HEAD of the source directory pip recorded (`url: file://...`)                |
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterable, Mapping

from efabuild.provenance import dpkg, ldpath, versions
from efabuild.provenance.fsview import FsView
from efabuild.provenance.measured import (
    Component,
    Copy,
    Declared,
    Hit,
    LibDir,
    Measured,
    MpiInstall,
)

EFA_PACKAGES_FILE = "/opt/amazon/efa_installed_packages"
ENVIRONMENT_FILE = "/etc/environment"  # Enroot writes the image config's Env here
RC_FILE = "/etc/rc"  # Enroot writes the image config's labels here as "# key value" comments

# Env vars that steer NCCL and libfabric onto (or off) EFA.
_ENV_PREFIXES = ("NCCL_", "FI_", "RDMAV_")
_ENV_NAMES = ("LD_LIBRARY_PATH", "LD_PRELOAD", "OPAL_PREFIX")
# Env vars and labels by which NGC images declare what they were built with.
DECLARING_ENV = (
    "NVIDIA_PYTORCH_VERSION",
    "PYTORCH_VERSION",
    "PYTORCH_BUILD_VERSION",
    "CUDA_VERSION",
    "CUDA_DRIVER_VERSION",
    "NCCL_VERSION",
    "CUDNN_VERSION",
    "OPENMPI_VERSION",
    "NVIDIA_BUILD_ID",
)
DECLARING_LABEL_PREFIX = "com.nvidia."
_SECRET_WORDS = ("SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "ACCESS_KEY", "PRIVATE")

SITE_DIRS = (
    "/usr/local/lib/python3*/dist-packages",
    "/usr/local/lib/python3*/site-packages",
    "/usr/lib/python3/dist-packages",
    "/usr/lib/python3*/site-packages",
    "/opt/conda/lib/python3*/site-packages",
)
CUDA_HOME = "/usr/local/cuda"
NCCL_HEADERS = ("/usr/include/nccl.h", "/usr/include/x86_64-linux-gnu/nccl.h", "/usr/local/cuda/include/nccl.h")
CUDNN_HEADERS = (
    "/usr/include/cudnn_version.h",
    "/usr/include/x86_64-linux-gnu/cudnn_version.h",
    "/usr/local/cuda/include/cudnn_version.h",
)
# Where libraries live besides the loader's search path (so copies off the path are seen too).
EXTRA_LIB_DIRS = (
    "/opt/amazon/efa/lib",
    "/opt/amazon/efa/lib64",
    "/opt/amazon/ofi-nccl/lib",
    "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu",
    "/opt/amazon/aws-ofi-nccl/lib",
    "/opt/aws-ofi-nccl/lib",
    "/usr/local/lib",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/local/cuda/lib64",
)
OPENMPI_PLACES = (
    "/usr/local/mpi",
    "/opt/amazon/openmpi*",
    "/opt/hpcx/ompi*",
    "/usr/lib/x86_64-linux-gnu/openmpi",
)
OFI_PACKAGES = ("libnccl-ofi-ngc-v3", "libnccl-ofi-ngc-v2", "libnccl-ofi")
LIBFABRIC_PACKAGES = ("libfabric1-aws", "libfabric-aws", "libfabric1")
_RELEVANT_PACKAGE_PREFIXES = (
    "libfabric", "libnccl", "efa", "openmpi", "libcudnn", "rdma-core", "ibverbs", "libibverbs",
)
_MAX_PLUGIN_BYTES = 256 << 20

_LIBFABRIC_VERSION = re.compile(rb"libfabric:? v?(\d+\.\d+\.\d+)")  # as `fi_info --version` prints it
_OMPI_VERSION = re.compile(rb"Open MPI v?(\d+\.\d+\.\d+)")
_MAX_LIB_SCAN = 64 << 20
_OFI_VERSION = re.compile(rb"aws-ofi-nccl ((?:\d+\.\d+(?:\.\d+)*|git-[0-9a-f]{6,40})[A-Za-z0-9.+_-]*)")
_NCCL_FILE = re.compile(r"^libnccl\.so\.(\d+\.\d+\.\d+)$")
_CUDNN_FILE = re.compile(r"^libcudnn\.so\.(\d+\.\d+\.\d+)$")
_FULL_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def probe_tree(
    fs: FsView,
    image_env: Mapping[str, str] | Iterable[str] | None = None,
    image_labels: Mapping[str, str] | None = None,
) -> Measured:
    """Measure an image. `image_env` is the image config's Env (dict or "K=V" list); without it
    the env is read from /etc/environment as Enroot wrote it. Labels likewise from /etc/rc."""
    if image_env is not None:
        env, env_source = env_dict(image_env), "image config"
    else:
        text = fs.read_text(ENVIRONMENT_FILE)
        env, env_source = (parse_environment(text), ENVIRONMENT_FILE) if text is not None else ({}, None)
    labels = dict(image_labels) if image_labels is not None else parse_rc_labels(fs.read_text(RC_FILE) or "")

    search = ldpath.search_path(fs, env)
    packages = dpkg.installed_packages(fs)
    sites = _site_dirs(fs)
    components = (
        _ngc_release(env),
        _cuda(fs),
        _nccl(fs, search, sites),
        _cudnn(fs, search),
        _pytorch(fs, sites),
        _libfabric(fs, search, packages),
        _aws_ofi_nccl(fs, search, env, packages),
        _efa_installer(fs),
        _deepep(fs, sites),
    )
    return Measured(
        components=components,
        openmpi=_openmpi(fs),
        env=tuple(sorted((k, _redact(k, v)) for k, v in env.items() if _efa_relevant(k))),
        env_source=env_source,
        declared_by_base=_declared(env, labels),
        library_path=search,
        packages=tuple(
            sorted((p.name, p.version) for p in packages.values() if p.name.startswith(_RELEVANT_PACKAGE_PREFIXES))
        ),
    )


# ---- environment and labels ------------------------------------------------------------------
def env_dict(image_env: Mapping[str, str] | Iterable[str]) -> dict[str, str]:
    if isinstance(image_env, Mapping):
        return {str(k): str(v) for k, v in image_env.items()}
    out = {}
    for item in image_env:
        name, sep, value = str(item).partition("=")
        if sep:
            out[name] = value
    return out


def parse_environment(text: str) -> dict[str, str]:
    """/etc/environment (pam_env style): NAME=value lines, a value may be wrapped in quotes."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        name, _, value = line.partition("=")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[name.strip()] = value
    return out


def parse_rc_labels(text: str) -> dict[str, str]:
    """Labels from the comment block Enroot writes at the top of /etc/rc ("# key value")."""
    labels = {}
    for line in text.splitlines():
        if not line.startswith("# "):
            break
        key, _, value = line[2:].partition(" ")
        if key:
            labels[key] = value
    return labels


def _efa_relevant(name: str) -> bool:
    return name in _ENV_NAMES or (name.startswith(_ENV_PREFIXES) and name not in DECLARING_ENV)


def _redact(name: str, value: str) -> str:
    return "<redacted>" if any(word in name.upper() for word in _SECRET_WORDS) else value


def _declared(env: dict[str, str], labels: dict[str, str]) -> tuple[Declared, ...]:
    found = [Declared(name, env[name], f"env:{name}") for name in DECLARING_ENV if name in env]
    found += [
        Declared(key, value, f"label:{key}")
        for key, value in sorted(labels.items())
        if key.startswith(DECLARING_LABEL_PREFIX) and key.endswith("version")
    ]
    return tuple(sorted(found, key=lambda d: d.name))


# ---- small readers ---------------------------------------------------------------------------
def _defines(text: str, names: Iterable[str]) -> dict[str, str]:
    out = {}
    for name in names:
        match = re.search(rf"^\s*#\s*define\s+{name}\s+(\S+)", text, re.MULTILINE)
        if match:
            out[name] = match.group(1).strip('"')
    return out


def _first_existing(fs: FsView, paths: Iterable[str]) -> str | None:
    for path in paths:
        if fs.is_file(path):
            return path
    return None


def _site_dirs(fs: FsView) -> list[str]:
    found = []
    for pattern in SITE_DIRS:
        for path in fs.glob(pattern):
            if fs.is_dir(path) and path not in found:
                found.append(path)
    return found


def _dist_info(fs: FsView, sites: list[str], pattern: str) -> list[str]:
    return [path for site in sites for path in fs.glob(f"{site}/{pattern}") if fs.is_dir(path)]


def _metadata_version(fs: FsView, dist_info: str) -> str | None:
    text = fs.read_text(f"{dist_info}/METADATA")
    if text is None:
        return None
    for line in text.splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
        if not line.strip():
            break
    return None


def _library_copies(
    fs: FsView, search: tuple[LibDir, ...], pattern: str, extra_dirs: Iterable[str] = EXTRA_LIB_DIRS
) -> list[str]:
    """Real paths of the files matching `pattern` in the searched and the usual directories."""
    seen: list[str] = []
    for directory in [d.dir for d in search] + list(extra_dirs):
        for path in fs.glob(f"{directory}/{pattern}"):
            real = fs.resolve(path)
            if real is not None and fs.is_file(real) and real not in seen:
                seen.append(real)
    return seen


def _owner_versions(fs: FsView, packages: dict[str, dpkg.Package], names: Iterable[str]) -> dict[str, dpkg.Package]:
    """file path -> owning package, for the given packages that are installed."""
    owners: dict[str, dpkg.Package] = {}
    for name in names:
        package = packages.get(name)
        if package is not None:
            for path in dpkg.owned_files(fs, package):
                owners.setdefault(path, package)
    return owners


def _dpkg_source(package: dpkg.Package) -> str:
    return f"{dpkg.STATUS_FILE} ({package.name} {package.version})"


def _on_path(fs: FsView, search: tuple[LibDir, ...], name: str, copies: list[Copy]) -> tuple[Hit, ...]:
    versions_by_path = {c.path: c.version for c in copies}
    hits = []
    for path in ldpath.find_all(fs, search, name):
        real = fs.resolve(path) or path
        hits.append(Hit(path, real, versions_by_path.get(real)))
    return tuple(hits)


def _effective(copies: list[Copy], loads: str | None, fs: FsView) -> tuple[str | None, str | None]:
    """Version and source of the copy the loader picks; else the only version all copies agree on."""
    if loads is not None:
        real = fs.resolve(loads)
        for copy in copies:
            if copy.path == real and copy.version is not None:
                return copy.version, copy.source
    known = {c.version for c in copies if c.version is not None}
    if len(known) == 1 and loads is None:
        only = next(c for c in copies if c.version is not None)
        return only.version, only.source
    return None, None


# ---- components ------------------------------------------------------------------------------
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
        except (ValueError, AttributeError):
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
        value = _defines(text, ["CUDA_VERSION"]).get("CUDA_VERSION", "")
        if value.isdigit():
            number = int(value)
            return Component("cuda", f"{number // 1000}.{number % 1000 // 10}", path)
    return Component("cuda")


def _nccl(fs: FsView, search: tuple[LibDir, ...], sites: list[str]) -> Component:
    copies = []
    for real in _library_copies(fs, search, "libnccl.so*"):
        match = _NCCL_FILE.match(posixpath.basename(real))
        if match:
            copies.append(Copy(real, match.group(1), real))
    # NCCL from a pip wheel (nvidia-nccl-cu*): its version is in the wheel's metadata
    for dist_info in _dist_info(fs, sites, "nvidia_nccl_cu*.dist-info"):
        lib = fs.resolve(f"{posixpath.dirname(dist_info)}/nvidia/nccl/lib/libnccl.so.2")
        if lib is not None and all(c.path != lib for c in copies):
            copies.append(Copy(lib, _metadata_version(fs, dist_info), f"{dist_info}/METADATA"))
    header = _first_existing(fs, NCCL_HEADERS)
    header_version = None
    if header is not None:
        found = _defines(fs.read_text(header) or "", ["NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH", "NCCL_SUFFIX"])
        if all(found.get(k, "").isdigit() for k in ("NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH")):
            header_version = f"{found['NCCL_MAJOR']}.{found['NCCL_MINOR']}.{found['NCCL_PATCH']}"
            header_version += found.get("NCCL_SUFFIX", "")
    loads = ldpath.find_library(fs, search, "libnccl.so.2")
    version, source = _effective(copies, loads, fs)
    if version is None and header_version is not None:
        version, source = header_version, header
    return Component("nccl", version, source, loads, tuple(copies), _on_path(fs, search, "libnccl.so.2", copies))


def _cudnn(fs: FsView, search: tuple[LibDir, ...]) -> Component:
    header = _first_existing(fs, CUDNN_HEADERS)
    if header is not None:
        found = _defines(fs.read_text(header) or "", ["CUDNN_MAJOR", "CUDNN_MINOR", "CUDNN_PATCHLEVEL"])
        if all(v.isdigit() for v in found.values()) and len(found) == 3:
            return Component(
                "cudnn", f"{found['CUDNN_MAJOR']}.{found['CUDNN_MINOR']}.{found['CUDNN_PATCHLEVEL']}", header
            )
    for real in _library_copies(fs, search, "libcudnn.so.*"):
        match = _CUDNN_FILE.match(posixpath.basename(real))
        if match:
            return Component("cudnn", match.group(1), real)
    return Component("cudnn")


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


def _libfabric(fs: FsView, search: tuple[LibDir, ...], packages: dict[str, dpkg.Package]) -> Component:
    owners = _owner_versions(fs, packages, LIBFABRIC_PACKAGES)
    copies = []
    for real in _library_copies(fs, search, "libfabric.so.1*"):
        version, source = _libfabric_version(fs, real, owners)
        copies.append(Copy(real, version, source))
    loads = ldpath.find_library(fs, search, "libfabric.so.1")
    # no fallback to the package database alone: a package whose files are gone is not installed
    version, source = _effective(copies, loads, fs)
    return Component("libfabric", version, source, loads, tuple(copies), _on_path(fs, search, "libfabric.so.1", copies))


def _libfabric_version(fs: FsView, real: str, owners: dict[str, dpkg.Package]) -> tuple[str | None, str | None]:
    """A libfabric file's release: its pkgconfig file when it is the one that file describes,
    else the dpkg package owning it, else the version string inside it."""
    directory = posixpath.dirname(real)
    pc = f"{directory}/pkgconfig/libfabric.pc"
    pc_text = fs.read_text(pc) or ""
    match = re.search(r"^Version:\s*(\S+)", pc_text, re.MULTILINE)
    libdir = re.search(r"^libdir=(\S+)", pc_text, re.MULTILINE)
    # a .pc beside several libfabric files describes the one `libfabric.so` (the dev link) points to
    described = fs.resolve(f"{directory}/libfabric.so") or fs.resolve(f"{directory}/libfabric.so.1")
    if match and described == real and (libdir is None or "$" in libdir.group(1) or libdir.group(1) == directory):
        return versions.upstream(match.group(1)), pc
    if real in owners:
        return versions.upstream(owners[real].version), _dpkg_source(owners[real])
    found = _LIBFABRIC_VERSION.search(fs.read_bytes(real, max_size=_MAX_LIB_SCAN) or b"")
    if found:
        return found.group(1).decode(), real
    return None, None


def plugin_file_name(env: dict[str, str]) -> str:
    """The library NCCL opens as its network plugin, per NCCL_NET_PLUGIN."""
    plugin = env.get("NCCL_NET_PLUGIN", "")
    if not plugin:
        return "libnccl-net.so"
    if "/" in plugin or plugin.endswith(".so"):
        return plugin
    return f"libnccl-net-{plugin}.so"


def _aws_ofi_nccl(
    fs: FsView, search: tuple[LibDir, ...], env: dict[str, str], packages: dict[str, dpkg.Package]
) -> Component:
    owners = _owner_versions(fs, packages, OFI_PACKAGES)
    candidates = _library_copies(fs, search, "libnccl-net*.so")
    contents = fs.read_many(candidates, max_size=_MAX_PLUGIN_BYTES)
    copies = []
    for real in candidates:
        match = _OFI_VERSION.search(contents.get(real, b""))
        if match:
            copies.append(Copy(real, match.group(1).decode(), real))
        elif real in owners:
            copies.append(Copy(real, versions.upstream(owners[real].version), _dpkg_source(owners[real])))
        elif posixpath.basename(real) == "libnccl-net-ofi.so":
            copies.append(Copy(real, None, None))
    plugin = ldpath.find_library(fs, search, plugin_file_name(env))
    is_ofi = plugin is not None and any(c.path == fs.resolve(plugin) for c in copies)
    loads = plugin if is_ofi else None
    version, source = _effective(copies, loads, fs)
    hits = _on_path(fs, search, "libnccl-net-ofi.so", copies)
    return Component("aws-ofi-nccl", version, source, loads, tuple(copies), hits)


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
    infos = _dist_info(fs, sites, "deep_ep-*.dist-info")
    if not infos:
        return Component("deepep")
    info = infos[0]
    version = _metadata_version(fs, info)
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
    except ValueError:
        return None, None
    commit = (direct_url.get("vcs_info") or {}).get("commit_id")
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


def _openmpi(fs: FsView) -> tuple[MpiInstall, ...]:
    found: list[MpiInstall] = []
    for pattern in OPENMPI_PLACES:
        for path in fs.glob(pattern):
            real = fs.resolve(path)
            if real is None or not fs.is_dir(real) or any(m.real_path == real for m in found):
                continue
            if not (fs.exists(f"{real}/include/mpi.h") or fs.glob(f"{real}/lib/libmpi.so*")
                    or fs.exists(f"{real}/bin/mpirun")):
                continue
            version, source = _openmpi_version(fs, real)
            found.append(MpiInstall(path, real, version, source))
    return tuple(found)


def _openmpi_version(fs: FsView, root: str) -> tuple[str | None, str | None]:
    header = f"{root}/include/mpi.h"
    found = _defines(fs.read_text(header) or "", ["OMPI_MAJOR_VERSION", "OMPI_MINOR_VERSION", "OMPI_RELEASE_VERSION"])
    if len(found) == 3 and all(v.isdigit() for v in found.values()):
        return f"{found['OMPI_MAJOR_VERSION']}.{found['OMPI_MINOR_VERSION']}.{found['OMPI_RELEASE_VERSION']}", header
    pc = f"{root}/lib/pkgconfig/ompi.pc"
    match = re.search(r"^Version:\s*(\S+)", fs.read_text(pc) or "", re.MULTILINE)
    if match:
        return match.group(1), pc
    for lib in fs.glob(f"{root}/lib/libmpi.so.*"):
        found = _OMPI_VERSION.search(fs.read_bytes(lib, max_size=_MAX_LIB_SCAN) or b"")
        if found:
            return found.group(1).decode(), lib
    return None, None
