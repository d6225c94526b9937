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

from efabuild.host import children
from efabuild.errors import EfabuildError, InputError
from efabuild.settings import BuilderSettings
from efabuild.host.scratch import scratch_dir

if TYPE_CHECKING:
    from efabuild.engine.client import Engine

MINI_NGC_TAG = "efabuild-fixtures/pytorch:26.08-py3"
HOST_PLATFORM = "linux/amd64"  # the machine the fixtures are built on (Debian's amd64 packages)
# Debian's arm64 packages, unpacked (not installed: they would replace the amd64 ones) by
# scripts/setup-host.sh: busybox-static, python3.11-minimal and the libraries it loads
ARM64_ROOT = Path("/var/lib/efabuild/arm64")
# the arm64 interpreter's loader and libraries (its DT_NEEDED): rootfs path -> path under ARM64_ROOT
_ARM64_PYTHON = {
    "usr/bin/python3.11": "usr/bin/python3.11",
    "lib/ld-linux-aarch64.so.1": "lib/aarch64-linux-gnu/ld-linux-aarch64.so.1",
    **{f"usr/lib/aarch64-linux-gnu/{name}": f"lib/aarch64-linux-gnu/{name}"
       for name in ("libc.so.6", "libm.so.6", "libz.so.1", "libexpat.so.1")},
}
CONTENT_LABEL = "org.efabuild.fixture.content"
# what the fixture offers, for tests and the demo graph
EFA_INSTALLER_VERSIONS = ("1.49.0", "1.50.0")
DEEPEP_COMMITS = (
    "94a9f8f6b146c07d97ec58f67cd6d303296d6098",  # the guide's pin
    "2b95b07b437d74a177142f0fdd63980696968ed3",  # fixture default-branch head
    "2b8a11b1f65ce11965e632eebd205138d7c34e6a",  # fixture older commit (version 1.2.0)
)
_FORMAT = "3"  # bump when the way the context is assembled changes
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


def platform_tag(platform: str) -> str:
    """The fixture base's tag for `platform`: Docker's image store keeps one platform per tag, so
    the host's is MINI_NGC_TAG (as it always was) and another's is MINI_NGC_TAG-<arch>."""
    return MINI_NGC_TAG if platform == HOST_PLATFORM else f"{MINI_NGC_TAG}-{platform.split('/')[1]}"


def find_busybox(platform: str = HOST_PLATFORM) -> Path:
    if platform != HOST_PLATFORM:
        return _arm64_file(platform, "bin/busybox", "EFABUILD_BUSYBOX_ARM64")
    for candidate in (os.environ.get("EFABUILD_BUSYBOX"), *_BUSYBOX_CANDIDATES):
        if candidate and Path(candidate).is_file() and is_static_elf(Path(candidate)):
            return Path(candidate)
    raise EfabuildError(
        "no static busybox found (looked at $EFABUILD_BUSYBOX, /bin/busybox, /usr/bin/busybox): "
        "install Debian's busybox-static (scripts/setup-host.sh does)"
    )


def _arm64_file(platform: str, rel: str, variable: str | None = None) -> Path:
    if platform != "linux/arm64":
        raise InputError(f"no fixture for {platform}: the fixtures are built for {HOST_PLATFORM} and linux/arm64")
    path = Path(os.environ.get(variable) or ARM64_ROOT / rel) if variable else ARM64_ROOT / rel
    if not path.is_file():
        raise EfabuildError(f"no {path}: the arm64 fixture is built from Debian's arm64 packages, which "
                            f"scripts/setup-host.sh unpacks into {ARM64_ROOT}")
    return path


def python_files(python: str | None = None, platform: str = HOST_PLATFORM) -> dict[str, Path]:
    """rootfs path → host file: the interpreter, the shared libraries it loads (`ldd`), and the
    standard modules `python3 -m compileall` imports, with the `.pyc` files Debian compiled. For
    arm64: the arm64 interpreter and its libraries (Debian's), with the same standard modules (pure
    Python and bytecode: one copy serves every machine)."""
    files = _host_python_files(python)
    if platform == HOST_PLATFORM:
        return files
    stdlib = {rel: path for rel, path in files.items() if rel.startswith("usr/lib/python3")}
    return {**{rel: _arm64_file(platform, src) for rel, src in _ARM64_PYTHON.items()}, **stdlib}


def _host_python_files(python: str | None = None) -> dict[str, Path]:
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
    log: Callable[[str], None] = lambda _: None, platform: str = HOST_PLATFORM,
) -> FixtureImage:
    """Build the base for `platform` (platform_tag) unless an image with the same content label exists."""
    # deferred, as the other engine modules below: build-fixtures --help reads the names above, no engine
    from efabuild.engine.client import connect

    engine = engine or connect(BuilderSettings())
    started = time.monotonic()
    with fixture_sources(source) as sources:
        return _build_mini_ngc(engine, sources / "mini-ngc", force, log, started, platform)


def _build_mini_ngc(engine: Engine, root: Path, force: bool, log: Callable[[str], None],
                    started: float, platform: str = HOST_PLATFORM) -> FixtureImage:
    from efabuild.engine.build import build_image
    from efabuild.engine.images import image_config, image_id

    if not (root / "Dockerfile").is_file():
        raise InputError("no Dockerfile: the fixture sources are missing", str(root))
    tag, arch = platform_tag(platform), platform.split("/")[1]
    busybox = find_busybox(platform)
    python = python_files(platform=platform)
    content = content_digest(root, busybox, {**python, f"platform/{platform}": busybox})
    existing = image_id(engine, tag)
    labels = image_config(engine, tag)["Labels"] if existing is not None else {}
    if existing is not None and not force and labels.get(CONTENT_LABEL) == content:
        return FixtureImage(tag, existing, content, False, time.monotonic() - started)
    log(f"{tag}: building for {platform} from {root}")
    with scratch_dir("fixture") as tmp:
        context = Path(tmp) / "context"
        shutil.copytree(root, context, symlinks=True)
        shutil.copy2(busybox, context / f"busybox-{arch}")
        for rel, path in python.items():
            target = context / f"python-{arch}" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)  # keeps the mtime each .pyc was compiled against
        (context / f"python-{arch}/usr/bin/python3").symlink_to(Path(PYTHON).name)
        # the landmark of the interpreter's exec_prefix: no compiled modules beyond its own
        (context / f"python-{arch}/usr/lib/python3.11/lib-dynload").mkdir(parents=True, exist_ok=True)
        built = build_image(engine, context, tag, {CONTENT_LABEL: content},
                            platform=None if platform == HOST_PLATFORM else platform)
    return FixtureImage(tag, built, content, True, time.monotonic() - started)


def build_fixtures(
    *, engine: Engine | None = None, source: Path | None = None, force: bool = False,
    log: Callable[[str], None] = lambda _: None, platforms: tuple[str, ...] = (HOST_PLATFORM,),
) -> list[FixtureImage]:
    """Every fixture image (today: the mini NGC base, once per platform; variants are layers on
    top of it)."""
    return [build_mini_ngc(engine=engine, source=source, force=force, log=log, platform=platform)
            for platform in platforms]


def publish_index(engine: Engine, images: list[FixtureImage], platforms: tuple[str, ...], registry: str) -> str:
    """Push each platform's base to `registry` and join them in one multi-platform index, as NGC
    publishes its tags: REGISTRY/efabuild-fixtures/pytorch:26.08-py3, whose per-platform manifest
    a build for a platform pulls. Returns the index's reference by digest."""
    from efabuild.engine.client import EngineError
    from efabuild.engine.images import remote_digest, tag_image, untag_image

    name = f"{registry}/{MINI_NGC_TAG}"
    sources = []
    for image, platform in zip(images, platforms):
        pushed = f"{name}-{platform.split('/')[1]}"
        tag_image(engine, image.tag, pushed)
        try:
            found = engine.run("push", "-q", pushed, timeout=300)
        finally:  # the registry's name is not left in the engine: only the registry holds it
            untag_image(engine, pushed)
        if found.returncode != 0:
            raise EngineError.from_output(f"cannot push {pushed}", found.stderr)
        sources.append(pushed)
    made = engine.run("buildx", "imagetools", "create", "-t", name, *sources, timeout=300)
    if made.returncode != 0:
        raise EngineError.from_output(f"cannot make the index {name}", made.stderr)
    digest = remote_digest(engine, name)
    if digest is None:
        raise EfabuildError(f"{name}: pushed, but the registry gives no digest for it")
    return f"{name}@{digest}"
