"""The layers an image adds over its ancestor, as OCI layer tars read from the engine's overlay2
directories: only what changed is read, never the whole root filesystem.

The local dockerd's overlay2 driver keeps each layer as a directory (`docker image inspect`:
`GraphDriver.Data.UpperDir`, the top layer, and `LowerDir`, the ones below, top first). A deleted
file is a character device 0:0 there and a directory made opaque carries the
`trusted.overlay.opaque=y` xattr; the tar has them as `.wh.NAME` and `DIR/.wh..wh..opq`, as an OCI
layer does. The directory is the engine's, but what a build put in it is data: the walk opens each
directory from its parent's descriptor without following a link (a symlink is an entry, never a way
out), and reads each file through one descriptor, no more bytes than its stat said.
"""

from __future__ import annotations

import io
import os
import stat
import sys
import tarfile
import threading
from collections.abc import Sequence
from typing import BinaryIO

from efabuild.errors import EfabuildError

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
_OPAQUE_XATTR = "trusted.overlay.opaque"
_NOFOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


class LayerSourceUnavailable(EfabuildError):
    """The engine cannot give the layers' diffs (another storage driver, a remote engine, no access)."""


def overlay_dirs(graph_driver: dict, layers: int) -> list[str]:
    """The diff directories of an image's top `layers` layers, oldest first, from its inspected
    `GraphDriver`; LayerSourceUnavailable for another driver or fewer directories than layers."""
    name = graph_driver.get("Name") or graph_driver.get("name") or ""
    if name != "overlay2":
        raise LayerSourceUnavailable(f"the engine's storage driver is {name or 'unknown'}, not overlay2")
    data = graph_driver.get("Data") or graph_driver.get("data") or {}
    upper = data.get("UpperDir") or ""
    lower = [d for d in (data.get("LowerDir") or "").split(":") if d]
    dirs = ([upper] if upper else []) + lower  # top first
    if layers > len(dirs):
        raise LayerSourceUnavailable(f"the engine lists {len(dirs)} layer directories, {layers} needed")
    return list(reversed(dirs[:layers]))


def layer_tar(diff_dir: str, out: BinaryIO) -> int:
    """Write the overlay2 diff directory `diff_dir` to `out` as an uncompressed OCI layer tar
    (names sorted, so the same layer gives the same stream); returns the bytes written."""
    try:
        root = os.open(diff_dir, _NOFOLLOW | os.O_DIRECTORY)
    except OSError as exc:
        raise LayerSourceUnavailable(f"cannot read the layer directory {diff_dir}: {exc.strerror}") from None
    counted = _Counting(out)
    try:
        with tarfile.open(fileobj=counted, mode="w|", format=tarfile.PAX_FORMAT, bufsize=_CHUNK) as tar:
            _walk(tar, root, "", {})
    finally:
        os.close(root)
    return counted.written


def stream_layers(diff_dirs: Sequence[str]) -> list[BinaryIO]:
    """One readable stream per directory, each filled by its own thread through a pipe: nothing is
    staged on disk. A stream that fails ends early and `errors` (on each stream) says why."""
    streams = []
    for diff_dir in diff_dirs:
        read_fd, write_fd = os.pipe()
        reader = os.fdopen(read_fd, "rb", buffering=_CHUNK)
        reader.errors_seen = []  # type: ignore[attr-defined]
        threading.Thread(target=_fill, args=(diff_dir, write_fd, reader.errors_seen), daemon=True).start()
        streams.append(reader)
    return streams


def _fill(diff_dir: str, write_fd: int, errors: list[str]) -> None:
    with os.fdopen(write_fd, "wb", buffering=_CHUNK) as writer:
        try:
            layer_tar(diff_dir, writer)
        except BrokenPipeError:
            pass  # the reader stopped: it knows why
        except (OSError, EfabuildError) as exc:
            errors.append(f"{diff_dir}: {exc}")
        except RecursionError:  # a build may nest directories deeper than the walk goes
            errors.append(f"{diff_dir}: directories nested deeper than {sys.getrecursionlimit()} levels")


class _Counting(io.RawIOBase):
    def __init__(self, out: BinaryIO) -> None:
        self.out, self.written = out, 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # noqa: ANN001 - bytes-like
        self.out.write(data)
        self.written += len(data)
        return len(data)


def _walk(tar: tarfile.TarFile, dir_fd: int, prefix: str, links: dict[tuple[int, int], str]) -> None:
    """Every entry under the directory open as `dir_fd` (named `prefix` in the tar), depth first."""
    for name in sorted(os.listdir(dir_fd)):
        path = prefix + name
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if name.startswith(WHITEOUT):
            # a build's own file named .wh.X: in a layer tar it would delete X, where the image
            # (and a full export) has both; a whiteout of it would read as AUFS' and be ignored
            raise LayerSourceUnavailable(f"{path}: a name starting with {WHITEOUT} cannot go in a layer tar, "
                                         f"where it means a deletion")
        if stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:  # overlay's whiteout
            tar.addfile(_header(prefix + WHITEOUT + name, info, tarfile.REGTYPE, size=0))
        elif stat.S_ISDIR(info.st_mode):
            sub = os.open(name, _NOFOLLOW | os.O_DIRECTORY, dir_fd=dir_fd)
            try:
                tar.addfile(_header(path, os.fstat(sub), tarfile.DIRTYPE))
                if _opaque(sub):
                    tar.addfile(_header(f"{path}/{OPAQUE}", info, tarfile.REGTYPE, size=0))
                _walk(tar, sub, path + "/", links)
            finally:
                os.close(sub)
        elif stat.S_ISREG(info.st_mode):
            _add_file(tar, dir_fd, name, path, info, links)
        elif stat.S_ISLNK(info.st_mode):
            header = _header(path, info, tarfile.SYMTYPE)
            header.linkname = os.readlink(name, dir_fd=dir_fd)
            tar.addfile(header)
        elif stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
            header = _header(path, info, tarfile.CHRTYPE if stat.S_ISCHR(info.st_mode) else tarfile.BLKTYPE)
            header.devmajor, header.devminor = os.major(info.st_rdev), os.minor(info.st_rdev)
            tar.addfile(header)
        elif stat.S_ISFIFO(info.st_mode):
            tar.addfile(_header(path, info, tarfile.FIFOTYPE))
        # a socket has no place in a layer tar (docker export leaves it out too)


def _add_file(tar: tarfile.TarFile, dir_fd: int, name: str, path: str, info: os.stat_result,
              links: dict[tuple[int, int], str]) -> None:
    if info.st_nlink > 1:
        first = links.setdefault((info.st_dev, info.st_ino), path)
        if first != path:  # a hard link to a file already in this layer
            header = _header(path, info, tarfile.LNKTYPE, size=0)
            header.linkname = first
            tar.addfile(header)
            return
    fd = os.open(name, _NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    with os.fdopen(fd, "rb", buffering=0) as f:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
            raise EfabuildError(f"{path}: changed while the layer was read")
        tar.addfile(_header(path, opened, tarfile.REGTYPE), _Bounded(f, opened.st_size, path))


class _Bounded(io.RawIOBase):
    """Exactly `size` bytes of `f`: a file that grew is cut at its stat's size, one that shrank fails."""

    def __init__(self, f: BinaryIO, size: int, path: str) -> None:
        self.f, self.left, self.path = f, size, path

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self.f.read(n) if n else b""
        if len(data) < n:  # a regular file reads short only at its end
            raise EfabuildError(f"{self.path}: shorter than its size while the layer was read")
        self.left -= len(data)
        return data


def _opaque(dir_fd: int) -> bool:
    try:
        return os.getxattr(dir_fd, _OPAQUE_XATTR) == b"y"
    except OSError:  # no such xattr (ENODATA), or none readable here
        return False


def _header(path: str, info: os.stat_result, kind: bytes, size: int | None = None) -> tarfile.TarInfo:
    header = tarfile.TarInfo(path)
    header.type = kind
    header.mode = stat.S_IMODE(info.st_mode)
    header.uid, header.gid = info.st_uid, info.st_gid
    header.uname = header.gname = ""
    header.mtime = int(info.st_mtime)  # squashfs keeps whole seconds
    header.size = info.st_size if size is None and kind == tarfile.REGTYPE else 0 if size is None else size
    return header
