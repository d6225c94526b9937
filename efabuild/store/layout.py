"""Where things live in a store directory, and reading them without side effects.

Stdlib only (no attrs, boto3, docker): `efabuild lookup` imports this module on its fast path.

    <root>/objects/<k[:2]>/<key>.sqsh            the artifact (read-only once published)
    <root>/objects/<k[:2]>/<key>.json            its record (ArtifactRecord as JSON)
    <root>/objects/<k[:2]>/<key>.manifest.json   its provenance manifest, when there is one
    <root>/objects/<k[:2]>/<key>.intoto.jsonl    its signed in-toto statement (DSSE), when signed
    <root>/refs/<graph>/<layer>.json             name -> history of keys, newest last
    <root>/locks/                                per-key and per-ref lock files
    <root>/tmp/                                  temp files; same filesystem, so publish is a link
    <root>/store.toml                            where the S3 tier is (no credentials), if any

An object is present only when both its `.sqsh` and its `.json` exist. On a filesystem tier the
record is written first and the `.sqsh` linked last, so the `.sqsh` is the commit point: whoever
sees a `.sqsh` under objects/ also finds its complete record beside it.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path

from efabuild.errors import EfabuildError, InputError

KEY_LENGTH = 64
SHORT_KEY_LENGTH = 12
MIN_PREFIX_LENGTH = 8
SQSH_SUFFIX = ".sqsh"
RECORD_SUFFIX = ".json"
MANIFEST_SUFFIX = ".manifest.json"
ENVELOPE_SUFFIX = ".intoto.jsonl"
CONFIG_FILE = "store.toml"

_HEX = frozenset("0123456789abcdef")
# graph and layer names become path components: no separators, no leading dot
_NAME_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")


class AmbiguousRef(EfabuildError):
    """A key prefix matches several artifacts. Exit status 1, like an absent artifact."""


def is_hex(text: str) -> bool:
    return bool(text) and all(c in _HEX for c in text)


def is_key(text: object) -> bool:
    return isinstance(text, str) and len(text) == KEY_LENGTH and is_hex(text)


def short(key: str) -> str:
    return key[:SHORT_KEY_LENGTH]


def check_key(key: str) -> str:
    if not is_key(key):
        raise InputError(f"not a layer key (64 lowercase hex characters): {key!r}")
    return key


def split_name(name: str, where: str | None = None) -> tuple[str, str]:
    """'graph:layer' -> ('graph', 'layer'), both safe as path components."""
    graph, sep, layer = name.partition(":")
    if not sep or not _NAME_PART.fullmatch(graph) or not _NAME_PART.fullmatch(layer):
        raise InputError(
            f"not an artifact name of the form graph:layer (letters, digits, _ . + -): {name!r}",
            where,
        )
    return graph, layer


def classify_ref(ref: str) -> tuple[str, str]:
    """What a user typed: ('key', key), ('prefix', hex) or ('name', 'graph:layer')."""
    if ":" in ref:
        split_name(ref)
        return "name", ref
    lowered = ref.lower()
    if is_hex(lowered):
        if len(lowered) == KEY_LENGTH:
            return "key", lowered
        if len(lowered) > KEY_LENGTH:
            raise InputError(f"too long for a layer key ({len(ref)} > {KEY_LENGTH} hex characters): {ref!r}")
        if len(lowered) < MIN_PREFIX_LENGTH:
            raise InputError(
                f"key prefix {ref!r} is too short: give at least {MIN_PREFIX_LENGTH} hex characters"
            )
        return "prefix", lowered
    raise InputError(f"not a key, key prefix (≥ {MIN_PREFIX_LENGTH} hex) or graph:layer name: {ref!r}")


def pick_one(ref: str, candidates: list[str] | set[str]) -> str | None:
    """The single key a prefix matched; None for no match; AmbiguousRef for several."""
    unique = sorted(set(candidates))
    if len(unique) > 1:
        shown = ", ".join(short(k) for k in unique[:5]) + (", ..." if len(unique) > 5 else "")
        raise AmbiguousRef(f"key prefix {ref} is ambiguous: {len(unique)} artifacts match ({shown})")
    return unique[0] if unique else None


class Layout:
    """Paths of one store directory, and lock-free reads of what is committed there."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    # ---- paths
    @property
    def objects_dir(self) -> Path:
        return self.root / "objects"

    @property
    def refs_dir(self) -> Path:
        return self.root / "refs"

    @property
    def locks_dir(self) -> Path:
        return self.root / "locks"

    @property
    def tmp_dir(self) -> Path:
        return self.root / "tmp"

    @property
    def config_path(self) -> Path:
        return self.root / CONFIG_FILE

    def object_dir(self, key: str) -> Path:
        return self.objects_dir / key[:2]

    def sqsh_path(self, key: str) -> Path:
        return self.object_dir(key) / (key + SQSH_SUFFIX)

    def record_path(self, key: str) -> Path:
        return self.object_dir(key) / (key + RECORD_SUFFIX)

    def manifest_path(self, key: str) -> Path:
        return self.object_dir(key) / (key + MANIFEST_SUFFIX)

    def envelope_path(self, key: str) -> Path:
        return self.object_dir(key) / (key + ENVELOPE_SUFFIX)

    def ref_path(self, name: str) -> Path:
        graph, layer = split_name(name)
        return self.refs_dir / graph / (layer + ".json")

    def key_lock_path(self, key: str) -> Path:
        return self.locks_dir / (key + ".lock")

    def ref_lock_path(self, name: str) -> Path:
        graph, layer = split_name(name)
        return self.locks_dir / f"ref.{graph}.{layer}.lock"

    # ---- lock-free reads
    def has(self, key: str) -> bool:
        """Committed: the .sqsh (linked last) and its record both exist."""
        return self.sqsh_path(key).is_file() and self.record_path(key).is_file()

    def read_record_dict(self, key: str) -> dict | None:
        try:
            text = self.record_path(key).read_bytes()
        except FileNotFoundError:
            return None
        try:
            data = json.loads(text)  # ValueError covers bytes that are not UTF-8
        except ValueError as exc:
            raise EfabuildError(f"{self.record_path(key)}: unreadable artifact record ({exc})") from None
        if not isinstance(data, dict):
            raise EfabuildError(f"{self.record_path(key)}: artifact record is not a JSON object")
        return data

    def keys(self) -> list[str]:
        """Keys of committed objects, sorted."""
        found = []
        try:
            fanouts = sorted(os.scandir(self.objects_dir), key=lambda e: e.name)
        except FileNotFoundError:
            return []
        for fanout in fanouts:
            if fanout.is_dir():
                found.extend(self._committed_in(Path(fanout.path), ""))
        return sorted(found)

    def keys_with_prefix(self, prefix: str) -> list[str]:
        return sorted(self._committed_in(self.objects_dir / prefix[:2], prefix))

    def _committed_in(self, directory: Path, prefix: str) -> list[str]:
        try:
            names = os.listdir(directory)
        except (FileNotFoundError, NotADirectoryError):
            return []
        present = set(names)
        keys = []
        for name in names:
            if name.endswith(SQSH_SUFFIX):
                key = name[: -len(SQSH_SUFFIX)]
                if is_key(key) and key.startswith(prefix) and key + RECORD_SUFFIX in present:
                    keys.append(key)
        return keys

    def read_refs(self, name: str) -> list[dict]:
        """History of `name` as [{"key", "time"}...], newest last; [] when unknown."""
        path = self.ref_path(name)
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            return []
        except ValueError as exc:
            raise EfabuildError(f"{path}: unreadable ref file ({exc})") from None
        history = data.get("history") if isinstance(data, dict) else None
        if not isinstance(history, list):
            raise EfabuildError(f"{path}: ref file has no history list")
        return [e for e in history if isinstance(e, dict) and is_key(e.get("key"))]

    def ref_names(self) -> list[str]:
        names = []
        try:
            graphs = sorted(os.listdir(self.refs_dir))
        except FileNotFoundError:
            return []
        for graph in graphs:
            try:
                files = sorted(os.listdir(self.refs_dir / graph))
            except NotADirectoryError:
                continue
            names.extend(f"{graph}:{f[:-5]}" for f in files if f.endswith(".json"))
        return names

    def read_config(self) -> dict:
        """store.toml as a dict ({} when absent): tells a bare store where its S3 tier is."""
        try:
            with open(self.config_path, "rb") as handle:
                return tomllib.load(handle)
        except FileNotFoundError:
            return {}
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"not valid TOML ({exc})", str(self.config_path)) from None


def newest_ref(layouts: list[Layout], name: str) -> dict | None:
    """The newest history entry of `name` over all these directories, None when none knows it."""
    newest: dict | None = None
    for layout in layouts:
        history = layout.read_refs(name)
        if history and (newest is None or str(history[-1].get("time", "")) > str(newest.get("time", ""))):
            newest = history[-1]
    return newest


def resolve_in(layouts: list[Layout], ref: str) -> str | None:
    """The key `ref` names according to these directories alone; None when they don't know it.

    A full key is returned as is (present or not). A name resolves to the newest entry of its
    history over all directories; a prefix to the one committed key it starts (AmbiguousRef if
    several).
    """
    kind, value = classify_ref(ref)
    if kind == "key":
        return value
    if kind == "name":
        newest = newest_ref(layouts, value)
        return None if newest is None else newest["key"]
    candidates: set[str] = set()
    for layout in layouts:
        candidates.update(layout.keys_with_prefix(value))
    return pick_one(value, candidates)
