"""File operations on a store directory: crash-safe (temp file in the same filesystem, fsync, then
rename or link) and never led out of the store by what another writer planted in it.

A shared store is written by many users. Below its root (which the admin chose, and may be a
link), efabuild follows no symbolic link: directories are walked one component at a time with
`O_NOFOLLOW` relative to the previous one (`openat`), files are opened with `O_NOFOLLOW` relative
to their directory, and anything that is not a regular file where a file belongs (a link, FIFO,
device, directory) is an `UnsafeEntry`, never opened for reading. Reads are bounded.

Stdlib only: `efabuild lookup` reads records through these helpers on its fast path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from efabuild.display import shown
from efabuild.errors import EfabuildError
from efabuild.host.owner import Owner, owned_name, remove_dead_owned

COPY_CHUNK = 64 * 1024 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# errno values of an O_NOFOLLOW | O_DIRECTORY open that met something other than a directory
_NOT_A_DIR = {errno.ELOOP, errno.ENOTDIR, errno.EMLINK}


class UnsafeEntry(EfabuildError):
    """A store entry that efabuild did not write: a link, FIFO, device or directory where a file
    belongs, a file where a directory belongs, or a file too large to be what it claims."""


def kind_of(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a regular file"


def _kind_at(dir_fd: int, name: str) -> str:
    try:
        return kind_of(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return "not a directory"


def open_dir(root: Path, parts: tuple[str, ...] | list[str], *, create: bool = False) -> int:
    """A descriptor of root/parts..., walked without following links below `root`.

    With `create`, missing directories are made (the umask decides their mode, as for mkdir -p).
    FileNotFoundError when one is missing; UnsafeEntry when one is not a real directory.
    """
    root = Path(root)
    if create:
        root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the root itself is trusted
    where = root
    try:
        for part in parts:
            where = where / part
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
                child = _open_child_dir(fd, part, where)
            except OSError as exc:
                if exc.errno not in _NOT_A_DIR:
                    raise
                raise UnsafeEntry(f"{shown(where)}: {_kind_at(fd, part)}, not a directory") from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_child_dir(fd: int, part: str, where: Path) -> int:
    try:
        return os.open(part, _DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        if exc.errno not in _NOT_A_DIR:
            raise
        raise UnsafeEntry(f"{shown(where)}: {_kind_at(fd, part)}, not a directory") from None


@contextlib.contextmanager
def store_dir(root: Path, *parts: str, create: bool = False) -> Iterator[int]:
    """`with store_dir(root, "objects", "ab") as fd:` — open_dir() that closes itself."""
    fd = open_dir(root, parts, create=create)
    try:
        yield fd
    finally:
        os.close(fd)


def relative_parts(root: Path, directory: Path) -> tuple[str, ...]:
    """The components of `directory` below `root` (ValueError when it is not below it)."""
    return Path(directory).relative_to(root).parts


def stat_file(dir_fd: int, name: str, where: Path) -> os.stat_result | None:
    """lstat of a file that must be regular: None when absent, UnsafeEntry when it is not a file."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeEntry(f"{shown(where)}: {kind_of(info.st_mode)}, not a file")
    return info


def read_file(dir_fd: int, name: str, where: Path, limit: int) -> bytes | None:
    """The bytes of a regular file of at most `limit` bytes; None when absent.

    Never opens a link, FIFO (which would block) or device; never reads more than `limit` + 1.
    """
    info = stat_file(dir_fd, name, where)
    if info is None:
        return None
    _check_size(info.st_size, where, limit)
    fd = open_entry(dir_fd, name, where, os.O_RDONLY)
    if fd is None:
        return None
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):  # swapped since the lstat
            raise UnsafeEntry(f"{shown(where)}: {kind_of(opened.st_mode)}, not a file")
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, limit + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        _check_size(total, where, limit)
        return b"".join(chunks)
    finally:
        os.close(fd)


def open_entry(dir_fd: int, name: str, where: Path, flags: int, *, error: type[UnsafeEntry] = UnsafeEntry,
               what: str = "file") -> int | None:
    """A descriptor of the existing entry `name`, opened without following a link or waiting on a
    FIFO; None when absent; `error` naming `where` when it is a link. The caller checks what it
    opened (fstat): the entry may have been swapped since any earlier look."""
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise error(f"{shown(where)}: a symbolic link, not a {what}") from None


def open_regular(path: Path) -> int | None:
    """A read-only descriptor of the regular file `path`, or None: absent, a link, or something
    else (a FIFO swapped in is not waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    os.close(fd)
    return None


def only_writable_by(st: os.stat_result, owners: Collection[int]) -> bool:
    """Whether the file `st` describes belongs to one of `owners` and nobody else may change it
    (no group or other write bit): what a store on a shared path must check before it believes a
    file that only its own user should have written."""
    return st.st_uid in owners and not st.st_mode & 0o022


def _check_size(size: int, where: Path, limit: int) -> None:
    if size > limit:
        raise UnsafeEntry(f"{shown(where)}: {size} bytes, more than such a file can be ({limit})")


def read_under(root: Path, path: Path, limit: int) -> bytes | None:
    """read_file() of `path`, whose directories below `root` are walked without following links."""
    path = Path(path)
    try:
        with store_dir(root, *relative_parts(root, path.parent)) as fd:
            return read_file(fd, path.name, path, limit)
    except (FileNotFoundError, NotADirectoryError):
        return None


def fanout_dirs(root: Path) -> list[str]:
    """Names of the plain directories in <root>/objects; [] when it is missing or not a plain
    directory of the store (whoever lists keys says why)."""
    try:
        with store_dir(root, "objects") as fd:
            return [entry.name for entry in os.scandir(fd) if entry.is_dir(follow_symlinks=False)]
    except (OSError, UnsafeEntry):
        return []


def stat_under(root: Path, path: Path) -> os.stat_result | None:
    """stat_file() of `path` below `root`: None when absent, UnsafeEntry when not a file."""
    path = Path(path)
    try:
        with store_dir(root, *relative_parts(root, path.parent)) as fd:
            return stat_file(fd, path.name, path)
    except (FileNotFoundError, NotADirectoryError):
        return None


# efatmp.HOST.PID.START.RANDOM.NAME; names from before START was added lack it (then 0: the pid decides)
_TEMP = re.compile(r"efatmp\.(?P<host>[^.]+)\.(?P<pid>[0-9]+)\.(?:(?P<start>[0-9]+)\.)?[0-9a-f]{8}\.")


def temp_name(tmp_dir: Path, stem: str, suffix: str) -> Path:
    """A unique temp path naming its owner (host, pid, start time: pids are reused), so gc can
    tell a live writer's file from debris."""
    import secrets  # here, not at the top: lookup's fast path reads through this module

    return tmp_dir / f"efatmp.{Owner.current().token}.{secrets.token_hex(4)}.{stem}{suffix}"


def parse_temp_owner(name: str) -> Owner | None:
    """The writer named in a temp_name() file name; None for any other file."""
    match = _TEMP.match(name)
    return Owner(match["host"], int(match["pid"]), int(match["start"] or 0)) if match else None


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


def write_synced(fd: int, data: bytes) -> None:
    """Write all of `data` to `fd` and sync it: what goes before a rename or link makes it visible."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)


def atomic_write_bytes(path: Path, data: bytes, tmp_dir: Path, mode: int = 0o644) -> None:
    """Replace `path` with `data` so readers see the old or the new content, never a mix.

    Below the directory that holds both `tmp_dir` and `path`, no link is followed: a planted
    link in place of `path` is replaced, never written through.
    """
    path, tmp_dir = Path(path), Path(tmp_dir)
    root = Path(os.path.commonpath([tmp_dir, path.parent]))
    with store_dir(root, *relative_parts(root, tmp_dir), create=True) as tmp_fd, \
            store_dir(root, *relative_parts(root, path.parent), create=True) as dir_fd:
        tmp = temp_name(tmp_dir, path.name, ".part").name
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                     dir_fd=tmp_fd)
        try:
            write_synced(fd, data)
        except BaseException:
            os.close(fd)
            os.unlink(tmp, dir_fd=tmp_fd)
            raise
        os.close(fd)
        try:
            os.replace(tmp, path.name, src_dir_fd=tmp_fd, dst_dir_fd=dir_fd)
        except IsADirectoryError:
            os.unlink(tmp, dir_fd=tmp_fd)
            raise UnsafeEntry(f"{shown(path)}: a directory, not a file") from None
        except BaseException:
            os.unlink(tmp, dir_fd=tmp_fd)
            raise
        os.fsync(dir_fd)


def copy_file(source: Path, dest: Path, progress: Callable[[int], None] | None = None) -> None:
    """Copy into a new file `dest` (must not exist; made 0644, whatever the umask: in a shared
    tier's tmp/, a descriptor a group member opened for writing meanwhile would outlive the 0444
    an artifact is published with) and fsync it; the kernel copies when it can. `progress` is
    called with each count of bytes copied."""
    with open(source, "rb") as src, open(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                                                  0o644), "wb") as dst:
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
                progress(count)
        dst.flush()
        os.fsync(dst.fileno())


def replace_owned(path: Path, data: bytes, mode: int = 0o600, *, fsync: bool = False,
                  temp_prefix: str | None = None, below: Path | None = None) -> None:
    """Write `data` to `path` atomically, through a temp file beside it that names its writer, so
    one killed before the rename leaves a file the next write removes (the temp files of dead
    writers with the same prefix go first). With `below` (a store's root, which may sit on a
    shared path), the directories from it down to `path` are made and opened without following a
    link (UnsafeEntry for one). OSError when it cannot."""
    path = Path(path)
    root = path.parent if below is None else Path(below)
    try:
        dir_fd = open_dir(root, relative_parts(root, path.parent), create=below is not None)
        try:
            prefix = temp_prefix or f".{path.name}"
            remove_dead_owned(dir_fd, prefix)
            _write_and_rename(dir_fd, owned_name(prefix, "tmp"), path.name, data, mode, fsync)
        finally:
            os.close(dir_fd)
    except OSError as exc:  # opened by name below a directory: say which file was being written
        exc.filename, exc.filename2 = str(path), None
        raise


def _write_and_rename(dir_fd: int, tmp: str, name: str, data: bytes, mode: int, fsync: bool) -> None:
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
            os.fchmod(handle.fileno(), mode)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        raise
