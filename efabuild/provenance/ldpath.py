"""The dynamic loader's library search order in an image, and which file it would load.

Order as glibc's ld.so searches for a library without a path: LD_LIBRARY_PATH, then the
directories of /etc/ld.so.conf (and the files it includes, in sorted order) as cached by ldconfig,
then the default directories (the image's own machine's: an arm64 loader never looks in
/usr/lib/x86_64-linux-gnu). RUNPATHs of the loading binary are not known here and are ignored.
"""

from __future__ import annotations

import posixpath

from efabuild.provenance import elf
from efabuild.provenance.fsview import FsView
from efabuild.provenance.measured import LibDir

LD_SO_CONF = "/etc/ld.so.conf"
_GENERIC_DIRS = ("/lib64", "/usr/lib64", "/lib", "/usr/lib")
DEFAULT_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", *_GENERIC_DIRS)
_MAX_INCLUDE_DEPTH = 8
# copies of one name whose ELF header is read (each may cost an `unsquashfs`): an image's path
# of a thousand directories holding it took 35 s; past these, a copy is taken as the loader's
MAX_JUDGED = 32


def default_dirs(machine: str | None) -> tuple[str, ...]:
    """The loader's built-in directories on `machine` (x86_64's when it is not known)."""
    triplet = elf.triplet(machine) or elf.triplet("x86_64")
    return (f"/lib/{triplet}", f"/usr/lib/{triplet}", *_GENERIC_DIRS)


def search_path(fs: FsView, env: dict[str, str], machine: str | None = None) -> tuple[LibDir, ...]:
    found: list[LibDir] = []
    seen: set[str] = set()

    def add(directory: str, source: str) -> None:
        directory = posixpath.normpath(directory)
        if directory.startswith("/") and directory not in seen:
            seen.add(directory)
            found.append(LibDir(directory, source))

    for directory in env.get("LD_LIBRARY_PATH", "").split(":"):
        if directory:  # an empty entry means the working directory: nothing to find in an image
            add(directory, "env:LD_LIBRARY_PATH")
    for directory, source in _conf_dirs(fs, LD_SO_CONF, 0):
        add(directory, source)
    for directory in default_dirs(machine):
        add(directory, "default")
    return tuple(found)


def _conf_dirs(fs: FsView, conf: str, depth: int, read: set[str] | None = None) -> list[tuple[str, str]]:
    # each file is read once: four files that each include the glob of all four were 4^9 reads
    # (43 s from a directory, an hour of unsquashfs runs from a .sqsh)
    read = set() if read is None else read
    real = fs.resolve(conf) or conf
    if real in read or depth > _MAX_INCLUDE_DEPTH:
        return []
    read.add(real)
    text = fs.read_text(conf)
    if text is None:
        return []
    dirs: list[tuple[str, str]] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("hwcap"):
            continue
        if line.startswith("include") and line[7:8] in (" ", "\t"):
            for pattern in line[8:].split():
                if not pattern.startswith("/"):
                    pattern = posixpath.join(posixpath.dirname(conf), pattern)
                for included in fs.glob(pattern):
                    dirs += _conf_dirs(fs, included, depth + 1, read)
            continue
        for directory in line.replace(",", " ").split():
            dirs.append((directory.split("=", 1)[0], conf))
    return dirs


def find_library(fs: FsView, dirs: tuple[LibDir, ...], name: str, machine: str | None = None) -> str | None:
    """The path the loader would open for `name` (e.g. "libnccl.so.2"), or None. On `machine`, an
    ELF file of another machine is passed over, as ld.so does, and the search goes on."""
    found = find_all(fs, dirs, name, machine, first=True)
    return found[0] if found else None


def find_all(fs: FsView, dirs: tuple[LibDir, ...], name: str, machine: str | None = None,
             first: bool = False) -> list[str]:
    """Every `<dir>/<name>` that exists and `machine`'s loader would open, in search order: the
    first is the one that loads."""
    candidates = [name] if "/" in name else [posixpath.join(d.dir, name) for d in dirs]
    found = []
    judged = 0
    for path in candidates:
        if not fs.is_file(path):
            continue
        if machine is not None and judged < MAX_JUDGED:
            judged += 1
            if not _loadable(fs, path, machine):
                continue
        found.append(path)
        if first:
            break
    return found


def _loadable(fs: FsView, path: str, machine: str | None) -> bool:
    if machine is None:
        return True
    found = elf.machine(fs.read_heads([path], elf.HEAD_BYTES).get(path, b""))
    return found is None or found == machine  # not ELF (a stand-in, a script): not judged here


def position(dirs: tuple[LibDir, ...], path: str) -> int | None:
    """Index of the directory holding `path` in the search order (None when not searched)."""
    parent = posixpath.dirname(path)
    for index, libdir in enumerate(dirs):
        if libdir.dir == parent:
            return index
    return None
