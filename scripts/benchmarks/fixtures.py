"""Data the scenarios run on, made locally (no network): images from busybox-static and generated
files, and context trees of many small files.

Images are tagged by what they contain (`efabuild-bench/<what>:<spec hash>`) and kept, so a second
run of the benchmark does not import them again.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import subprocess
import tarfile
import tempfile
from pathlib import Path

from benchmarks.common import BenchError, run

BUSYBOX = Path("/bin/busybox")
IMAGE_REPO = "efabuild-bench"
# files and directories are given this mtime (2020-01-01): old enough for efabuild's stat cache to
# trust them (it distrusts entries younger than its racy window), and the same on every run
FIXED_MTIME = 1577836800
FORMAT_VERSION = "1"
BUSYBOX_DIRS = ("bin", "etc", "root", "usr", "usr/bin", "usr/lib", "opt", "tmp")  # bump when the generated content changes, so cached images are remade


def image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, FIXED_MTIME
    tar.addfile(info)


def _add_file(tar: tarfile.TarFile, name: str, data: bytes | None = None, *, size: int = 0,
              source: io.RawIOBase | None = None, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.mode, info.mtime = mode, FIXED_MTIME
    info.size = len(data) if data is not None else size
    tar.addfile(info, io.BytesIO(data) if data is not None else source)


def add_busybox(tar: tarfile.TarFile) -> None:
    """/bin/busybox with a symlink per applet, and the usual top directories."""
    if not BUSYBOX.is_file():
        raise BenchError("busybox-static missing: run `bash scripts/setup-host.sh` (as root) first")
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True)
    for directory in BUSYBOX_DIRS:
        _add_dir(tar, directory, 0o1777 if directory == "tmp" else 0o755)
    _add_file(tar, "bin/busybox", BUSYBOX.read_bytes(), mode=0o755)
    for applet in sorted(set(applets.stdout.split()) - {"busybox"}):
        link = tarfile.TarInfo(f"bin/{applet}")
        link.type, link.linkname, link.mode, link.mtime = tarfile.SYMTYPE, "busybox", 0o777, FIXED_MTIME
        tar.addfile(link)


class RandomStream(io.RawIOBase):
    """`size` deterministic pseudo-random bytes, read like a file."""

    def __init__(self, size: int, seed: int) -> None:
        self.left = size
        self.rng = random.Random(seed)

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return self.rng.randbytes(n)


def _import(tag: str, write_tar, changes: tuple[str, ...]) -> None:
    """`docker import` a root filesystem that `write_tar(tarfile)` writes, streamed (no temp file)."""
    command = ["docker", "import"]
    for change in changes:
        command += ["--change", change]
    command += ["-", tag]
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err)
        assert proc.stdin is not None
        try:
            with tarfile.open(fileobj=proc.stdin, mode="w|", format=tarfile.GNU_FORMAT) as tar:
                write_tar(tar)
        except BrokenPipeError:
            pass  # docker import stopped reading: its exit status and message say why
        finally:
            try:
                proc.stdin.close()
            except BrokenPipeError:
                pass
        if proc.wait() != 0:
            err.seek(0)
            raise BenchError(f"docker import {tag} failed: {err.read().decode(errors='replace').strip()}")


def busybox_image() -> str:
    """A tiny base image made from the host's busybox-static; named by the binary's hash."""
    digest = hashlib.sha256(BUSYBOX.read_bytes()).hexdigest()[:12]
    tag = f"{IMAGE_REPO}/busybox:{digest}"
    if not image_exists(tag):
        _import(tag, add_busybox, ("ENV PATH=/usr/bin:/bin",))
    return tag


def export_image(small_files: int, large_files: int, large_bytes: int) -> tuple[str, int]:
    """An image shaped like a training image: busybox, `small_files` files of 0.2–16 KiB (like a
    Python tree), `large_files` files of `large_bytes` (like CUDA libraries), a few entries only
    root may read (Enroot's fixperms has work to do). Returns (tag, bytes of file data)."""
    spec = f"{FORMAT_VERSION}:{small_files}:{large_files}:{large_bytes}"
    tag = f"{IMAGE_REPO}/export:{hashlib.sha256(spec.encode()).hexdigest()[:12]}"
    rng = random.Random(7)
    small_sizes = [rng.randint(200, 16 << 10) for _ in range(small_files)]
    total = sum(small_sizes) + large_files * large_bytes

    def write(tar: tarfile.TarFile) -> None:
        add_busybox(tar)
        data_rng = random.Random(11)
        _add_dir(tar, "usr/lib/python3")
        _add_dir(tar, "usr/lib/python3/dist-packages")
        per_dir = 200
        for index, size in enumerate(small_sizes):
            if index % per_dir == 0:
                _add_dir(tar, f"usr/lib/python3/dist-packages/pkg{index // per_dir:04d}")
            name = f"usr/lib/python3/dist-packages/pkg{index // per_dir:04d}/mod{index:06d}.py"
            _add_file(tar, name, data_rng.randbytes(size))
        _add_dir(tar, "opt/big")
        for index in range(large_files):
            _add_file(tar, f"opt/big/lib{index:02d}.so", size=large_bytes,
                      source=RandomStream(large_bytes, seed=100 + index), mode=0o755)
        _add_dir(tar, "opt/private", 0o500)  # no u+w: Enroot's fixperms adds it
        _add_file(tar, "opt/private/secret.conf", b"x = 1\n", mode=0o000)
        _add_dir(tar, "workspace")

    if not image_exists(tag):
        _import(tag, write, ("ENV PATH=/usr/bin:/bin", "ENV LANG=C.UTF-8", "WORKDIR /workspace",
                             'CMD ["/bin/sh"]'))
    return tag, total


def context_tree(root: Path, files: int, *, per_dir: int = 100, seed: int = 3) -> int:
    """`files` small source files (0.1–4 KiB) under `root`, `per_dir` per directory, with fixed
    mtimes. Returns the bytes written."""
    rng = random.Random(seed)
    written = 0
    for index in range(files):
        directory = root / f"pkg{index // per_dir:04d}"
        if index % per_dir == 0:
            directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"mod{index:06d}.py"
        data = rng.randbytes(rng.randint(50, 2048)).hex().encode()  # text, like source code
        path.write_bytes(data)
        os.utime(path, (FIXED_MTIME, FIXED_MTIME))
        written += len(data)
    return written


def remove_images(tags: list[str]) -> None:
    if tags:
        subprocess.run(["docker", "image", "rm", "--force", *tags], capture_output=True)


def docker_ok() -> None:
    run(["docker", "version", "--format", "{{.Server.Version}}"])
