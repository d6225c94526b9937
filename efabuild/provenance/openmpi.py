"""The Open MPI installations in an image and their releases, read from their files.

Where they are: NGC's /usr/local/mpi (HPC-X's), the EFA installer's /opt/amazon/openmpi*, HPC-X's
/opt/hpcx/ompi*, and Debian/Ubuntu's own (libopenmpi3: libmpi.so.40 in the triplet directory, on
the loader's default path, its -dev files under <triplet>/openmpi). Two paths to one installation
are one installation.
"""

from __future__ import annotations

import posixpath
import re

from efabuild.provenance import dpkg, elf, versions
from efabuild.provenance.fsread import MAX_LIB_SCAN, defines
from efabuild.provenance.fsview import FsView
from efabuild.provenance.measured import MpiInstall

OPENMPI_PLACES = (
    "/usr/local/mpi",
    "/opt/amazon/openmpi*",
    "/opt/hpcx/ompi*",
)
_OMPI_VERSION = re.compile(rb"Open MPI v?(\d+\.\d+\.\d+)")
# Open MPI 4's libmpi keeps its release for ompi_info as "v4.1.4" before the string "Open MPI"
_OMPI_FULL_VERSION = re.compile(rb"%s:version:full\x00v(\d+\.\d+\.\d+)\x00Open MPI\x00")
MAX_SCANNED_MPI = 4  # libmpi files of one installation whose bytes are searched, and packages read


def installations(fs: FsView, machine: str | None = None, packages: dict | None = None) -> tuple[MpiInstall, ...]:
    found: list[MpiInstall] = []
    # Debian/Ubuntu's own: libmpi.so.40 (Open MPI 3 to 5; MPICH's is .12) in the triplet directory
    # (found as that directory); its -dev package adds <triplet>/openmpi/{include,lib} beside it
    for triplet in elf.triplets_for(machine):
        libdir = f"/usr/lib/{triplet}"
        libs = [p for p in fs.glob(f"{libdir}/libmpi.so.40*") if fs.is_file(p)]
        if libs:
            version, source = _debian_openmpi_version(fs, libdir, libs, packages or {})
            found.append(MpiInstall(libdir, fs.resolve(libdir) or libdir, version, source))
    for pattern in (*OPENMPI_PLACES, *(f"/usr/lib/{t}/openmpi" for t in elf.triplets_for(machine))):
        for path in fs.glob(pattern):
            real = fs.resolve(path)
            if real is None or not fs.is_dir(real) or any(m.real_path == real for m in found):
                continue
            if any(m.path == posixpath.dirname(path) for m in found):
                continue  # Debian's -dev files of the installation found in the triplet directory
            if not (fs.exists(f"{real}/include/mpi.h") or fs.glob(f"{real}/lib/libmpi.so*")
                    or fs.exists(f"{real}/bin/mpirun")):
                continue
            version, source = _openmpi_version(fs, real)
            found.append(MpiInstall(path, real, version, source))
    return tuple(found)


def _debian_openmpi_version(fs: FsView, libdir: str, libs: list[str],
                            packages: dict[str, dpkg.Package]) -> tuple[str | None, str | None]:
    """The release of the Open MPI whose libmpi is in a triplet directory: its -dev files' mpi.h or
    ompi.pc, the dpkg package owning libmpi, else the version string inside libmpi."""
    version, source = _openmpi_version(fs, f"{libdir}/openmpi", scan=False)
    if version is not None:
        return version, source
    reals = {fs.resolve(p) for p in libs} | set(libs)
    # Debian's names (libopenmpi3, libopenmpi40...): a few, whatever a hostile status file lists
    for name in sorted(n for n in packages if n.startswith("libopenmpi"))[:MAX_SCANNED_MPI]:
        package = packages[name]
        if reals & set(dpkg.owned_files(fs, package)):
            return versions.upstream(package.version), f"{dpkg.STATUS_FILE} ({package.name} {package.version})"
    return _scanned_openmpi_version(fs, sorted({fs.resolve(p) or p for p in libs}))


def _openmpi_version(fs: FsView, root: str, scan: bool = True) -> tuple[str | None, str | None]:
    header = f"{root}/include/mpi.h"
    found = defines(fs.read_text(header) or "", ["OMPI_MAJOR_VERSION", "OMPI_MINOR_VERSION", "OMPI_RELEASE_VERSION"])
    if len(found) == 3 and all(v.isdigit() for v in found.values()):
        return f"{found['OMPI_MAJOR_VERSION']}.{found['OMPI_MINOR_VERSION']}.{found['OMPI_RELEASE_VERSION']}", header
    pc = f"{root}/lib/pkgconfig/ompi.pc"
    match = re.search(r"^Version:\s*(\S+)", fs.read_text(pc) or "", re.MULTILINE)
    if match:
        return match.group(1), pc
    return _scanned_openmpi_version(fs, fs.glob(f"{root}/lib/libmpi.so.*")) if scan else (None, None)


def _scanned_openmpi_version(fs: FsView, libs: list[str]) -> tuple[str | None, str | None]:
    """The release libmpi carries (as ompi_info prints it), in its first MAX_LIB_SCAN bytes."""
    for lib in libs[:MAX_SCANNED_MPI]:
        data = fs.read_bytes(lib, max_size=MAX_LIB_SCAN) or b""
        found = _OMPI_VERSION.search(data) or _OMPI_FULL_VERSION.search(data)
        if found:
            return found.group(1).decode(), lib
    return None, None
