"""The tar filter of an export: `docker export`'s stream in, the rootfs `enroot import` makes out.

Pure stream code over two file descriptors (no engine, no mksquashfs), so it is tested on
hand-made archives. What it does, as Enroot does it: drops `dev/*` contents and `.dockerenv`,
fixes permissions (u+rX everywhere, u+w on directories up to depth 15), writes `/etc/environment`,
`/etc/rc`, `/etc/rc.local` and `/etc/fstab` from the image config (see `enroot`) and creates the
working directory. Unlike Enroot, it leaves the labels a build sets from outside the key (the
layer's name, the git commit: refs.UNKEYED_LABELS) out of `/etc/rc`: the bytes follow from the
key alone. Ownership is left to mksquashfs (`-all-root`).

It parses each 512-byte header, drops or patches it, and moves file bodies from one pipe to the
other with splice(2), so the 25 GB of file data never passes through Python. Deterministic: the
entries `docker create` adds at container creation (.dockerenv, /dev, /etc/hosts & co., the
working directory) get a fixed time, and so do the written files; file times are clamped to the
image's time clamp (see `time_clamp`): the files a build writes carry its wall-clock time, which
would make two builds of one key differ, while the base's files keep their times (a
timestamp-checked `.pyc` is only valid against its source's mtime).
"""

from __future__ import annotations

import datetime
import errno
import os
from collections.abc import Callable, Iterable

import attrs

from efabuild.export.enroot import ImageConfig, enroot_files
from efabuild.refs import UNKEYED_LABELS

# recorded with every artifact as its export option `rc_labels`: /etc/rc holds only the labels the
# key decides (absent: exported before, with the layer's name and git commit there too)
RC_LABELS = "keyed"
from efabuild.export.tarheader import (
    BLOCK, TarFormatError, checksum, has_body, header_block, number, padded, parse_pax, pax_block, seal,
    set_number, ustar_linkname, ustar_name,
)

_READ_CHUNK = 1 << 20
_SPLICE_MIN = 128 << 10  # bodies this large bypass Python: splice(2) pipe to pipe
_PROGRESS_EVERY = 64 << 20
WRITTEN_MODE = 0o644  # the files written from the config, unless the image had its own copy (its mode)
ENROOT_FIXPERMS_DEPTH = 15  # Enroot ≥ 4.0: find rootfs -maxdepth 15 -type d ! -perm -u=w -exec chmod u+w
# paths `docker create` adds to the rootfs (its init layer) when the image lacks them; their
# mtimes are the container's creation time, so they are pinned to the export's epoch
INIT_LAYER_PATHS = (
    "dev", "dev/pts", "dev/shm", "dev/console", "proc", "sys", "etc",
    "etc/hostname", "etc/hosts", "etc/resolv.conf", "etc/mtab",
)
# What `docker create`'s init layer puts in every container, over the image's own copies:
# (path, tar type, mode, link target). A build's `type=tar` output lacks them (RewritePlan.init_layer).
_INIT_LAYER_ENTRIES = (
    ("dev", b"5", 0o755, ""), ("proc", b"5", 0o755, ""), ("sys", b"5", 0o755, ""), ("etc", b"5", 0o755, ""),
    ("etc/hostname", b"0", 0o755, ""), ("etc/hosts", b"0", 0o755, ""),
    ("etc/mtab", b"2", 0o777, "/proc/mounts"), ("etc/resolv.conf", b"0", 0o755, ""),
)
INIT_LAYER_FILES = frozenset(path for path, kind, _, _ in _INIT_LAYER_ENTRIES if kind != b"5")


def ancestors(path: str) -> list[str]:
    """'a/b/c' → ['a', 'a/b', 'a/b/c']."""
    parts = [p for p in path.split("/") if p]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def norm_path(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name.strip("/") if name not in ("", ".", "./") else ""


@attrs.frozen
class RewritePlan:
    """What the tar filter does to an image's flattened filesystem: pure data, built from the config."""

    files: tuple[tuple[str, str], ...]  # rootfs-relative path → text written at the end
    workdir: str  # rootfs-relative, "" for /
    pinned: frozenset[str]  # entries whose mtime becomes `epoch`
    replaced: frozenset[str]  # the image's own copies of `files`, dropped
    epoch: int = 0
    clamp: int | None = None  # every other entry's mtime becomes min(mtime, clamp)
    # the stream is a build's root filesystem, not `docker export`'s: add what a container's init
    # layer would, so both give the same .sqsh
    init_layer: bool = False

    @classmethod
    def for_config(cls, cfg: ImageConfig, *, epoch: int = 0, clamp: int | None = None,
                   init_layer: bool = False) -> RewritePlan:
        workdir = norm_path(cfg.workdir)
        pinned = set(INIT_LAYER_PATHS) | set(ancestors(workdir))
        for volume in cfg.volumes:  # docker create makes volume mount points too
            pinned.update(ancestors(norm_path(volume)))
        files = tuple(enroot_files(cfg.without_labels(UNKEYED_LABELS)).items())
        return cls(
            files=files,
            workdir=workdir,
            pinned=frozenset(pinned),
            replaced=frozenset(path for path, _ in files),
            epoch=epoch,
            clamp=clamp,
            init_layer=init_layer,
        )

    def mtime(self, path: str, mtime: float) -> float:
        """The time an entry gets in the .sqsh."""
        if path in self.pinned:
            return self.epoch
        if self.clamp is not None and mtime > self.clamp:
            return self.clamp
        return mtime

    def wanted_dirs(self) -> list[str]:
        return list(dict.fromkeys(ancestors(self.workdir) + [p for f, _ in self.files for p in ancestors(f)[:-1]]))

    def drops(self, path: str) -> bool:
        return path == ".dockerenv" or path.startswith("dev/") or path in self.replaced


def fixed_mode(mode: int, *, is_dir: bool, depth: int) -> int:
    """Enroot's fixperms: `chmod -R u+rX`, then u+w on directories at depth ≤ 15."""
    mode |= 0o400
    if is_dir or mode & 0o111:
        mode |= 0o100
    if is_dir and depth <= ENROOT_FIXPERMS_DEPTH:
        mode |= 0o200
    return mode


# ---------------------------------------------------------------- the streaming filter


class _Pipe:
    """Buffered reads from `src`, batched writes to `dst`; large bodies move with splice(2)."""

    def __init__(self, src: int, dst: int, progress: Callable[[int], None] | None) -> None:
        self.src, self.dst = src, dst
        self.buf = bytearray()
        self.pos = 0
        self.out: list[bytes] = []
        self.out_len = 0
        self.consumed = 0  # bytes read from src and handled
        self._progress = progress
        self._next_report = _PROGRESS_EVERY
        self._splice = hasattr(os, "splice")

    def _avail(self) -> int:
        return len(self.buf) - self.pos

    def _fill(self, n: int) -> bool:
        while self._avail() < n:
            if self.pos:
                del self.buf[: self.pos]
                self.pos = 0
            chunk = os.read(self.src, max(_READ_CHUNK, n - self._avail()))
            if not chunk:
                return False
            self.buf += chunk
        return True

    def take(self, n: int) -> bytes:
        if not self._fill(n):
            raise TarFormatError("the exported tar stream ended early")
        data = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        self._count(n)
        return data

    def _count(self, n: int) -> None:
        self.consumed += n
        if self._progress and self.consumed >= self._next_report:
            self._next_report = self.consumed + _PROGRESS_EVERY
            self._progress(self.consumed)

    def emit(self, data: bytes) -> None:
        self.out.append(data)
        self.out_len += len(data)
        if self.out_len >= _READ_CHUNK:
            self.flush()

    def flush(self) -> None:
        data = b"".join(self.out)
        self.out.clear()
        self.out_len = 0
        view = memoryview(data)
        while view:
            view = view[os.write(self.dst, view) :]

    def copy(self, n: int, *, keep: bool = True) -> None:
        """Pass (or with keep=False, discard) the next n bytes."""
        here = min(n, self._avail())
        if keep and here:
            self.emit(bytes(self.buf[self.pos : self.pos + here]))
        self.pos += here
        self._count(here)
        rest = n - here
        if keep and rest >= _SPLICE_MIN and self._splice:
            self.flush()
            while rest:
                try:
                    moved = os.splice(self.src, self.dst, rest)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    self._splice = False  # neither end is a pipe: copy through Python instead
                    break
                if not moved:
                    raise TarFormatError("the exported tar stream ended early")
                rest -= moved
                self._count(moved)
        if rest:
            data = self.take(rest)
            if keep:
                self.emit(data)

    def drain(self) -> None:
        """Read what follows the end-of-archive blocks so the writer exits normally."""
        self.consumed += self._avail()
        self.pos = len(self.buf)
        while chunk := os.read(self.src, _READ_CHUNK):
            self.consumed += len(chunk)


def rewrite_tar(src: int, dst: int, plan: RewritePlan, progress: Callable[[int], None] | None = None) -> int:
    """Filter the tar stream on fd `src` into fd `dst` as `plan` says; returns bytes read."""
    return _Filter(_Pipe(src, dst, progress), plan).run()


class _Filter:
    """One pass over a tar stream: each header is dropped, kept or patched, then the files
    written from the config are appended."""

    def __init__(self, pipe: _Pipe, plan: RewritePlan) -> None:
        self.pipe, self.plan = pipe, plan
        self.seen: dict[str, bytes] = {}  # path → typeflag, to add only missing parent directories
        self.replaced_modes: dict[str, int] = {}
        # hard links to a file written from the config: Enroot overwrites the shared inode in
        # place, so these paths get the written text too
        self.aliases: dict[str, str] = {}
        self.init_layer = _InitLayer(plan.epoch) if plan.init_layer else None
        self._next_entry()

    def _next_entry(self) -> None:
        self.extensions: list[bytes] = []  # pax / GNU long-name blocks that belong to the next entry
        self.pax: dict[str, str] = {}
        self.long_name: str | None = None
        self.long_link: str | None = None

    def run(self) -> int:
        pipe = self.pipe
        while True:
            header = bytearray(pipe.take(BLOCK))
            if not any(header):
                break  # end of archive
            if number(header[148:156]) != checksum(header):
                raise TarFormatError("the exported tar stream has a corrupt header")
            typeflag = bytes(header[156:157])
            size = number(header[124:136])
            if typeflag in (b"x", b"L", b"K"):
                self._extension(header, typeflag, size)
                continue
            if typeflag == b"g":  # global pax header: applies to the whole archive, keep as is
                pipe.emit(bytes(header))
                pipe.copy(padded(size))
                continue
            self._entry(header, typeflag, int(self.pax["size"]) if "size" in self.pax else size)
            self._next_entry()
        for block in self.init_layer.rest(self.seen) if self.init_layer is not None else ():
            pipe.emit(block)
        for block in _appended(self.plan, self.seen, self.replaced_modes, self.aliases):
            pipe.emit(block)
        pipe.emit(b"\0" * (2 * BLOCK))
        pipe.flush()
        pipe.drain()
        return pipe.consumed

    def _extension(self, header: bytearray, typeflag: bytes, size: int) -> None:
        data = self.pipe.take(padded(size))
        self.extensions.append(bytes(header) + data)
        if typeflag == b"x":
            self.pax.update(parse_pax(data[:size]))
        elif typeflag == b"L":
            self.long_name = data[:size].rstrip(b"\0").decode("utf-8", "surrogateescape")
        else:
            self.long_link = data[:size].rstrip(b"\0").decode("utf-8", "surrogateescape")

    def _entry(self, header: bytearray, typeflag: bytes, size: int) -> None:
        plan, pax = self.plan, self.pax
        path = norm_path(pax.get("path") or self.long_name or ustar_name(header))
        link_target = (norm_path(pax.get("linkpath") or self.long_link or ustar_linkname(header))
                       if typeflag == b"1" else "")
        body = padded(size if has_body(typeflag) else 0)
        if self.init_layer is not None and not plan.drops(path):
            for block in self.init_layer.before(path, self.seen):
                self.pipe.emit(block)
        if link_target in plan.replaced and not plan.drops(path):
            self.aliases[path] = link_target
        elif plan.drops(path) or (self.init_layer is not None and path in INIT_LAYER_FILES):
            if path in plan.replaced and typeflag in (b"0", b"\0"):
                self.replaced_modes[path] = fixed_mode(number(header[100:108]) & 0o7777, is_dir=False, depth=0)
            self.pipe.copy(body, keep=False)
        else:
            changed = self._patch(header, typeflag, path)
            for block in self.extensions:
                self.pipe.emit(block)
            self.pipe.emit(bytes(seal(header) if changed else header))
            self.seen[path] = typeflag
            self.pipe.copy(body)

    def _patch(self, header: bytearray, typeflag: bytes, path: str) -> bool:
        """Enroot's modes and the plan's times, in place; whether the header changed."""
        changed = False
        if typeflag != b"2":  # chmod does not touch symlinks
            mode = number(header[100:108])
            perms = fixed_mode(mode & 0o7777, is_dir=typeflag == b"5", depth=path.count("/") + 1)
            if perms != mode & 0o7777:
                set_number(header, 100, 8, (mode & ~0o7777) | perms)
                changed = True
        pax = self.pax
        mtime = float(pax["mtime"]) if "mtime" in pax else number(header[136:148])
        new_mtime = self.plan.mtime(path, mtime)
        if new_mtime != mtime:
            set_number(header, 136, 12, int(new_mtime))
            changed = True
            if "mtime" in pax:
                pax["mtime"] = f"{int(new_mtime)}.0"  # mksquashfs 4.6 refuses a pax time without a point
                self.extensions = [b for b in self.extensions if b[156:157] != b"x"] + [pax_block(pax)]
        return changed


class _InitLayer:
    """The entries of a container's init layer, put where `docker export` has them: its walk
    visits each directory's names in byte order, and mksquashfs numbers inodes in stream order,
    so the same entries elsewhere in the stream would give other bytes."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.pending = sorted(_INIT_LAYER_ENTRIES, key=lambda entry: _walk_key(entry[0]))

    def before(self, path: str, seen: dict[str, bytes]) -> Iterable[bytes]:
        """The entries that come before `path`, and `path` itself when it is one of them: the
        stream's copy is then dropped for it (a directory stays the stream's)."""
        key = _walk_key(path)
        while self.pending and _walk_key(self.pending[0][0]) <= key:
            name, kind, mode, target = self.pending.pop(0)
            if name == path and kind == b"5":
                continue
            seen[name] = kind
            yield header_block(name + "/" if kind == b"5" else name, typeflag=kind, mode=mode, mtime=self.epoch,
                               linkname=target)

    def rest(self, seen: dict[str, bytes]) -> Iterable[bytes]:
        """Those the stream had nothing after."""
        yield from self.before("\U0010ffff", seen)


def _walk_key(path: str) -> tuple[bytes, ...]:
    return tuple(part.encode("utf-8", "surrogateescape") for part in path.split("/"))


def _appended(plan: RewritePlan, seen: dict[str, bytes], modes: dict[str, int],
              aliases: dict[str, str] | None = None) -> Iterable[bytes]:
    """Missing directories (etc, the working directory) and the files written from the config,
    also at the paths that were hard links to them."""
    for directory in plan.wanted_dirs():
        kind = seen.get(directory)
        if kind is None:
            seen[directory] = b"5"
            yield header_block(directory + "/", typeflag=b"5", mode=0o755, mtime=plan.epoch)
        elif kind != b"5":
            break  # a symlink or file on the way: leave the image as it is
    for path, text in plan.files:
        data = text.encode("utf-8", "surrogateescape")
        for written in [path] + [alias for alias, target in (aliases or {}).items() if target == path]:
            yield header_block(written, typeflag=b"0", mode=modes.get(path, WRITTEN_MODE), size=len(data), mtime=plan.epoch)
            yield data + b"\0" * (padded(len(data)) - len(data))


# ---------------------------------------------------------------- the time clamp


def time_clamp(created: Iterable[str]) -> int | None:
    """The latest of an image's creation times (its config's and its history's), in whole
    seconds: no file of its base is newer than the base's own creation, and efabuild's build
    steps are all dated SOURCE_DATE_EPOCH, so this is the base's time, pinned by its digest."""
    times = []
    for text in created:
        text = text.strip()
        if not text:
            continue
        # RFC 3339 with up to nanoseconds; fromisoformat takes at most microseconds
        head, dot, rest = text.partition(".")
        if dot:
            digits = len(rest) - len(rest.lstrip("0123456789"))
            text = head + "." + rest[:min(digits, 6)] + rest[digits:]
        try:
            times.append(datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())
        except ValueError:
            continue
    return int(max(times)) if times else None
