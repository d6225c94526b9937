"""A training image at the size users run: the pinned real packages of scripts/fetch-real-binaries.py
(NVIDIA's CUDA runtime, NCCL and cuDNN wheels installed as pip installs them, Debian's libfabric and
runtime Open MPI as apt installs them) and generated files up to a total size and file count: small
files like a Python tree, large incompressible ones like the rest of CUDA.

Full size keeps every byte of the packages (cuDNN's engines alone are hundreds of MB); --quick keeps
each library's first 4 MiB, as the tests do.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import random
import re
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from benchmarks import fixtures
from benchmarks.common import REPO_ROOT, BenchError, MiB

SITE = "usr/local/lib/python3.11/dist-packages"
WHEELS = ("nvidia-cuda-runtime-cu12", "nvidia-nccl-cu12", "nvidia-cudnn-cu12")
DEBS = ("libfabric1", "libopenmpi3")
LARGE_BYTES = 512 * MiB
SMALL_PER_DIR = 200


@functools.cache
def fetcher():  # noqa: ANN201 - the fetch-real-binaries script as a module, loaded once
    spec = importlib.util.spec_from_file_location("fetch_real_binaries", REPO_ROOT / "scripts" / "fetch-real-binaries.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def packages(log) -> dict[str, Path]:  # noqa: ANN001
    """The pinned packages' files, fetched (checked against their pins) where not cached yet."""
    fetch = fetcher()
    cache = fetch.cache_dir()
    found = {}
    for pin in fetch.PINS:
        if pin.name in WHEELS + DEBS:
            path = fetch.cached(pin, cache)
            if path is None:
                log(f"scale-real: fetching {pin.filename} (~{pin.size_mib} MiB)")
                path = fetch.fetch(pin, cache)
            found[pin.name] = path
    return found


def truth(found: dict[str, Path]) -> dict[str, str]:
    """What each package says of itself: the wheel's METADATA, the .deb's control (upstream part)."""
    versions = {}
    for component, name in (("cuda", "nvidia-cuda-runtime-cu12"), ("nccl", "nvidia-nccl-cu12"),
                            ("cudnn", "nvidia-cudnn-cu12")):
        with zipfile.ZipFile(found[name]) as archive:
            [meta] = [n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
            versions[component] = re.search(r"^Version: (\S+)$", archive.read(meta).decode(), re.M).group(1)
    for component, name in (("libfabric", "libfabric1"), ("openmpi", "libopenmpi3")):
        version = fetcher().control(found[name])["Version"]
        versions[component] = version.split(":", 1)[-1].rsplit("-", 1)[0]
    return versions


def _tree_stats(root: Path) -> tuple[int, int]:
    files = data = 0
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            files += 1
            data += path.stat().st_size
    return files, data


def real_image(found: dict[str, Path], total_bytes: int, total_files: int, *, whole: bool, log) -> tuple[str, dict]:  # noqa: ANN001
    """The image's tag (made once, then kept) and what it holds: {"files", "bytes", "package_bytes"}."""
    spec = f"{fixtures.FORMAT_VERSION}:{total_bytes}:{total_files}:{whole}:" + ",".join(
        sorted(p.name for p in found.values()))
    tag = f"{fixtures.IMAGE_REPO}/scale-real:{hashlib.sha256(spec.encode()).hexdigest()[:12]}"
    fetch = fetcher()
    with tempfile.TemporaryDirectory(prefix="efabuild-bench-real-") as scratch:
        root = Path(scratch)
        for name in WHEELS:
            fetch.install_wheel(found[name], root / SITE, keep_bytes=-1 if whole else fetch.KEEP_BYTES)
        for name in DEBS:
            fetch.install_deb(found[name], root, records=True)
        real_files, real_bytes = _tree_stats(root)
        rng = random.Random(7)
        small_count = max(0, total_files - real_files)
        small_sizes = [rng.randint(200, 16 << 10) for _ in range(small_count)]
        left = max(0, total_bytes - real_bytes - sum(small_sizes))
        large = [LARGE_BYTES] * (left // LARGE_BYTES) + ([left % LARGE_BYTES] if left % LARGE_BYTES else [])
        held = {"files": real_files + small_count + len(large), "bytes": real_bytes + sum(small_sizes) + left,
                "package_bytes": real_bytes}
        if fixtures.image_exists(tag):
            return tag, held
        log(f"scale-real: importing the image ({held['files']} files, {held['bytes'] / (1 << 30):.1f} GiB)")

        def write(tar: tarfile.TarFile) -> None:
            fixtures.add_busybox(tar)
            for entry in sorted(root.rglob("*")):  # a directory before what it holds
                name = entry.relative_to(root).as_posix()
                if name not in fixtures.BUSYBOX_DIRS:  # the engine refuses a path twice
                    tar.add(entry, arcname=name, recursive=False)
            data_rng = random.Random(11)
            fixtures._add_dir(tar, "usr/lib/python3")
            fixtures._add_dir(tar, "usr/lib/python3/dist-packages")
            for index, size in enumerate(small_sizes):
                folder = f"usr/lib/python3/dist-packages/pkg{index // SMALL_PER_DIR:04d}"
                if index % SMALL_PER_DIR == 0:
                    fixtures._add_dir(tar, folder)
                fixtures._add_file(tar, f"{folder}/mod{index:06d}.py", data_rng.randbytes(size))
            fixtures._add_dir(tar, "opt/big")
            for index, size in enumerate(large):
                fixtures._add_file(tar, f"opt/big/lib{index:03d}.so", size=size,
                                   source=fixtures.RandomStream(size, seed=300 + index), mode=0o755)
            fixtures._add_dir(tar, "workspace")

        try:
            fixtures._import(tag, write, ("ENV PATH=/usr/bin:/bin", "ENV LANG=C.UTF-8", "WORKDIR /workspace",
                                          'CMD ["/bin/sh"]'))
        except OSError as exc:
            raise BenchError(f"scale-real: could not write the image: {exc}") from None
    return tag, held
