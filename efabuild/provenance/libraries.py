"""The libraries the dynamic loader chooses among: NCCL, cuDNN, libfabric and the aws-ofi-nccl
plugin. Every copy is listed with its version and where that was read; the reported version is
the copy the loader picks given the image's LD_LIBRARY_PATH and ld.so.conf."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Iterator

from efabuild.provenance import dpkg, elf, ldpath, versions, wheels
from efabuild.provenance.fsread import MAX_LIB_SCAN, defines, dist_info_dirs, first_existing, metadata_version
from efabuild.provenance.fsview import FsView, grouped
from efabuild.provenance.measured import Component, Copy, Hit, LibDir


def nccl_headers(machine: str | None = None) -> tuple[str, ...]:
    return ("/usr/include/nccl.h", *(f"/usr/include/{t}/nccl.h" for t in elf.triplets_for(machine)),
            "/usr/local/cuda/include/nccl.h")


def cudnn_headers(machine: str | None = None) -> tuple[str, ...]:
    return ("/usr/include/cudnn_version.h", *(f"/usr/include/{t}/cudnn_version.h" for t in elf.triplets_for(machine)),
            "/usr/local/cuda/include/cudnn_version.h")


def cublas_headers(machine: str | None = None) -> tuple[str, ...]:
    return ("/usr/local/cuda/include/cublas_api.h", "/usr/include/cublas_api.h",
            *(f"/usr/include/{t}/cublas_api.h" for t in elf.triplets_for(machine)))


def extra_lib_dirs(machine: str | None = None) -> tuple[str, ...]:
    """Where libraries live besides the loader's search path (so copies off the path are seen too),
    for every triplet, the image's own first: newer EFA installers put aws-ofi-nccl in
    /opt/amazon/ofi-nccl/lib/<triplet>."""
    triplets = elf.triplets_for(machine)
    return (
        "/opt/amazon/efa/lib",
        "/opt/amazon/efa/lib64",
        "/opt/amazon/ofi-nccl/lib",
        *(f"/opt/amazon/ofi-nccl/lib/{t}" for t in triplets),
        "/opt/amazon/aws-ofi-nccl/lib",
        "/opt/aws-ofi-nccl/lib",
        "/usr/local/lib",
        *(f"/usr/lib/{t}" for t in triplets),
        "/usr/local/cuda/lib64",
    )


CUDA_HOME = "/usr/local/cuda"
NCCL_HEADERS = nccl_headers()
CUDNN_HEADERS = cudnn_headers()
EXTRA_LIB_DIRS = extra_lib_dirs()
OFI_PACKAGES = ("libnccl-ofi-ngc-v3", "libnccl-ofi-ngc-v2", "libnccl-ofi")
LIBFABRIC_PACKAGES = ("libfabric1-aws", "libfabric-aws", "libfabric1")
_MAX_PLUGIN_BYTES = 256 << 20
# libfabric copies whose bytes are searched for a version string (up to MAX_LIB_SCAN each): an image
# holds one or two; a hostile one with thousands would have the probe read them all at every export
MAX_SCANNED_COPIES = 16
_GROUP_BYTES = 32 << 20  # plugins read by one unsquashfs: the small ones together, a big one alone

_LIBFABRIC_VERSION = re.compile(rb"libfabric:? v?(\d+\.\d+\.\d+)")  # as `fi_info --version` prints it
_OFI_VERSION = re.compile(rb"aws-ofi-nccl ((?:\d+\.\d+(?:\.\d+)*|git-[0-9a-f]{6,40})[A-Za-z0-9.+_-]*)")
_NCCL_FILE = re.compile(r"^libnccl\.so\.(\d+\.\d+\.\d+)$")
_CUDNN_FILE = re.compile(r"^libcudnn\.so\.(\d+\.\d+\.\d+)$")
_CUDNN_SONAME = re.compile(r"^libcudnn\.so\.\d+(?=$|\.)")  # a file's soname: libcudnn.so.9.1.0 -> libcudnn.so.9
_CUBLAS_FILE = re.compile(r"^libcublas\.so\.(\d+\.\d+\.\d+(?:\.\d+)?)$")
_CUBLAS_SONAME = re.compile(r"^libcublas\.so\.\d+(?=$|\.)")
_CUDART_SONAME = re.compile(r"^libcudart\.so\.\d+(?=$|\.)")


def _library_copies(
    fs: FsView, search: tuple[LibDir, ...], pattern: str, extra_dirs: Iterable[str] = EXTRA_LIB_DIRS
) -> list[str]:
    """Real paths of the files matching `pattern` in the searched and the usual directories."""
    seen: dict[str, None] = {}  # ordered, and a set: a directory may hold thousands
    for directory in [d.dir for d in search] + list(extra_dirs):
        for path in fs.glob(f"{directory}/{pattern}"):
            real = fs.resolve(path)
            if real is not None and real not in seen and fs.is_file(real):
                seen[real] = None
    return list(seen)


def _by_size(fs: FsView, paths: list[str], budget: int) -> Iterator[list[str]]:
    """`paths` in groups of at most `budget` bytes together (a bigger file alone), in order."""
    def size(path: str) -> int:
        found = fs.entry(path)
        return found.size if found is not None else 0

    return grouped(paths, size, budget)


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


def _on_path(fs: FsView, search: tuple[LibDir, ...], name: str, copies: list[Copy],
             machine: str | None) -> tuple[Hit, ...]:
    versions_by_path = {c.path: c.version for c in copies}
    hits = []
    for path in ldpath.find_all(fs, search, name, machine):
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


def nccl(fs: FsView, search: tuple[LibDir, ...], sites: list[str], machine: str | None = None) -> Component:
    copies = []
    for real in _library_copies(fs, search, "libnccl.so*", extra_lib_dirs(machine)):
        match = _NCCL_FILE.match(posixpath.basename(real))
        if match:
            copies.append(Copy(real, match.group(1), real))
    # NCCL from a pip wheel (nvidia-nccl-cu*): its version is in the wheel's metadata
    pip = (wheels.library_copies(fs, sites, "nvidia_nccl_cu*.dist-info", "libnccl.so*", "nvidia/nccl/lib")
           + wheels.conda_copies(fs, "nccl", "libnccl.so*"))
    copies += [c for c in pip if all(c.path != other.path for other in copies)]
    header = first_existing(fs, nccl_headers(machine))
    header_version = None
    if header is not None:
        found = defines(fs.read_text(header) or "", ["NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH", "NCCL_SUFFIX"])
        if all(found.get(k, "").isdigit() for k in ("NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH")):
            header_version = f"{found['NCCL_MAJOR']}.{found['NCCL_MINOR']}.{found['NCCL_PATCH']}"
            header_version += found.get("NCCL_SUFFIX", "")
    loads = (wheels.picked(fs, search, sites, pip, "libnccl.so.2", machine) if pip
             else ldpath.find_library(fs, search, "libnccl.so.2", machine))
    version, source = _effective(copies, loads, fs)
    if version is None and header_version is not None:
        version, source = header_version, header
    return Component("nccl", version, source, loads, tuple(copies), _on_path(fs, search, "libnccl.so.2", copies, machine))


def cudnn(fs: FsView, search: tuple[LibDir, ...], machine: str | None = None, sites: list[str] | None = None) -> Component:
    pip = (wheels.library_copies(fs, sites or [], "nvidia_cudnn_cu*.dist-info", "libcudnn.so.*", "nvidia/cudnn/lib")
           + wheels.conda_copies(fs, "cudnn", "libcudnn.so.*"))
    system = _system_cudnn(fs, search, machine)
    return _decided("cudnn", system, pip, _cudnn_file_copies(fs, search, machine), _CUDNN_SONAME, fs, search,
                    sites or [], machine)


def cublas(fs: FsView, search: tuple[LibDir, ...], machine: str | None = None, sites: list[str] | None = None) -> Component:
    """cuBLAS: the toolkit's cublas_api.h or libcublas.so.X.Y.Z, NVIDIA's nvidia-cublas wheel or
    conda's libcublas; the copy torch loads decides."""
    pip = (wheels.library_copies(fs, sites or [], "nvidia_cublas*.dist-info", "libcublas.so.*", "nvidia/cublas/lib")
           + wheels.conda_copies(fs, "libcublas", "libcublas.so.*"))
    files = []
    for real in _library_copies(fs, search, "libcublas.so.*", extra_lib_dirs(machine)):
        match = _CUBLAS_FILE.match(posixpath.basename(real))
        if match:
            files.append(Copy(real, match.group(1), real))
    system = Component("cublas")
    header = first_existing(fs, cublas_headers(machine))
    if header is not None:
        names = ["CUBLAS_VER_MAJOR", "CUBLAS_VER_MINOR", "CUBLAS_VER_PATCH", "CUBLAS_VER_BUILD"]
        found = defines(fs.read_text(header) or "", names)
        parts = [found[n] for n in names if n in found]
        if len(parts) >= 3 and all(p.isdigit() for p in parts) and list(found) == names[: len(parts)]:
            system = Component("cublas", ".".join(parts), header)
    if system.version is None and files:
        system = Component("cublas", files[0].version, files[0].source)
    return _decided("cublas", system, pip, files, _CUBLAS_SONAME, fs, search, sites or [], machine)


def _decided(name: str, system: Component, pip: list[Copy], files: list[Copy], soname: re.Pattern, fs: FsView,
             search: tuple[LibDir, ...], sites: list[str], machine: str | None) -> Component:
    """A library installed by the system (`system`, its file copies `files`) and by pip or conda
    (`pip`): without pip's or conda's, the system's; else the copy torch loads decides."""
    if not pip:
        return system
    copies = pip + [c for c in files if all(c.path != w.path for w in pip)]
    sonames = sorted({m.group(0) for c in pip if (m := soname.match(posixpath.basename(c.path)))})
    loads = wheels.picked(fs, search, sites, pip, sonames[0], machine) if sonames else None
    version, source = _effective(copies, loads, fs)
    if version is None and loads is not None and all(c.path != fs.resolve(loads) for c in pip):
        version, source = system.version, system.source  # the system's copy loads: its header tells
    return Component(name, version, source, loads, tuple(copies))


def _system_cudnn(fs: FsView, search: tuple[LibDir, ...], machine: str | None) -> Component:
    header = first_existing(fs, cudnn_headers(machine))
    if header is not None:
        found = defines(fs.read_text(header) or "", ["CUDNN_MAJOR", "CUDNN_MINOR", "CUDNN_PATCHLEVEL"])
        if all(v.isdigit() for v in found.values()) and len(found) == 3:
            return Component(
                "cudnn", f"{found['CUDNN_MAJOR']}.{found['CUDNN_MINOR']}.{found['CUDNN_PATCHLEVEL']}", header
            )
    for copy in _cudnn_file_copies(fs, search, machine):
        return Component("cudnn", copy.version, copy.source)
    return Component("cudnn")


def _cudnn_file_copies(fs: FsView, search: tuple[LibDir, ...], machine: str | None) -> list[Copy]:
    """The system's cuDNN files named with their release (libcudnn.so.9.14.0)."""
    copies = []
    for real in _library_copies(fs, search, "libcudnn.so.*", extra_lib_dirs(machine)):
        match = _CUDNN_FILE.match(posixpath.basename(real))
        if match:
            copies.append(Copy(real, match.group(1), real))
    return copies


def cuda_runtime(fs: FsView, search: tuple[LibDir, ...], sites: list[str], toolkit: Component,
                 machine: str | None = None) -> Component:
    """CUDA: the toolkit's version (/usr/local/cuda) unless the CUDA runtime torch loads is a pip
    wheel's (nvidia-cuda-runtime-cu12, CUDA 13's nvidia-cuda-runtime), whose version then decides."""
    pip = (wheels.library_copies(fs, sites, "nvidia_cuda_runtime*.dist-info", "libcudart.so.*",
                                 "nvidia/cuda_runtime/lib")
           + wheels.conda_copies(fs, "cuda-cudart", "libcudart.so.*"))
    if not pip:
        return toolkit
    copies = list(pip)
    if toolkit.version is not None:
        copies.append(Copy(fs.resolve(CUDA_HOME) or CUDA_HOME, toolkit.version, toolkit.source))
    sonames = sorted({m.group(0) for c in pip if (m := _CUDART_SONAME.match(posixpath.basename(c.path)))})
    loads = wheels.picked(fs, search, sites, pip, sonames[0], machine) if sonames else None
    version, source = _effective(copies, loads, fs)
    if version is None and loads is not None and all(c.path != fs.resolve(loads) for c in pip):
        version, source = toolkit.version, toolkit.source  # the toolkit's own runtime loads
    return Component("cuda", version, source, loads, tuple(copies))


def libfabric(fs: FsView, search: tuple[LibDir, ...], packages: dict[str, dpkg.Package],
              machine: str | None = None) -> Component:
    owners = _owner_versions(fs, packages, LIBFABRIC_PACKAGES)
    copies = []
    scans = [MAX_SCANNED_COPIES]  # what is left of the copies whose bytes may be searched
    for real in _library_copies(fs, search, "libfabric.so.1*", extra_lib_dirs(machine)):
        version, source = _libfabric_version(fs, real, owners, scans)
        copies.append(Copy(real, version, source))
    loads = ldpath.find_library(fs, search, "libfabric.so.1", machine)
    # no fallback to the package database alone: a package whose files are gone is not installed
    version, source = _effective(copies, loads, fs)
    hits = _on_path(fs, search, "libfabric.so.1", copies, machine)
    return Component("libfabric", version, source, loads, tuple(copies), hits)


def _libfabric_version(fs: FsView, real: str, owners: dict[str, dpkg.Package],
                       scans: list[int]) -> tuple[str | None, str | None]:
    """A libfabric file's release: its pkgconfig file when it is the one that file describes,
    else the dpkg package owning it, else the version string inside it (searched in the first
    MAX_SCANNED_COPIES copies only: `scans` counts them down)."""
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
    if scans[0] <= 0:
        return None, None
    scans[0] -= 1
    found = _LIBFABRIC_VERSION.search(fs.read_bytes(real, max_size=MAX_LIB_SCAN) or b"")
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


def aws_ofi_nccl(
    fs: FsView, search: tuple[LibDir, ...], env: dict[str, str], packages: dict[str, dpkg.Package],
    machine: str | None = None,
) -> Component:
    owners = _owner_versions(fs, packages, OFI_PACKAGES)
    candidates = _library_copies(fs, search, "libnccl-net*.so", extra_lib_dirs(machine))
    found = {}
    for group in _by_size(fs, candidates, _GROUP_BYTES):
        contents = fs.read_many(group, max_size=_MAX_PLUGIN_BYTES)
        # only this group's held: a few KB of .sqsh can hold a hundred hard links of one 256 MiB plugin
        for real in group:  # the version, not the match: a match keeps the whole file it searched
            match = _OFI_VERSION.search(contents.get(real, b""))
            found[real] = match.group(1).decode() if match else None
    copies = []
    for real in candidates:
        if found[real]:
            copies.append(Copy(real, found[real], real))
        elif real in owners:
            copies.append(Copy(real, versions.upstream(owners[real].version), _dpkg_source(owners[real])))
        elif posixpath.basename(real) == "libnccl-net-ofi.so":
            copies.append(Copy(real, None, None))
    plugin = ldpath.find_library(fs, search, plugin_file_name(env), machine)
    is_ofi = plugin is not None and any(c.path == fs.resolve(plugin) for c in copies)
    loads = plugin if is_ofi else None
    version, source = _effective(copies, loads, fs)
    hits = _on_path(fs, search, "libnccl-net-ofi.so", copies, machine)
    return Component("aws-ofi-nccl", version, source, loads, tuple(copies), hits)


# The programs whose machine is read besides the libraries: the loaders, the shell, Python, the
# EFA and CUDA tools. A sample, not every file: a 25 GB image holds hundreds of thousands.
PROGRAMS = (
    "/lib64/ld-linux-x86-64.so.2",
    "/lib/ld-linux-aarch64.so.1",
    "/bin/sh",
    "/usr/bin/env",
    "/usr/bin/python3",
    "/usr/local/bin/python3",
    "/opt/amazon/efa/bin/fi_info",
    "/usr/local/cuda/bin/nvcc",
)
# NCCL's plugins (net, tuner, profiler), found by name on the loader's path as NCCL dlopens them
NCCL_PLUGIN_PATTERNS = ("libnccl-net*.so*", "libnccl-tuner*.so*", "libnccl-profiler*.so*")
PLUGIN_ENV = ("NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN")
MAX_MACHINE_FILES = 1024  # bound on the files whose ELF header is read


def machine_files(fs: FsView, search: tuple[LibDir, ...], env: dict[str, str], components: Iterable[Component],
                  machine: str | None = None) -> list[str]:
    """The image's files whose machine decides whether it runs on its platform: the sample of
    programs, libc, every copy of the probed libraries, NCCL's plugins and libfabric's providers.
    Real paths, in a stable order, at most MAX_MACHINE_FILES."""
    found: dict[str, None] = {}  # ordered, and a set: a provider directory may hold thousands

    def add(path: str | None) -> None:
        if len(found) >= MAX_MACHINE_FILES:
            return
        real = fs.resolve(path) if path else None
        if real is not None and real not in found and fs.is_file(real):
            found[real] = None

    for path in PROGRAMS:
        add(path)
    add(ldpath.find_library(fs, search, "libc.so.6"))  # whichever machine: a foreign one is the finding
    dirs = extra_lib_dirs(machine)
    for component in components:
        add(component.loads)
        for copy in component.copies:
            add(copy.path)
    for pattern in ("libcudnn.so.*", *NCCL_PLUGIN_PATTERNS):
        for real in _library_copies(fs, search, pattern, dirs):
            add(real)
    for name in PLUGIN_ENV:
        value = env.get(name, "")
        if "/" in value:  # a path NCCL opens as given
            add(value)
    # libfabric loads its providers from <libdir>/libfabric/ unless FI_PROVIDER_PATH says otherwise
    fabric_dirs = [posixpath.join(posixpath.dirname(p), "libfabric") for p in list(found) if
                   posixpath.basename(p).startswith("libfabric.so")]
    fabric_dirs += [d for d in env.get("FI_PROVIDER_PATH", "").split(":") if d.startswith("/")]
    for directory in fabric_dirs:
        for path in fs.glob(f"{directory}/*.so"):
            add(path)
    return list(found)
