"""Build the offline demo fixture images (no registry needed; the command: efabuild.cli.build_fixtures).

The "mini NGC" base `efabuild-fixtures/pytorch:26.08-py3` stands in for
nvcr.io/nvidia/pytorch:26.08-py3 with its file layout, env and labels, plus offline stand-ins for
apt-get, curl, git, pip and the EFA installer (see fixtures/README.md). It is built from
`fixtures/mini-ngc`, a static busybox and the host's CPython 3.11 (the interpreter, the shared
libraries it loads and the few standard modules `compileall` needs, with Debian's timestamp-checked
`.pyc` files) with `docker buildx build`, and labelled with a digest of its sources: a run with
unchanged sources finds the image and builds nothing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from efabuild.engine import children
from efabuild.errors import EfabuildError, InputError
from efabuild.model import BuilderSettings
from efabuild.store.scratch import scratch_dir

if TYPE_CHECKING:
    from efabuild.engine.client import Engine

MINI_NGC_TAG = "efabuild-fixtures/pytorch:26.08-py3"
CONTENT_LABEL = "org.efabuild.fixture.content"
# what the fixture offers, for tests and the demo graph
EFA_INSTALLER_VERSIONS = ("1.49.0", "1.50.0")
DEEPEP_COMMITS = (
    "94a9f8f6b146c07d97ec58f67cd6d303296d6098",  # the guide's pin
    "2b95b07b437d74a177142f0fdd63980696968ed3",  # fixture default-branch head
    "2b8a11b1f65ce11965e632eebd205138d7c34e6a",  # fixture older commit (version 1.2.0)
)
_FORMAT = "2"  # bump when the way the context is assembled changes
_BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")
PYTHON = "/usr/bin/python3.11"  # Debian bookworm's python3.11-minimal and libpython3.11-stdlib
# what `python3 -m compileall` and `py_compile` import beyond the interpreter's frozen modules;
# the host's interpreter is asked, so the list follows its patch release
_PYTHON_PROBE = """
import compileall, importlib.util, os, py_compile, runpy, sys, tempfile
std = os.path.dirname(os.__file__)
with tempfile.TemporaryDirectory() as empty:
    sys.argv = ["compileall", "-q", empty]
    compileall.main()
print(std)
for module in list(sys.modules.values()):
    path = getattr(module, "__file__", None) or ""
    if path.startswith(std + "/") and os.path.isfile(path) and not os.path.islink(path):
        print(path)
        cached = importlib.util.cache_from_source(path)
        if os.path.isfile(cached):
            print(cached)
"""


@attrs.frozen
class FixtureImage:
    tag: str
    image_id: str
    content: str  # blake3 of the fixture sources and the busybox binary
    built: bool  # False: an image with the same content label was there already
    seconds: float


def source_dir() -> Path:
    """The fixtures/ folder of the source tree (efabuild runs from a checkout in development)."""
    return Path(__file__).resolve().parents[2] / "fixtures"


# an installed wheel's copy of fixtures/, packed by setup.py (a wheel cannot hold symlinks)
PACKED_SOURCES = Path(__file__).with_name("fixtures.tar")


@contextlib.contextmanager
def fixture_sources(source: Path | None = None) -> Iterator[Path]:
    """The fixtures/ folder: `source`, else the checkout's, else the installed package's, unpacked
    for as long as the caller needs it."""
    if source is not None or source_dir().is_dir():
        yield source or source_dir()
        return
    if not PACKED_SOURCES.is_file():
        raise InputError("the fixture sources are missing: neither a checkout's fixtures/ nor the package's "
                         "fixtures.tar (reinstall efabuild, or pass --source)", str(source_dir()))
    with scratch_dir("fixture-sources") as tmp:
        with tarfile.open(PACKED_SOURCES) as tar:
            _extract_inside(tar, Path(tmp))
        yield Path(tmp) / "fixtures"


def _extract_inside(tar: tarfile.TarFile, dest: Path) -> None:
    """Extract keeping the symlinks (absolute ones too), refusing a member whose path leaves `dest`."""
    if hasattr(tarfile, "tar_filter"):
        tar.extractall(dest, filter="tar")
        return
    # CPython before 3.11.4 (Debian bookworm's 3.11.2) has no extraction filters: the tar filter's
    # check by hand, member by member so that a link extracted earlier is followed
    root = os.path.realpath(dest)
    for member in tar.getmembers():
        if os.path.commonpath([root, os.path.realpath(os.path.join(root, member.name))]) != root:
            raise InputError(f"{member.name}: leaves the directory it is unpacked into", str(PACKED_SOURCES))
        tar.extract(member, dest)


def is_static_elf(path: Path) -> bool:
    """True for an ELF executable without a program interpreter (runs in an empty image)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit ELF only
            return False
        order = "<" if head[5] == 1 else ">"
        phoff, = struct.unpack_from(order + "Q", head, 0x20)
        phentsize, phnum = struct.unpack_from(order + "HH", head, 0x36)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    return all(
        struct.unpack_from(order + "I", table, i * phentsize)[0] != 3  # PT_INTERP
        for i in range(phnum)
    )


def find_busybox() -> Path:
    for candidate in (os.environ.get("EFABUILD_BUSYBOX"), *_BUSYBOX_CANDIDATES):
        if candidate and Path(candidate).is_file() and is_static_elf(Path(candidate)):
            return Path(candidate)
    raise EfabuildError(
        "no static busybox found (looked at $EFABUILD_BUSYBOX, /bin/busybox, /usr/bin/busybox): "
        "install Debian's busybox-static (scripts/setup-host.sh does)"
    )


def python_files(python: str | None = None) -> dict[str, Path]:
    """rootfs path → host file: the interpreter, the shared libraries it loads (`ldd`), and the
    standard modules `python3 -m compileall` imports, with the `.pyc` files Debian compiled."""
    python = python or os.environ.get("EFABUILD_FIXTURE_PYTHON") or PYTHON
    missing = EfabuildError(f"no {python}: install Debian's python3.11 (scripts/setup-host.sh does)")
    if not Path(python).is_file():
        raise missing
    try:
        libs = children.run(["ldd", python], capture_output=True, text=True, check=True, timeout=30).stdout
        found = children.run([python, "-I", "-c", _PYTHON_PROBE], capture_output=True, text=True,
                               check=True, timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError):
        raise missing from None
    files = {f"usr/bin/{Path(python).name}": Path(python)}
    for line in libs.splitlines():
        parts = line.split()
        path = parts[2] if len(parts) >= 3 and parts[1] == "=>" else parts[0] if parts else ""
        if path.startswith("/"):
            # the loader keeps its absolute path; libraries go where Debian's loader looks first
            rootfs = path.lstrip("/") if "ld-linux" in path else f"usr/lib/x86_64-linux-gnu/{Path(path).name}"
            files[rootfs] = Path(path).resolve()
    for path in found[1:]:
        files[path.lstrip("/")] = Path(path)
    return files


def content_digest(source: Path, busybox: Path, extra: dict[str, Path] | None = None) -> str:
    """blake3 over every file of `source` (path, kind, mode, bytes or link target), busybox and
    the `extra` files (rootfs path → host file)."""
    import blake3

    h = blake3.blake3()
    h.update(f"efabuild-fixtures/{_FORMAT}\0".encode())
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source).as_posix()
        st = path.lstat()
        if path.is_symlink():
            h.update(f"L\0{rel}\0{os.readlink(path)}\0".encode())
        elif path.is_file():
            h.update(f"F\0{rel}\0{st.st_mode & 0o111 and 1}\0{st.st_size}\0".encode())
            h.update(path.read_bytes())
        elif path.is_dir():
            h.update(f"D\0{rel}\0".encode())
    h.update(b"busybox\0")
    h.update(busybox.read_bytes())
    for rel, path in sorted((extra or {}).items()):
        st = path.stat()
        # the mtime too: a .pyc is only valid against its source's
        h.update(f"X\0{rel}\0{st.st_mode & 0o111 and 1}\0{int(st.st_mtime)}\0{st.st_size}\0".encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def build_mini_ngc(
    *, engine: Engine | None = None, source: Path | None = None, force: bool = False,
    log: Callable[[str], None] = lambda _: None,
) -> FixtureImage:
    """Build `MINI_NGC_TAG` unless an image with the same content label exists."""
    from efabuild.engine.client import connect

    engine = engine or connect(BuilderSettings())
    started = time.monotonic()
    with fixture_sources(source) as sources:
        return _build_mini_ngc(engine, sources / "mini-ngc", force, log, started)


def _build_mini_ngc(engine: Engine, root: Path, force: bool, log: Callable[[str], None],
                    started: float) -> FixtureImage:
    from efabuild.engine.build import build_image
    from efabuild.engine.images import image_config, image_id

    if not (root / "Dockerfile").is_file():
        raise InputError("no Dockerfile: the fixture sources are missing", str(root))
    busybox = find_busybox()
    python = python_files()
    content = content_digest(root, busybox, python)
    existing = image_id(engine, MINI_NGC_TAG)
    labels = image_config(engine, MINI_NGC_TAG)["Labels"] if existing is not None else {}
    if existing is not None and not force and labels.get(CONTENT_LABEL) == content:
        return FixtureImage(MINI_NGC_TAG, existing, content, False, time.monotonic() - started)
    log(f"{MINI_NGC_TAG}: building from {root}")
    with scratch_dir("fixture") as tmp:
        context = Path(tmp) / "context"
        shutil.copytree(root, context, symlinks=True)
        shutil.copy2(busybox, context / "busybox")
        for rel, path in python.items():
            target = context / "python" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)  # keeps the mtime each .pyc was compiled against
        (context / "python/usr/bin/python3").symlink_to(Path(PYTHON).name)
        # the landmark of the interpreter's exec_prefix: no compiled modules beyond its own
        (context / "python/usr/lib/python3.11/lib-dynload").mkdir(parents=True, exist_ok=True)
        built = build_image(engine, context, MINI_NGC_TAG, {CONTENT_LABEL: content})
    return FixtureImage(MINI_NGC_TAG, built, content, True, time.monotonic() - started)


def build_fixtures(
    *, engine: Engine | None = None, source: Path | None = None, force: bool = False,
    log: Callable[[str], None] = lambda _: None,
) -> list[FixtureImage]:
    """Every fixture image (today: the mini NGC base; variants are layers on top of it)."""
    return [build_mini_ngc(engine=engine, source=source, force=force, log=log)]

