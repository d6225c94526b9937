"""Tar archives and full exports for tests that compare `.sqsh` files: a filesystem as data
(`Item` by path), its tar (hard links as tar links), and the full export of it the way the real
one runs (the export's tar filter, then `mksquashfs - OUT -tar` with the export's options)."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import attrs

from efabuild.export.squash import mksquashfs_options
from efabuild.export.tarfilter import RewritePlan, rewrite_tar
from efabuild.settings import ExportSettings

T0 = 1_700_000_000


@attrs.frozen
class Item:
    """One entry: kind f (file), d, l (symlink), c, b (devices), p (fifo); files with the same
    `inode` are hard links of one another."""

    kind: str
    mode: int = 0o644
    mtime: int = T0
    data: bytes = b""
    target: str = ""
    dev: tuple[int, int] = (0, 0)
    inode: int | None = None


_TYPES = {"f": tarfile.REGTYPE, "d": tarfile.DIRTYPE, "l": tarfile.SYMTYPE, "h": tarfile.LNKTYPE,
          "c": tarfile.CHRTYPE, "b": tarfile.BLKTYPE, "p": tarfile.FIFOTYPE}


def add_entry(tar: tarfile.TarFile, name: str, kind: str = "f", mode: int = 0o644, data: bytes = b"", *,
              uid: int = 0, gid: int = 0, link: str = "", xattrs: dict[str, str] | None = None,
              mtime: int = T0) -> None:
    """One entry of kind f (file), d, l (symlink) or h (hard link to `link`) added to `tar`,
    owned by uid:gid, with pax xattrs when given."""
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime, info.uid, info.gid = _TYPES[kind], mode, mtime, uid, gid
    if xattrs:
        info.pax_headers = {f"SCHILY.xattr.{key}": value for key, value in xattrs.items()}
    if kind in "lh":
        info.linkname = link
    elif kind == "f":
        info.size = len(data)
    tar.addfile(info, io.BytesIO(data) if kind == "f" else None)


def tar_entries(entries: list[tuple[str, str, int, int, object]]) -> bytes:
    """(name, kind f|d|l|h|c|b|p, mode, mtime, bytes | link target | (major, minor)) → a pax tar."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, mode, mtime, payload in entries:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime, info.uid, info.gid = _TYPES[kind], mode, mtime, 1000, 1000
            if kind in "lh":
                info.linkname = str(payload)
            elif kind in "cb":
                info.devmajor, info.devminor = payload  # type: ignore[misc]
            if kind == "f":
                info.size = len(payload)  # type: ignore[arg-type]
                tar.addfile(info, io.BytesIO(payload))  # type: ignore[arg-type]
            else:
                tar.addfile(info)
    return buf.getvalue()


def walk_key(path: str) -> tuple[str, ...]:
    return tuple(path.split("/"))


def tree_tar(tree: dict[str, Item]) -> bytes:
    """The whole tree as one tar, parents first; the first path of an inode carries its data."""
    first: dict[int, str] = {}
    entries = []
    for path in sorted(tree, key=walk_key):
        item = tree[path]
        if item.inode is not None and item.inode in first:
            entries.append((path, "h", item.mode, item.mtime, first[item.inode]))
            continue
        if item.inode is not None:
            first[item.inode] = path
        entries.append(entry_of(path, item))
    return tar_entries(entries)


def entry_of(path: str, item: Item) -> tuple[str, str, int, int, object]:
    payload = {"f": item.data, "l": item.target, "c": item.dev, "b": item.dev}.get(item.kind)
    return (path, item.kind, item.mode, item.mtime, payload)


def full_export(tar: bytes, out: Path, plan: RewritePlan, options: ExportSettings = ExportSettings(),
                extra: tuple[str, ...] = ()) -> Path:
    """`tar` through the export's filter into mksquashfs with the export's options (and `extra`)."""
    raw, filtered = out.with_suffix(".in.tar"), out.with_suffix(".tar")
    raw.write_bytes(tar)
    with open(raw, "rb") as fin, open(filtered, "wb") as fout:
        rewrite_tar(fin.fileno(), fout.fileno(), plan)
    with open(filtered, "rb") as fin:
        subprocess.run(["mksquashfs", "-", str(out), *mksquashfs_options(options, epoch=plan.epoch), *extra],
                       stdin=fin, check=True, capture_output=True)
    raw.unlink()
    filtered.unlink()
    return out
