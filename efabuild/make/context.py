"""A layer's build context, from the key's side and the build's side: hashing the files a layer
names (through the stat cache in `hashcache`) and writing them out for the engine.

Both live here so that "the context holds exactly the bytes the key saw" is checked in one file:
the writer copies the entries the hasher produced, normalised the way the key describes them.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from functools import partial
from operator import itemgetter
from typing import TYPE_CHECKING, BinaryIO
from pathlib import Path

import blake3

from efabuild.display import shown
from efabuild.errors import EfabuildError, InputError
from efabuild.keys import ContextEntry
from efabuild.model import Workspace
from efabuild.make.dockerignore import IGNORE_FILE, BadPattern, Exclusions, leaves_out
from efabuild.make.hashcache import HashState
from efabuild.host.owner import owned_name
from efabuild.host.statstamp import matches as stamp_matches
from efabuild.store.gc.leftovers import CONTEXT_PREFIX
from efabuild.configfile import read_text

if TYPE_CHECKING:
    from efabuild.dag import LayerGraph

# Fixed timestamps for every build: 1980-01-01, the earliest a ZIP archive can hold.
SOURCE_DATE_EPOCH = 315532800
_CHUNK = 1 << 20
# opening a file the walk saw as regular: removed since, a symlink (O_NOFOLLOW) or a socket swapped in
_GONE_OR_SWAPPED = frozenset({errno.ENOENT, errno.ELOOP, errno.ENXIO})
_FILE_TYPE = 0o170000  # the type bits of st_mode (stat.S_IFMT)
_PATH = itemgetter(0)
_as_entry = partial(tuple.__new__, ContextEntry)  # a ContextEntry from a (path, mode, digest) tuple


@contextlib.contextmanager
def bulk_objects() -> Iterator[None]:
    """Pause the cyclic garbage collector while many acyclic objects are made (a context of 100k
    files makes hundreds of thousands): its repeated full passes over them make hashing a large
    context cost more than linear time. Nothing made here forms cycles, so nothing leaks."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class ContextHasher:
    """Hashes context files through a HashState; counts the files whose content it had to read.

    `exclude` names workspace-relative directories that are never context: the store (its
    contents change with every build) and `.git`.
    """

    def __init__(self, root: Path, state: HashState, exclude: frozenset[str] = frozenset()) -> None:
        self.root = root
        self.state = state
        self.exclude = exclude
        self.files_read = 0
        self._memo: dict[str, tuple[ContextEntry, ...]] = {}

    def entries(self, context: tuple[str, ...], where: str, exclude: tuple[str, ...] = ()) -> tuple[ContextEntry, ...]:
        """The files of `context`, less those its roots' .dockerignore files and `exclude` leave out,
        sorted by path."""
        walks = []
        for rel in context:
            inside = next((ex for ex in self.exclude if rel == ex or rel.startswith(ex + "/")), None)
            if inside:
                raise InputError(f"'{rel}' is inside {inside}/, which is never part of a context", where)
            rules = exclusions(self.root, rel, exclude, where)
            memo = (rel, *(r.patterns for r in rules))
            if memo not in self._memo:
                walk = self._walk(rel, where, rules)
                walk.sort(key=_PATH)  # on the path string alone: a third of comparing whole tuples
                self._memo[memo] = tuple(map(_as_entry, walk))
            walks.append(self._memo[memo])
        if len(walks) == 1:  # nearly every layer: one root, its walk already sorted
            return walks[0]
        found = {entry.path: entry for walk in walks for entry in walk}  # roots may overlap
        _check_not_under_links(found, where)
        if IGNORE_FILE in context and "." not in context:
            # the build context's root then holds the workspace's .dockerignore, and BuildKit
            # applies it to every file there: so does the key ("." applied it already)
            rules = (_exclusions(read_text(self.root / IGNORE_FILE, IGNORE_FILE).splitlines(), "", IGNORE_FILE),)
            found = {path: entry for path, entry in found.items() if not leaves_out(rules, path)}
        return tuple(found[path] for path in sorted(found))

    def _walk(self, rel: str, where: str, rules: tuple[Exclusions, ...] = ()) -> list[tuple[str, str, str]]:
        """(path, mode, digest) of every file under `rel`, in no particular order."""
        path = os.path.join(self.root, rel)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise InputError(f"'{rel}' does not exist", where) from None
        if not stat.S_ISDIR(st.st_mode):
            return list(self._entry(rel, path, st, where))
        found: list[tuple[str, str, str]] = []
        pending = [(rel, path)]
        while pending:
            dir_rel, dir_path = pending.pop()
            try:
                fd = os.open(dir_path, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                raise InputError(f"'{dir_rel}' does not exist", where) from None
            try:
                with os.scandir(fd) as it:
                    children = list(it)
                _check_names(dir_rel, children, rules, where)
                self._scan(children, dir_rel, dir_path, where, rules, found, pending)
            finally:
                os.close(fd)
        return found

    def _scan(self, children: list[os.DirEntry], dir_rel: str, dir_path: str, where: str,
              rules: tuple[Exclusions, ...], found: list[tuple[str, str, str]],
              pending: list[tuple[str, str]]) -> None:
        """One directory's files into `found`, its subdirectories onto `pending`. The hot loop of a
        no-op plan (a 10k-file context is 10k turns): listed through the directory's descriptor, so
        each lstat (fstatat) looks up one name rather than the whole path; the cache's stamp
        compared inline, integer by integer; nothing made per file but a plain tuple (a ContextEntry is made from it in
        C, after sorting)."""
        known = self.state.lookup
        prefix = "" if dir_rel == "." else f"{dir_rel}/"
        for child in children:
            child_rel = prefix + child.name
            if child.is_dir(follow_symlinks=False):
                if child_rel not in self.exclude and not leaves_out(rules, child_rel, directory=True):
                    pending.append((child_rel, f"{dir_path}/{child.name}"))
                continue
            if rules and leaves_out(rules, child_rel):
                continue
            try:
                st = child.stat(follow_symlinks=False)
            except FileNotFoundError:
                raise InputError(f"'{child_rel}' does not exist", where) from None
            if st.st_mode & _FILE_TYPE != stat.S_IFREG:  # symlinks and the rare special file
                found.extend(self._entry(child_rel, f"{dir_path}/{child.name}", st, where))
                continue
            cached = known(child_rel)  # (*stamp, digest)
            if cached is not None and stamp_matches(cached, st):
                digest = cached[-1]
            else:
                digest = self._read_digest(child_rel, f"{dir_path}/{child.name}", st)
            found.append((child_rel, "755" if st.st_mode & 0o111 else "644", digest))

    def _entry(self, rel: str, path: str, st: os.stat_result, where: str) -> Iterator[ContextEntry]:
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(path)
            try:
                resolved = Path(path).resolve()
            except (OSError, RuntimeError):  # RuntimeError: a symlink loop
                raise InputError(f"'{rel}' is a symlink loop", where) from None
            if resolved != self.root and self.root not in resolved.parents:
                raise InputError(f"'{rel}' is a symlink leading outside the workspace", where)
            yield ContextEntry(rel, "symlink", blake3.blake3(os.fsencode(target)).hexdigest())
        elif stat.S_ISREG(st.st_mode):
            mode = "755" if st.st_mode & 0o111 else "644"
            yield ContextEntry(rel, mode, self._file_digest(rel, path, st))
        # sockets, fifos and devices cannot be copied into an image: left out like Docker does

    def _file_digest(self, rel: str, path: str, st: os.stat_result) -> str:
        cached = self.state.get(rel, st)
        if cached is not None:
            return cached
        return self._read_digest(rel, path, st)

    def _read_digest(self, rel: str, path: str, st: os.stat_result) -> str:
        try:
            src = _open_regular(path)
        except OSError as exc:
            if exc.errno not in _GONE_OR_SWAPPED:
                raise  # unreadable (EACCES, EIO): said as it is, not as a change
            src = None
        if src is None:
            raise EfabuildError(f"context file {rel} changed while it was read (no longer a regular file): "
                                "run again")
        with src:
            digest = _hash_stream(src)
        self.files_read += 1
        self.state.put(rel, st, digest)
        return digest


def hash_contexts(ws: Workspace, graph: LayerGraph, order: list[str],
                  hasher: ContextHasher) -> dict[str, tuple[ContextEntry, ...]]:
    """Every layer's context entries, the facts its key is made of; the hash cache is saved."""
    contexts = {}
    with bulk_objects():
        for qualname in order:
            layer = graph.nodes[qualname]["layer"]
            where = f"{ws.relpath(layer.source)}: layers.{layer.name}.context"
            contexts[qualname] = hasher.entries(layer.context, where, layer.exclude)
    hasher.state.save()
    return contexts


def exclusions(root: Path, rel: str, exclude: tuple[str, ...], where: str = "") -> tuple[Exclusions, ...]:
    """What a context entry leaves out: the layer's `exclude` patterns (workspace-relative) and,
    for a directory, its own .dockerignore (relative to it), each only when present. A pattern
    Docker would refuse is an InputError naming the key (`where`, ...context → ...exclude) or file."""
    rules = [_exclusions(exclude, "", where.removesuffix(".context") + ".exclude")] if exclude else []
    ignore_file = os.path.join(root, rel, IGNORE_FILE)
    if os.path.isfile(ignore_file):
        name = f"{rel}/{IGNORE_FILE}"
        rules.append(_exclusions(read_text(ignore_file, name).splitlines(), rel, name))
    return tuple(r for r in rules if r)


def _exclusions(patterns: Iterable[str], rel: str, where: str) -> Exclusions:
    try:
        return Exclusions(patterns, rel)
    except BadPattern as exc:
        raise InputError(str(exc), where) from None


def _check_not_under_links(found: dict[str, ContextEntry], where: str) -> None:
    """One root may name a path through a symlink another root takes in as a link (`app` holds the
    link `app/data`, a second root is `app/data/x`): the build context would hold the link, and
    writing the file there would go through it, out of the context. Only several roots can."""
    links = {path for path, entry in found.items() if entry.mode == "symlink"}
    for path in found if links else ():
        parent = path.rpartition("/")[0]
        while parent:
            if parent in links:
                raise InputError(f"'{path}' is under '{parent}', a symlink the context also holds: "
                                 "name the link's target instead", where)
            parent = parent.rpartition("/")[0]


def _check_names(dir_rel: str, children: list[os.DirEntry], rules: tuple[Exclusions, ...], where: str) -> None:
    """A key is UTF-8 JSON: a name that is not UTF-8 (read as surrogates) cannot be keyed unless
    it is left out. One encode per directory, not per file."""
    try:
        "/".join(child.name for child in children).encode("utf-8")
        return
    except UnicodeEncodeError:
        pass
    for child in children:
        path = f"{dir_rel}/{child.name}" if dir_rel != "." else child.name
        if _utf8(child.name) or leaves_out(rules, path, directory=child.is_dir(follow_symlinks=False)):
            continue
        raise InputError(f"'{shown(path)}' is not a UTF-8 file name: rename it or leave it out with exclude",
                         where)


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def never_context(ws: Workspace) -> frozenset[str]:
    """Workspace directories no context may take in: `.git` and the store tiers inside it."""
    excluded = {".git"}
    for tier in (ws.settings.store.local, ws.settings.store.shared):
        if tier is not None:
            try:
                excluded.add(Path(tier).resolve().relative_to(ws.root).as_posix())
            except ValueError:
                pass  # outside the workspace: a context cannot reach it anyway
    return frozenset(excluded)


def write_context(root: Path, directory: Path, entries: Iterable[ContextEntry]) -> None:
    """Copy the hashed context `entries` from `root` into `directory`, normalised like the key:
    mode 644 or 755, mtime SOURCE_DATE_EPOCH, so one key always gives one image whatever the
    checkout's umask or timestamps. Each file is hashed as it is copied: one changed since its key
    was computed stops the build (EfabuildError) instead of going into an image under that key."""
    made: set[Path] = set()
    for entry in entries:
        source, target = root / entry.path, directory / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        made.update(p for p in target.parents if p != directory and directory in p.parents)
        if entry.mode == "symlink":
            link = os.readlink(source)
            _same_as_hashed(entry, blake3.blake3(os.fsencode(link)).hexdigest())
            os.symlink(link, target)
            os.utime(target, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH), follow_symlinks=False)
            continue
        _same_as_hashed(entry, _copy_hashing(source, target))
        os.chmod(target, 0o755 if entry.mode == "755" else 0o644)
        os.utime(target, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH))
    for folder in sorted(made, key=lambda p: len(p.parts), reverse=True):  # deepest first
        os.chmod(folder, 0o755)
        os.utime(folder, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH))


def _copy_hashing(source: Path, target: Path) -> str:
    """Copy `source` to `target`, returning the blake3 of what was copied ("" when `source` can no
    longer be opened as a regular file: that reads as a change)."""
    try:
        src = _open_regular(source)
    except OSError:
        return ""
    if src is None:
        return ""
    with src, open(target, "xb") as dst:
        return _hash_stream(src, copy_to=dst)


def _open_regular(path: str | Path) -> BinaryIO | None:
    """`path` open for reading; None when it is no longer a regular file. Opened without blocking
    (a FIFO swapped in since the walk's lstat would never be written) and not through a symlink
    swapped in (ELOOP, raised as OSError like any other failure to open)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def _hash_stream(src: BinaryIO, copy_to: BinaryIO | None = None) -> str:
    """The blake3 (hex) of what `src` holds, also written to `copy_to`: the one hasher of context
    files, for the key and for the copy the build gets. Read in 1 MiB blocks rather than
    host.digest's mmap: a context is mostly small files, and the copy needs the bytes anyway."""
    hasher = blake3.blake3()
    while chunk := src.read(_CHUNK):
        hasher.update(chunk)
        if copy_to is not None:
            copy_to.write(chunk)
    return hasher.hexdigest()


def _same_as_hashed(entry: ContextEntry, digest: str) -> None:
    if digest != entry.digest:
        raise EfabuildError(f"context file {entry.path} changed after its key was computed: run make again")


@contextlib.contextmanager
def context_dir(ws_root: Path, tmp_root: Path, layer_name: str, entries: Iterable[ContextEntry]) -> Iterator[Path]:
    """A build context holding exactly `entries`, removed afterwards. Named by its owner: a make
    killed meanwhile leaves it to the next make or gc."""
    tmp_root.mkdir(parents=True, exist_ok=True)
    directory = tmp_root / owned_name(CONTEXT_PREFIX, layer_name)
    directory.mkdir(mode=0o700)
    try:
        write_context(ws_root, directory, entries)
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
