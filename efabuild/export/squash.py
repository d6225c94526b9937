"""An engine image → an Enroot-compatible `.sqsh`, streamed without unpacking the rootfs.

    docker create + docker export ──tar──► rewrite (this module) ──tar──► mksquashfs - OUT -tar

The result matches `enroot import dockerd://IMAGE`: no `dev/*` contents and no `.dockerenv`,
everything owned by root, permissions fixed as Enroot fixes them (u+rX everywhere, u+w on
directories up to depth 15), `/etc/environment`, `/etc/rc`, `/etc/rc.local` and `/etc/fstab` written
from the image config (see `imagecfg`), the working directory present, and Enroot's compression
options (`-comp lzo -noD` unless BUILD.toml says otherwise).

The rewrite is a tar header filter: it parses each 512-byte header, drops or patches it, and moves
file bodies from `docker export`'s pipe to mksquashfs' pipe with splice(2), so the 25 GB of file
data never passes through Python. Deterministic: the entries `docker create` adds at container
creation (.dockerenv, /dev, /etc/hosts & co., the working directory) get a fixed time, and so do
the root directory, the written files and the superblock; the same image then gives a
byte-identical `.sqsh`. File times are clamped to the image's time clamp (see `time_clamp`): the
files a build writes carry its wall-clock time, which would make two builds of one key differ,
while the base's files keep their times (a timestamp-checked `.pyc` is only valid against its
source's mtime).

The digests take a second pass: mksquashfs seeks back to write its tables and superblock, so no
single pass over its output sees the final bytes in order. The file is hashed right after
mksquashfs exits, from the page cache, through one mmap: blake3 (what the store checks) and
sha256 (what in-toto and cosign verifiers match) in parallel threads (sha256 is the slower one,
about 1 s per GB here, against minutes of squashing for a training image).
"""

from __future__ import annotations

import errno
import os
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs

from efabuild.store.digest import file_digest, file_digests
from efabuild.errors import EfabuildError, InputError, NotFound
from efabuild.export.enroot import ImageConfig, enroot_files
from efabuild.model import ExportSettings
from efabuild.store.owner import Owner
from efabuild.grammar import extra_options_problem
from efabuild.build.stops import step_boundary
from efabuild.store.fsutil import fsync_dir

# progress(bytes streamed so far, expected total or None)
Progress = Callable[[int, "int | None"], None]

BLOCK = 512
_READ_CHUNK = 1 << 20
_SPLICE_MIN = 128 << 10  # bodies this large bypass Python: splice(2) pipe to pipe
_PIPE_SIZE = 1 << 20
_PROGRESS_EVERY = 64 << 20
EXPORT_LABEL = "org.efabuild.export"  # on the temporary container: the .sqsh being written
OWNER_LABEL = "org.efabuild.store.owner"  # …and the process exporting (efabuild.engine.leftovers)
# The Enroot release whose `enroot import` output an export reproduces; recorded with every
# artifact, since the same key gives the same bytes only within one format.
ENROOT_FORMAT = "4.1.2"
ENROOT_FIXPERMS_DEPTH = 15  # Enroot ≥ 4.0: find rootfs -maxdepth 15 -type d ! -perm -u=w -exec chmod u+w
# paths `docker create` adds to the rootfs (its init layer) when the image lacks them; their
# mtimes are the container's creation time, so they are pinned to the export's epoch
_INIT_LAYER_PATHS = (
    "dev", "dev/pts", "dev/shm", "dev/console", "proc", "sys", "etc",
    "etc/hostname", "etc/hosts", "etc/resolv.conf", "etc/mtab",
)


@attrs.frozen
class ExportResult:
    path: Path
    size: int
    digest: str  # "blake3:<64 hex>" of the .sqsh file
    options: tuple[str, ...]  # the mksquashfs options used, for the artifact's record
    seconds: float
    sha256: str | None = None  # hex sha256 of the .sqsh file, for in-toto/cosign verifiers
    time_clamp: int | None = None  # file times later than this were set to it; None: times kept


# ---------------------------------------------------------------- pure: options and the plan


def mksquashfs_options(options: ExportSettings, *, epoch: int = 0) -> tuple[str, ...]:
    """Every mksquashfs option of an export, input and output paths aside.

    Extra options are checked here too, not only when BUILD.toml is read: whatever builds the
    settings, no pseudo-file or path option reaches mksquashfs.
    """
    problem = extra_options_problem(options.extra_options)
    if problem:
        raise InputError(problem, "[export] extra_options")
    return (
        "-tar", "-noappend", "-all-root", "-no-xattrs",
        # a tar stream has no root directory entry: give it the one Enroot's rootfs dir has
        "-root-mode", "755", "-root-time", str(epoch), "-mkfs-time", str(epoch),
        "-exit-on-error", "-quiet", "-no-progress",
        *options.mksquashfs_options(),
    )


def _ancestors(path: str) -> list[str]:
    """'a/b/c' → ['a', 'a/b', 'a/b/c']."""
    parts = [p for p in path.split("/") if p]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def _norm(name: str) -> str:
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

    @classmethod
    def for_config(cls, cfg: ImageConfig, *, epoch: int = 0, clamp: int | None = None) -> RewritePlan:
        workdir = _norm(cfg.workdir)
        pinned = set(_INIT_LAYER_PATHS) | set(_ancestors(workdir))
        for volume in cfg.volumes:  # docker create makes volume mount points too
            pinned.update(_ancestors(_norm(volume)))
        files = tuple(enroot_files(cfg).items())
        return cls(
            files=files,
            workdir=workdir,
            pinned=frozenset(pinned),
            replaced=frozenset(path for path, _ in files),
            epoch=epoch,
            clamp=clamp,
        )

    def mtime(self, path: str, mtime: float) -> float:
        """The time an entry gets in the .sqsh."""
        if path in self.pinned:
            return self.epoch
        if self.clamp is not None and mtime > self.clamp:
            return self.clamp
        return mtime

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


# ---------------------------------------------------------------- tar headers


class TarFormatError(EfabuildError):
    pass


def _num(field: bytes) -> int:
    if field and field[0] & 0x80:  # GNU base-256 for values that do not fit in octal
        value = int.from_bytes(field, "big") & ~(0x80 << (8 * (len(field) - 1)))
        return value
    text = field.split(b"\0", 1)[0].strip(b" \0")
    return int(text, 8) if text else 0


def _checksum(header: bytes | bytearray) -> int:
    return sum(header[:148]) + 8 * 0x20 + sum(header[156:512])


def _set_num(header: bytearray, offset: int, width: int, value: int) -> None:
    text = f"{value:0{width - 1}o}".encode()
    if len(text) > width - 1:
        raise TarFormatError(f"value {value} does not fit a {width}-byte tar field")
    header[offset : offset + width] = text + b"\0"


def _seal(header: bytearray) -> bytearray:
    header[148:156] = f"{_checksum(header):06o}".encode() + b"\0 "
    return header


def _padded(size: int) -> int:
    return (size + BLOCK - 1) // BLOCK * BLOCK


def _parse_pax(data: bytes) -> dict[str, str]:
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def _pax_record(key: str, value: str) -> bytes:
    body = f" {key}={value}\n".encode("utf-8", "surrogateescape")
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length = len(str(length)) + len(body)
    return str(length).encode() + body


def _header(path: str, *, typeflag: bytes, mode: int, size: int = 0, mtime: int = 0) -> bytes:
    """A ustar header (with a pax `path` record first when the name is long)."""
    raw = path.encode("utf-8", "surrogateescape")
    out = b""
    if len(raw) > 100:
        pax = _pax_record("path", path)
        out = _header("././@PaxHeader", typeflag=b"x", mode=0o644, size=len(pax))
        out += pax + b"\0" * (_padded(len(pax)) - len(pax))
        raw = raw[-100:]
    h = bytearray(BLOCK)
    h[0 : len(raw)] = raw
    _set_num(h, 100, 8, mode)
    _set_num(h, 108, 8, 0)
    _set_num(h, 116, 8, 0)
    _set_num(h, 124, 12, size)
    _set_num(h, 136, 12, mtime)
    h[156:157] = typeflag
    h[257:265] = b"ustar\x0000"
    return out + bytes(_seal(h))


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
    pipe = _Pipe(src, dst, progress)
    seen: dict[str, bytes] = {}  # path → typeflag, to add only missing parent directories
    replaced_modes: dict[str, int] = {}
    extensions: list[bytes] = []  # pax / GNU long-name blocks that belong to the next entry
    pax: dict[str, str] = {}
    long_name: str | None = None
    long_link: str | None = None
    # hard links to a file written from the config: Enroot overwrites the shared inode in place,
    # so these paths get the written text too
    aliases: dict[str, str] = {}
    replaced = plan.replaced
    while True:
        header = bytearray(pipe.take(BLOCK))
        if not any(header):
            break  # end of archive
        if _num(header[148:156]) != _checksum(header):
            raise TarFormatError("the exported tar stream has a corrupt header")
        typeflag = bytes(header[156:157])
        size = _num(header[124:136])
        if typeflag in (b"x", b"L", b"K"):
            data = pipe.take(_padded(size))
            extensions.append(bytes(header) + data)
            if typeflag == b"x":
                pax.update(_parse_pax(data[:size]))
            elif typeflag == b"L":
                long_name = data[:size].rstrip(b"\0").decode("utf-8", "surrogateescape")
            else:
                long_link = data[:size].rstrip(b"\0").decode("utf-8", "surrogateescape")
            continue
        if typeflag == b"g":  # global pax header: applies to the whole archive, keep as is
            pipe.emit(bytes(header))
            pipe.copy(_padded(size))
            continue
        if "size" in pax:
            size = int(pax["size"])
        path = _norm(pax.get("path") or long_name or _ustar_name(header))
        link_target = _norm(pax.get("linkpath") or long_link or _ustar_linkname(header)) if typeflag == b"1" else ""
        if link_target in replaced and not plan.drops(path):
            aliases[path] = link_target
        elif plan.drops(path):
            if path in replaced and typeflag in (b"0", b"\0"):
                replaced_modes[path] = fixed_mode(_num(header[100:108]) & 0o7777, is_dir=False, depth=0)
            pipe.copy(_padded(size if _has_body(typeflag) else 0), keep=False)
        else:
            changed = False
            if typeflag != b"2":  # chmod does not touch symlinks
                mode = _num(header[100:108])
                perms = fixed_mode(mode & 0o7777, is_dir=typeflag == b"5", depth=path.count("/") + 1)
                if perms != mode & 0o7777:
                    _set_num(header, 100, 8, (mode & ~0o7777) | perms)
                    changed = True
            mtime = float(pax["mtime"]) if "mtime" in pax else _num(header[136:148])
            new_mtime = plan.mtime(path, mtime)
            if new_mtime != mtime:
                _set_num(header, 136, 12, int(new_mtime))
                changed = True
                if "mtime" in pax:
                    pax["mtime"] = str(int(new_mtime))
                    extensions = [b for b in extensions if b[156:157] != b"x"] + [_pax_block(pax)]
            for block in extensions:
                pipe.emit(block)
            pipe.emit(bytes(_seal(header) if changed else header))
            seen[path] = typeflag
            pipe.copy(_padded(size if _has_body(typeflag) else 0))
        extensions, pax, long_name, long_link = [], {}, None, None
    for block in _appended(plan, seen, replaced_modes, aliases):
        pipe.emit(block)
    pipe.emit(b"\0" * (2 * BLOCK))
    pipe.flush()
    pipe.drain()
    return pipe.consumed


def _ustar_linkname(header: bytearray) -> str:
    return bytes(header[157:257]).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _has_body(typeflag: bytes) -> bool:
    """Links, directories, devices and fifos carry no data; regular and unknown types do."""
    return typeflag not in (b"1", b"2", b"3", b"4", b"5", b"6")


def _ustar_name(header: bytearray) -> str:
    name = header[0:100].split(b"\0", 1)[0]
    if header[257:263] == b"ustar\0":  # POSIX ustar: a prefix field holds the leading part
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape")


def _pax_block(pax: dict[str, str]) -> bytes:
    data = b"".join(_pax_record(k, v) for k, v in pax.items())
    head = _header("././@PaxHeader", typeflag=b"x", mode=0o644, size=len(data))
    return head + data + b"\0" * (_padded(len(data)) - len(data))


def _appended(plan: RewritePlan, seen: dict[str, bytes], modes: dict[str, int],
              aliases: dict[str, str] | None = None) -> Iterable[bytes]:
    """Missing directories (etc, the working directory) and the files written from the config,
    also at the paths that were hard links to them."""
    wanted_dirs = _ancestors(plan.workdir) + [p for path, _ in plan.files for p in _ancestors(path)[:-1]]
    for directory in dict.fromkeys(wanted_dirs):
        kind = seen.get(directory)
        if kind is None:
            seen[directory] = b"5"
            yield _header(directory + "/", typeflag=b"5", mode=0o755, mtime=plan.epoch)
        elif kind != b"5":
            break  # a symlink or file on the way: leave the image as it is
    for path, text in plan.files:
        data = text.encode("utf-8", "surrogateescape")
        for written in [path] + [alias for alias, target in (aliases or {}).items() if target == path]:
            yield _header(written, typeflag=b"0", mode=modes.get(path, 0o644), size=len(data), mtime=plan.epoch)
            yield data + b"\0" * (_padded(len(data)) - len(data))


# ---------------------------------------------------------------- side effects: engine, mksquashfs


def _tail(f: Any) -> str:
    f.seek(0)
    return _last_line(f.read().decode(errors="replace"))


def _squash_error(f: Any) -> str:
    """mksquashfs' reason: its FATAL ERROR line, else its first `mksquashfs:` line (usage
    errors are followed by the whole help text), else its last line."""
    f.seek(0)
    lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    for line in reversed(lines):
        if "ERROR" in line:
            return line
    for line in lines:
        if line.startswith("mksquashfs:"):
            return line
    return lines[-1] if lines else ""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _squash_env() -> dict[str, str]:
    # with SOURCE_DATE_EPOCH set, mksquashfs clamps every file time to it and refuses the
    # explicit -mkfs-time: the export's times come from its options only
    return {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}


def _grow_pipe(fd: int) -> None:
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
    except (OSError, AttributeError, ImportError):
        pass  # a bigger pipe is only faster, never required


class ExportCancelled(EfabuildError):
    """The export was cancelled (Ctrl-C, SIGTERM): its processes were killed, nothing was kept."""

    exit_code = 130


_CANCEL_POLL_S = 0.1


def _kill_on_cancel(procs: list[subprocess.Popen], cancel: threading.Event, finished: threading.Event) -> None:
    while not finished.is_set():
        if cancel.wait(_CANCEL_POLL_S):
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
            return


def time_clamp(created: Iterable[str]) -> int | None:
    """The latest of an image's creation times (its config's and its history's), in whole
    seconds: no file of its base is newer than the base's own creation, and efabuild's build
    steps are all dated SOURCE_DATE_EPOCH, so this is the base's time, pinned by its digest."""
    import datetime

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


def _image_created(docker: Any, image: str, config_created: str) -> list[str]:
    docker_cmd = [str(part) for part in docker.client_config.docker_cmd]
    try:
        listed = subprocess.run([*docker_cmd, "image", "history", "--no-trunc", "--format", "{{.CreatedAt}}", image],
                                capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    except subprocess.TimeoutExpired:
        raise EfabuildError(f"export {image}: the engine did not list its history within 120 s") from None
    if listed.returncode != 0:
        raise EfabuildError(f"export {image}: cannot read its history: {_last_line(listed.stderr)}")
    return [config_created, *listed.stdout.splitlines()]


def _image_config(docker: Any, image: str) -> tuple[ImageConfig, int | None, str]:
    from python_on_whales.exceptions import DockerException, NoSuchImage

    try:
        inspected = docker.image.inspect(image)
    except NoSuchImage:
        raise NotFound(f"export {image}: no such image in the engine") from None
    except DockerException as exc:
        raise EfabuildError(f"export {image}: {_last_line(exc.stderr or '') or exc}") from None
    c = inspected.config
    cfg = ImageConfig.from_docker({
        "Env": c.env, "Labels": c.labels, "WorkingDir": c.working_dir,
        "Entrypoint": c.entrypoint, "Cmd": c.cmd, "Volumes": c.volumes,
    })
    created = inspected.created.isoformat() if inspected.created else ""
    return cfg, inspected.size, created


def export_image(
    image: str,
    out: Path,
    *,
    options: ExportSettings,
    docker: Any = None,
    progress: Progress | None = None,
    epoch: int = 0,
    sha256: bool = True,
    cancel: threading.Event | None = None,
) -> ExportResult:
    """Export `image` from the engine to the `.sqsh` file `out` (atomically replaced).

    `sha256=False` leaves the sha256 pass out (make runs it beside the manifest's probe). `epoch` is
    the time given to the superblock, the root directory, the written files and the
    entries the container's creation adds; with `options.clamp_times`, no other file is newer
    than the image's `time_clamp`. Raises NotFound for an unknown image, ExportCancelled when
    `cancel` is set meanwhile (docker export and mksquashfs are killed at once), EfabuildError
    with the failing tool's last message otherwise; each leaves no file and no container behind.
    """
    from python_on_whales import DockerClient
    from python_on_whales.exceptions import DockerException

    docker = docker or DockerClient()
    started = time.monotonic()
    out = Path(out).absolute()
    cfg, expected, created = _image_config(docker, image)
    clamp = time_clamp(_image_created(docker, image, created)) if options.clamp_times else None
    plan = RewritePlan.for_config(cfg, epoch=epoch, clamp=clamp)
    opts = mksquashfs_options(options, epoch=epoch)
    name = f"efabuild-export-{uuid.uuid4().hex[:12]}"
    try:
        # a command is given so images without CMD can be created; the container never starts.
        # The label names the export, so a leftover (the process was killed) can be found.
        docker.container.create(
            image, ["/bin/true"], name=name, pull="never",
            labels={EXPORT_LABEL: str(out), OWNER_LABEL: Owner.current().token},
        )
    except DockerException as exc:
        raise EfabuildError(f"export {image}: {_last_line(exc.stderr or '') or exc}") from None
    try:
        step_boundary("export")
        return _squash(docker, name, image, out, opts, plan, progress, expected, started, sha256, cancel)
    finally:
        try:
            docker.container.remove(name, force=True, volumes=True)
        except DockerException:
            pass  # already gone; nothing else to clean


def _squash(
    docker: Any, container: str, image: str, out: Path, opts: tuple[str, ...], plan: RewritePlan,
    progress: Progress | None, expected: int | None, started: float, with_sha256: bool = True,
    cancel: threading.Event | None = None,
) -> ExportResult:
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EfabuildError(f"export {image}: cannot create {out.parent}: {exc.strerror}") from None
    # keeps out's name as its prefix: when out is a store temp name, gc can tell its owner
    tmp = out.parent / f"{out.name}.{uuid.uuid4().hex[:8]}.tmp"
    docker_cmd = [str(part) for part in docker.client_config.docker_cmd]
    procs: list[subprocess.Popen] = []
    finished = threading.Event()
    with tempfile.TemporaryFile() as export_err, tempfile.TemporaryFile() as squash_log:
        try:
            exporter = subprocess.Popen(
                [*docker_cmd, "container", "export", container],
                stdout=subprocess.PIPE, stderr=export_err, stdin=subprocess.DEVNULL,
            )
            procs.append(exporter)
            try:
                squasher = subprocess.Popen(
                    ["mksquashfs", "-", str(tmp), *opts],
                    stdin=subprocess.PIPE, stdout=squash_log, stderr=subprocess.STDOUT,
                    env=_squash_env(),
                )
            except FileNotFoundError:
                raise EfabuildError(
                    "mksquashfs not found: install squashfs-tools 4.6 or later (scripts/setup-host.sh)"
                ) from None
            procs.append(squasher)
            if cancel is not None:  # the filter blocks in read/splice: killing both ends frees it
                threading.Thread(target=_kill_on_cancel, args=(procs, cancel, finished),
                                 daemon=True).start()
            assert exporter.stdout is not None and squasher.stdin is not None
            _grow_pipe(exporter.stdout.fileno())
            _grow_pipe(squasher.stdin.fileno())
            report = (lambda n: progress(n, expected)) if progress else None
            streamed, problem = 0, None
            try:
                streamed = rewrite_tar(exporter.stdout.fileno(), squasher.stdin.fileno(), plan, report)
            except BrokenPipeError:
                problem = "mksquashfs stopped reading"
            except TarFormatError as exc:
                problem = str(exc)
            if problem:  # stop the side that still runs; its exit status then means nothing
                for proc in procs:
                    if proc.poll() is None:
                        proc.kill()
            squasher.stdin.close()
            export_rc, squash_rc = exporter.wait(), squasher.wait()
            if cancel is not None and cancel.is_set():
                raise ExportCancelled(f"export {image}: interrupted; nothing was written")
            if export_rc > 0:
                raise EfabuildError(f"export {image}: docker export failed: {_tail(export_err) or export_rc}")
            if squash_rc > 0:
                raise EfabuildError(f"export {image}: mksquashfs failed: {_squash_error(squash_log) or squash_rc}")
            if problem or export_rc or squash_rc:
                raise EfabuildError(f"export {image}: {problem or 'interrupted'}")
            if progress:
                progress(streamed, expected)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            digest, sha256 = file_digests(tmp) if with_sha256 else (file_digest(tmp), None)
            size = tmp.stat().st_size
            try:
                os.replace(tmp, out)
            except OSError as exc:
                raise EfabuildError(f"export {image}: cannot write {out}: {exc.strerror}") from None
            fsync_dir(out.parent)
            return ExportResult(out, size, digest, opts, time.monotonic() - started, sha256,
                                time_clamp=plan.clamp)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            tmp.unlink(missing_ok=True)
            finished.set()
