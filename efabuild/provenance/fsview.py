"""Read-only views of an image filesystem: an unpacked directory or a .sqsh file.

Paths are absolute POSIX paths inside the image ("/usr/lib/..."). Symlinks are resolved against the
image root, never the host's, so an absolute link in the image cannot point at this machine's files.
A .sqsh is listed once with `unsquashfs -lln` and files are read with `unsquashfs -cat`: nothing is
extracted to disk, which matters for 25 GB images.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator
from fnmatch import fnmatchcase
from pathlib import Path

import attrs

from efabuild.host import children
from efabuild.errors import EfabuildError

FILE, DIR, SYMLINK, OTHER = "file", "dir", "symlink", "other"
_MAX_LINKS = 40  # like the kernel's limit: a loop gives up instead of spinning
# an NGC PyTorch image lists a few hundred thousand entries; each costs ~500 bytes here
MAX_ENTRIES = 2_000_000
MAX_LISTING_BYTES = 256 << 20
_WHOLE_READ = 64 << 10  # a head of a file up to this size comes from one `-cat` of all such files
_MAX_ARG_BYTES = 96 << 10  # paths per `unsquashfs -cat`: ARG_MAX is 2 MiB, the environment counts too


@attrs.frozen
class Entry:
    kind: str  # FILE, DIR, SYMLINK or OTHER
    size: int = 0
    target: str | None = None  # symlink text


class FsView:
    """The shared logic: symlink resolution, globbing and reading on top of three primitives."""

    description = "image"

    # -- primitives a view provides -------------------------------------------------------------
    def lentry(self, path: str) -> Entry | None:
        """The entry at `path` itself (a symlink is not followed)."""
        raise NotImplementedError

    def _names(self, path: str) -> list[str]:
        """Names in the directory at the already resolved `path`."""
        raise NotImplementedError

    def _read_resolved(self, paths: list[str]) -> dict[str, bytes]:
        """Contents of regular files at already resolved paths."""
        raise NotImplementedError

    # -- derived --------------------------------------------------------------------------------
    def resolve(self, path: str) -> str | None:
        """The path with every symlink followed inside the image; None when dangling or looping."""
        parts = _parts(path)
        done = "/"
        hops = 0
        while parts:
            name = parts.pop(0)
            if name == "..":
                done = posixpath.dirname(done)
                continue
            candidate = posixpath.join(done, name)
            entry = self.lentry(candidate)
            if entry is None:
                return None
            if entry.kind == SYMLINK:
                hops += 1
                if hops > _MAX_LINKS or entry.target is None:
                    return None
                if entry.target.startswith("/"):
                    done = "/"
                parts = _parts(entry.target) + parts
                continue
            if parts and entry.kind != DIR:
                return None
            done = candidate
        return done

    def entry(self, path: str) -> Entry | None:
        resolved = self.resolve(path)
        return None if resolved is None else self.lentry(resolved)

    def is_file(self, path: str) -> bool:
        found = self.entry(path)
        return found is not None and found.kind == FILE

    def is_dir(self, path: str) -> bool:
        found = self.entry(path)
        return found is not None and found.kind == DIR

    def exists(self, path: str) -> bool:
        return self.entry(path) is not None

    def listdir(self, path: str) -> list[str]:
        resolved = self.resolve(path)
        if resolved is None or self.lentry(resolved).kind != DIR:
            return []
        return sorted(self._names(resolved))

    def glob(self, pattern: str) -> list[str]:
        """Absolute paths matching a pattern whose components may hold shell wildcards."""
        found = ["/"]
        for part in _parts(pattern):
            step: list[str] = []
            for base in found:
                if any(ch in part for ch in "*?["):
                    step += [posixpath.join(base, n) for n in self.listdir(base) if fnmatchcase(n, part)]
                    continue
                real_base = self.resolve(base)
                if real_base is not None and self.lentry(posixpath.join(real_base, part)) is not None:
                    step.append(posixpath.join(base, part))
            found = step
        return sorted(found)

    def read_many(self, paths: Iterable[str], max_size: int | None = None) -> dict[str, bytes]:
        """Contents of the regular files among `paths` (keyed by the path asked for).

        Missing paths, directories and files bigger than `max_size` are left out."""
        wanted: dict[str, str] = {}
        for path in paths:
            resolved = self.resolve(path)
            if resolved is None:
                continue
            found = self.lentry(resolved)
            if found.kind != FILE or (max_size is not None and found.size > max_size):
                continue
            wanted[path] = resolved
        contents = self._read_resolved(sorted(set(wanted.values()))) if wanted else {}
        return {path: contents[resolved] for path, resolved in wanted.items() if resolved in contents}

    def read_bytes(self, path: str, max_size: int | None = None) -> bytes | None:
        return self.read_many([path], max_size).get(path)

    def read_heads(self, paths: Iterable[str], size: int) -> dict[str, bytes]:
        """The first `size` bytes of each regular file among `paths` (keyed by the path asked for):
        a 2 GB library costs what its header does."""
        wanted: dict[str, str] = {}
        for path in paths:
            resolved = self.resolve(path)
            if resolved is not None and self.lentry(resolved).kind == FILE:
                wanted[path] = resolved
        heads = self._heads_resolved(sorted(set(wanted.values())), size) if wanted else {}
        return {path: heads[resolved] for path, resolved in wanted.items() if resolved in heads}

    def _heads_resolved(self, paths: list[str], size: int) -> dict[str, bytes]:
        return {path: data[:size] for path, data in self._read_resolved(paths).items()}

    def read_text(self, path: str, max_size: int | None = 1 << 20) -> str | None:
        data = self.read_bytes(path, max_size)
        return None if data is None else data.decode("utf-8", errors="replace")


def _normalize(path: str) -> str:
    return "/" + "/".join(_parts(path))


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p and p != "."]


class DirView(FsView):
    """An unpacked root filesystem in a directory (e.g. a `docker export` unpacked for a test)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise EfabuildError(f"{self.root}: not a directory")
        self.description = str(self.root)

    def _host(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def lentry(self, path: str) -> Entry | None:
        if _normalize(path) == "/":
            return Entry(DIR)
        try:
            st = os.lstat(self._host(path))
        except (FileNotFoundError, NotADirectoryError):
            return None
        if stat.S_ISLNK(st.st_mode):
            return Entry(SYMLINK, st.st_size, os.readlink(self._host(path)))
        if stat.S_ISDIR(st.st_mode):
            return Entry(DIR)
        if stat.S_ISREG(st.st_mode):
            return Entry(FILE, st.st_size)
        return Entry(OTHER)

    def _names(self, path: str) -> list[str]:
        return os.listdir(self._host(path))

    def _read_resolved(self, paths: list[str]) -> dict[str, bytes]:
        out = {}
        for path in paths:
            try:
                out[path] = self._host(path).read_bytes()
            except OSError:
                continue
        return out

    def _heads_resolved(self, paths: list[str], size: int) -> dict[str, bytes]:
        out = {}
        for path in paths:
            try:  # resolved inside the image: a link swapped in since is not followed, a FIFO not waited on
                fd = os.open(self._host(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    out[path] = os.read(fd, size)
            except OSError:
                pass
            finally:
                os.close(fd)
        return out


# `unsquashfs -lln` lines: mode, uid/gid, size (or "major, minor" for devices), date, time, name
_LS_LINE = re.compile(
    rb"^(?P<mode>\S{10}) \S+\s+(?P<size>\d+|\d+,\s*\d+) \d{4}-\d\d-\d\d \d\d:\d\d(?::\d\d)? (?P<name>.*)$"
)


class SqshView(FsView):
    """A SquashFS image read in place with squashfs-tools (≥ 4.5 for `-cat`)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise EfabuildError(f"{self.path}: no such .sqsh file")
        self.description = str(self.path)
        self._entries: dict[str, Entry] | None = None
        self._children: dict[str, list[str]] = {}

    def _index(self) -> dict[str, Entry]:
        if self._entries is None:
            self._entries, self._children = _parse_listing(_listing(self.path))
        return self._entries

    def lentry(self, path: str) -> Entry | None:
        return self._index().get(_normalize(path))

    def _names(self, path: str) -> list[str]:
        self._index()
        return self._children.get(path, [])

    def _read_resolved(self, paths: list[str]) -> dict[str, bytes]:
        # One `unsquashfs -cat` for all files; output comes in argument order, split by the sizes
        # the listing gave. A short or long stream means the image changed or broke: read one by one.
        index = self._index()
        sizes = [index[p].size for p in paths]
        data = _cat(paths, self.path)
        if len(data) == sum(sizes):
            out, offset = {}, 0
            for path, size in zip(paths, sizes):
                out[path] = data[offset : offset + size]
                offset += size
            return out
        if len(paths) == 1:
            raise EfabuildError(f"{self.path}: cannot read {paths[0]} (the image may be damaged)")
        out = {}
        for path in paths:
            out.update(self._read_resolved([path]))
        return out

    def _heads_resolved(self, paths: list[str], size: int) -> dict[str, bytes]:
        # small files in one `-cat`; each big one alone, its stream closed once the head is in
        # (unsquashfs starts in milliseconds: it reads only the directories on the path)
        index = self._index()
        small = [p for p in paths if index[p].size <= _WHOLE_READ]
        out = {p: data[:size] for p, data in self._read_resolved(small).items()} if small else {}
        for path in paths:
            if index[path].size > _WHOLE_READ:
                head = _cat_head(path, self.path, size)
                if head is not None:
                    out[path] = head
        return out


def _listing(image: Path) -> list[bytes]:
    """`unsquashfs -lln`'s lines, counted as they come: a .sqsh listing more than MAX_ENTRIES
    entries (a SquashFS bomb: a hard link costs a few bytes of a file, each listed and held here
    for hundreds) is refused before it fills the memory."""
    with tempfile.TemporaryFile() as errors:
        try:
            proc = children.popen(["unsquashfs", "-lln", "-d", "", str(image)], stdout=subprocess.PIPE,
                                  stderr=errors, stdin=subprocess.DEVNULL, env={**os.environ, "LC_ALL": "C"})
        except FileNotFoundError:
            raise EfabuildError("unsquashfs not found: install squashfs-tools (4.5 or newer)") from None
        lines, size = [], 0
        try:
            for line in proc.stdout:
                lines.append(line.rstrip(b"\n"))
                size += len(line)
                if len(lines) > MAX_ENTRIES or size > MAX_LISTING_BYTES:
                    raise EfabuildError(f"{image}: lists more than {MAX_ENTRIES} entries or "
                                        f"{MAX_LISTING_BYTES >> 20} MiB of names: not read (no image has that many)")
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.stdout.close()
            returncode = proc.wait()
        if returncode != 0:
            errors.seek(0)
            detail = errors.read().decode(errors="replace").strip().splitlines()
            raise EfabuildError(f"{image}: unsquashfs failed: {detail[-1] if detail else returncode}")
    return lines


def _parse_listing(listing: list[bytes]) -> tuple[dict[str, Entry], dict[str, list[str]]]:
    entries: dict[str, Entry] = {}
    children: dict[str, list[str]] = {}
    for line in listing:
        match = _LS_LINE.match(line)
        if match is None:
            continue  # not an entry line (or a name with a newline in it: nothing we look for)
        mode, size_text, name = match["mode"], match["size"], match["name"]
        kind = {b"-": FILE, b"d": DIR, b"l": SYMLINK}.get(mode[:1], OTHER)
        size = int(size_text) if size_text.isdigit() else 0
        target = None
        if kind == SYMLINK:
            # the listed size is the target's length in bytes, so " -> " in a name cannot confuse us
            target = _decode(name[len(name) - size :])
            name = name[: len(name) - size - len(b" -> ")]
        path = _normalize(_decode(name))
        entries[path] = Entry(kind, size, target)
        if path != "/":
            children.setdefault(posixpath.dirname(path), []).append(posixpath.basename(path))
    entries.setdefault("/", Entry(DIR))
    return entries, children


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", errors="surrogateescape")


def _cat_head(path: str, image: Path, size: int) -> bytes | None:
    """The first `size` bytes of one file: the rest is never decompressed."""
    try:
        proc = children.popen(["unsquashfs", "-no-wildcards", "-cat", str(image), path], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env={**os.environ, "LC_ALL": "C"})
    except FileNotFoundError:
        raise EfabuildError("unsquashfs not found: install squashfs-tools (4.5 or newer)") from None
    except OSError as exc:
        if exc.errno != errno.E2BIG:
            raise
        return None  # a path longer than the kernel takes as one argument: not read
    try:
        head = b""
        while len(head) < size:
            chunk = proc.stdout.read(size - len(head))
            if not chunk:
                break
            head += chunk
    finally:
        proc.kill()
        proc.stdout.close()
        proc.wait()
    return head or None


def _cat(paths: list[str], image: Path) -> bytes:
    """The files at `paths`, one after the other (a short stream when one cannot be read)."""
    out = []
    # command lines the kernel accepts (1024 real paths of 3 KB are over ARG_MAX, failing the whole
    # command): a path costs its bytes, its NUL and its pointer
    for batch in grouped(paths, lambda path: len(os.fsencode(path)) + 9, _MAX_ARG_BYTES):
        try:
            proc = children.run(["unsquashfs", "-no-wildcards", "-cat", str(image), *batch], capture_output=True,
                                env={**os.environ, "LC_ALL": "C"})
        except FileNotFoundError:
            raise EfabuildError("unsquashfs not found: install squashfs-tools (4.5 or newer)") from None
        except OSError as exc:
            if exc.errno != errno.E2BIG:
                raise
            return b"".join(out)  # one path longer than the kernel takes: short, read one by one
        out.append(proc.stdout)
    return b"".join(out)


def grouped(items: list[str], cost: Callable[[str], int], budget: int) -> Iterator[list[str]]:
    """`items` in order, in groups whose costs add up to at most `budget` (a costlier item alone)."""
    group, size = [], 0
    for item in items:
        spent = cost(item)
        if group and size + spent > budget:
            yield group
            group, size = [], 0
        group.append(item)
        size += spent
    yield from [group] if group else []
