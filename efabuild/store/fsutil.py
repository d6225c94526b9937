"""Crash-safe file operations: temp file in the same filesystem, fsync, then rename or link."""

from __future__ import annotations

import errno
import os
import re
import secrets
import socket
from pathlib import Path

from efabuild.progress import Progress

COPY_CHUNK = 64 * 1024 * 1024


_TEMP = re.compile(r"efatmp\.(?P<host>[^.]+)\.(?P<pid>[0-9]+)\.[0-9a-f]{8}\.")


def temp_name(tmp_dir: Path, stem: str, suffix: str) -> Path:
    """A unique temp path naming its owner, so gc can tell a live writer's file from debris."""
    host = socket.gethostname().split(".")[0] or "host"
    return tmp_dir / f"efatmp.{host}.{os.getpid()}.{secrets.token_hex(4)}.{stem}{suffix}"


def parse_temp_owner(name: str) -> tuple[str, int] | None:
    """(host, pid) from a temp_name() file name; None for any other file."""
    match = _TEMP.match(name)
    return (match["host"], int(match["pid"])) if match else None


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, tmp_dir: Path, mode: int = 0o644) -> None:
    """Replace `path` with `data` so readers see the old or the new content, never a mix."""
    tmp_dir.mkdir(parents=True, exist_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(tmp_dir, path.name, ".part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def same_filesystem(a: Path, b: Path) -> bool:
    return os.stat(a).st_dev == os.stat(b).st_dev


def copy_file(source: Path, dest: Path, progress: Progress | None = None) -> None:
    """Copy into a new file `dest` (must not exist) and fsync it; the kernel copies when it can."""
    with open(source, "rb") as src, open(dest, "xb") as dst:
        total = os.fstat(src.fileno()).st_size
        done = 0
        in_kernel = True
        while done < total:
            count = 0
            if in_kernel:
                try:
                    count = os.copy_file_range(src.fileno(), dst.fileno(), min(COPY_CHUNK, total - done))
                except OSError as exc:
                    if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                        raise
                    in_kernel = False
            if not in_kernel:
                chunk = src.read(min(8 * 1024 * 1024, total - done))
                dst.write(chunk)
                count = len(chunk)
            if count == 0:
                raise OSError(errno.EIO, f"{source} shrank while being copied")
            done += count
            if progress:
                progress.update(count)
        dst.flush()
        os.fsync(dst.fileno())
