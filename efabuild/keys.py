"""Layer keys: blake3 over a canonical, versioned encoding of everything that decides a layer.

Inputs: the parent's key (or the base reference and, when known, its digest), the Dockerfile text,
build args, target platform, and each context file's relative path, mode and content hash. No
absolute paths, mtimes, owners or hostnames, and mode is reduced to what git keeps (executable or
not), so the same inputs give the same key on any machine and checkout.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import blake3

from efabuild.errors import InputError
from efabuild.redact import shown_args, shown_dockerfile

KEY_SCHEMA = "efabuild.layer/v1"
_CHUNK = 1 << 20


@attrs.frozen
class ContextEntry:
    path: str  # workspace-relative, '/'-separated
    mode: str  # "644", "755" or "symlink"
    digest: str  # blake3 hex of the content (of the link target text for a symlink)


@attrs.frozen
class LayerInputs:
    """What a key is made of; recorded beside each build so a later plan can say what changed."""

    dockerfile: str
    platform: str
    parent_key: str | None = None
    base_ref: str | None = None
    base_digest: str | None = None
    args: tuple[tuple[str, str], ...] = ()
    context: tuple[ContextEntry, ...] = ()
    secrets: tuple[str, ...] = ()  # BuildKit secrets by name: their values are never an input

    def to_dict(self) -> dict[str, Any]:
        data = {
            "schema": KEY_SCHEMA,
            "parent_key": self.parent_key,
            "base": {"ref": self.base_ref, "digest": self.base_digest} if self.base_ref else None,
            "dockerfile": self.dockerfile,
            "args": dict(self.args),
            "platform": self.platform,
            "context": [[e.path, e.mode, e.digest] for e in self.context],
        }
        if self.secrets:  # absent when none, so the keys of layers without secrets stay as they were
            data["secrets"] = list(self.secrets)
        return data

    def to_shown_dict(self) -> dict[str, Any]:
        """to_dict() with secret-looking build args and ARG/ENV defaults replaced by a digest: for
        output and records."""
        data = self.to_dict()
        data["args"] = shown_args(data["args"])
        data["dockerfile"] = shown_dockerfile(data["dockerfile"])
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LayerInputs:
        base = data.get("base") or {}
        return cls(
            dockerfile=data["dockerfile"], platform=data["platform"], parent_key=data.get("parent_key"),
            base_ref=base.get("ref"), base_digest=base.get("digest"),
            args=tuple(sorted(data.get("args", {}).items())),
            context=tuple(ContextEntry(*entry) for entry in data.get("context", [])),
            secrets=tuple(data.get("secrets", ())),
        )

    def canonical(self) -> bytes:
        return canonical_json(self.to_dict())

    def key(self) -> str:
        return self._key

    @functools.cached_property
    def _key(self) -> str:
        # computed once: a plan asks for each key several times, and encoding a context of
        # 100k files costs tens of milliseconds each time
        return blake3.blake3(self.canonical()).hexdigest()


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


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class ContextHasher:
    """Hashes context files through a HashState; counts the files whose content it had to read.

    `exclude` names workspace-relative directories that are never context: the store (its
    contents change with every build) and `.git`.
    """

    def __init__(self, root: Path, state, exclude: frozenset[str] = frozenset()) -> None:
        self.root = root
        self.state = state
        self.exclude = exclude
        self.files_read = 0
        self.bytes_read = 0
        self._memo: dict[str, tuple[ContextEntry, ...]] = {}

    def entries(self, context: tuple[str, ...], where: str) -> tuple[ContextEntry, ...]:
        found: dict[str, ContextEntry] = {}
        for rel in context:
            inside = next((ex for ex in self.exclude if rel == ex or rel.startswith(ex + "/")), None)
            if inside:
                raise InputError(f"'{rel}' is inside {inside}/, which is never part of a context", where)
            if rel not in self._memo:
                self._memo[rel] = tuple(self._walk(rel, where))
            for entry in self._memo[rel]:
                found[entry.path] = entry
        return tuple(found[path] for path in sorted(found))

    def _walk(self, rel: str, where: str) -> Iterator[ContextEntry]:
        # plain strings and os.scandir, not pathlib: a warm plan of a 100k-file context is
        # mostly this loop, and one lstat per file is all it needs
        path = os.path.join(self.root, rel)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise InputError(f"'{rel}' does not exist", where) from None
        if not stat.S_ISDIR(st.st_mode):
            yield from self._entry(rel, path, st, where)
            return
        pending = [(rel, path)]
        while pending:
            dir_rel, dir_path = pending.pop()
            with os.scandir(dir_path) as it:
                children = list(it)
            for child in children:
                child_rel = f"{dir_rel}/{child.name}" if dir_rel != "." else child.name
                if child.is_dir(follow_symlinks=False):
                    if child_rel not in self.exclude:
                        pending.append((child_rel, child.path))
                    continue
                try:
                    child_st = child.stat(follow_symlinks=False)
                except FileNotFoundError:
                    raise InputError(f"'{child_rel}' does not exist", where) from None
                yield from self._entry(child_rel, child.path, child_st, where)

    def _entry(self, rel: str, path: str, st: os.stat_result, where: str) -> Iterator[ContextEntry]:
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(path)
            try:
                resolved = Path(path).resolve()
            except (OSError, RuntimeError):  # RuntimeError: a symlink loop
                raise InputError(f"'{rel}' is a symlink loop", where) from None
            if resolved != self.root and self.root not in resolved.parents:
                raise InputError(f"'{rel}' is a symlink leading outside the workspace", where)
            yield ContextEntry(rel, "symlink", blake3.blake3(target.encode()).hexdigest())
        elif stat.S_ISREG(st.st_mode):
            mode = "755" if st.st_mode & 0o111 else "644"
            yield ContextEntry(rel, mode, self._file_digest(rel, path, st))
        # sockets, fifos and devices cannot be copied into an image: left out like Docker does

    def _file_digest(self, rel: str, path: str, st: os.stat_result) -> str:
        cached = self.state.get(rel, st)
        if cached is not None:
            return cached
        hasher = blake3.blake3()
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                hasher.update(chunk)
                self.bytes_read += len(chunk)
        self.files_read += 1
        digest = hasher.hexdigest()
        self.state.put(rel, st, digest)
        return digest
