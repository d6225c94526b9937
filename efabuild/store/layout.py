"""Where things live in a store directory, and reading them without side effects.

Stdlib only (no attrs, boto3, docker): `efabuild lookup` imports this module on its fast path.

    <root>/objects/<k[:2]>/<key>.sqsh            the artifact (read-only once published)
    <root>/objects/<k[:2]>/<key>.json            its record (ArtifactRecord as JSON)
    <root>/objects/<k[:2]>/<key>.manifest.json   its provenance manifest, when there is one
    <root>/objects/<k[:2]>/<key>.intoto.jsonl    its signed in-toto statement (DSSE), when signed
    <root>/refs/<graph>/<layer>.json             name -> history of keys, newest last
    <root>/platforms/<d[:2]>/<d>.json            a name's platform index (platform -> key), by its sha256
    <root>/platforms/<d[:2]>/<d>.dsse.json       its DSSE envelope, when make signs
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
import stat
from pathlib import Path

from efabuild import notices
from efabuild.display import shown
from efabuild.errors import EfabuildError, InputError
from efabuild.grammar import PLATFORM
from efabuild.refs import NAME_PART, classify_ref, is_key, pick_one, split_name
from efabuild.host import fsutil

SQSH_SUFFIX = ".sqsh"
RECORD_SUFFIX = ".json"
MANIFEST_SUFFIX = ".manifest.json"
ENVELOPE_SUFFIX = ".intoto.jsonl"
INDEX_SUFFIX = ".chunks.json"  # the chunk index kept beside an artifact (chunks/cdc.py)
CONFIG_FILE = "store.toml"
# a directory someone put at an artifact's name, moved aside into tmp/ by the publish that
# repaired it (gc removes it: store/gc/leftovers.py)
PLANTED_PREFIX = "planted"
# Upper bounds of what efabuild writes, so a planted file cannot make a reader exhaust memory
RECORD_LIMIT = 1 << 20
REFS_LIMIT = 4 << 20  # MAX_REF_HISTORY entries
MANIFEST_LIMIT = 64 << 20
ENVELOPE_LIMIT = 4 << 20
CONFIG_LIMIT = 1 << 20
PLATFORM_INDEX_SUFFIX = ".json"
PLATFORM_ENVELOPE_SUFFIX = ".dsse.json"
PLATFORM_INDEX_LIMIT = 64 << 10  # platforms.INDEX_LIMIT: a few platforms are a few hundred bytes
PLATFORM_ENVELOPE_LIMIT = 256 << 10


def _warn(message: str, *args: object) -> None:
    notices.warn(message % args)

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

    def platform_index_path(self, digest: str) -> Path:
        return self.root / "platforms" / digest[:2] / (digest + PLATFORM_INDEX_SUFFIX)

    def platform_envelope_path(self, digest: str) -> Path:
        return self.root / "platforms" / digest[:2] / (digest + PLATFORM_ENVELOPE_SUFFIX)

    def read_platform_index(self, digest: str) -> tuple[bytes | None, bytes | None]:
        """(the index named by `digest`, its envelope), each None when absent; bounded, never
        through a link (UnsafeEntry)."""
        if not is_key(digest):
            raise EfabuildError(f"{shown(self.refs_dir)}: a history entry names index {_brief_value(digest)}, "
                                f"not 64 hex characters")
        data = fsutil.read_under(self.root, self.platform_index_path(digest), PLATFORM_INDEX_LIMIT)
        if data is None:
            return None, None
        return data, fsutil.read_under(self.root, self.platform_envelope_path(digest), PLATFORM_ENVELOPE_LIMIT)

    def ref_path(self, name: str) -> Path:
        graph, layer = split_name(name)
        return self.refs_dir / graph / (layer + ".json")

    def key_lock_path(self, key: str) -> Path:
        return self.locks_dir / (key + ".lock")

    def build_lock_path(self, key: str) -> Path:
        """Held by the make building, exporting and publishing `key` (local store only)."""
        return self.locks_dir / (key + ".build")

    def ref_lock_path(self, name: str) -> Path:
        graph, layer = split_name(name)
        return self.locks_dir / f"ref.{graph}.{layer}.lock"

    # ---- lock-free reads (nothing below the root is followed: see fsutil)
    def committed(self, key: str) -> os.stat_result | None:
        """lstat of the .sqsh when the object is committed (its .sqsh, linked last, and its record
        both exist); None when not. UnsafeEntry when either is not a regular file."""
        try:
            with fsutil.store_dir(self.root, "objects", key[:2]) as fd:
                info = fsutil.stat_file(fd, key + SQSH_SUFFIX, self.sqsh_path(key))
                if info is None or fsutil.stat_file(fd, key + RECORD_SUFFIX, self.record_path(key)) is None:
                    return None
                return info
        except (FileNotFoundError, NotADirectoryError):
            return None

    def has(self, key: str) -> bool:
        """Committed, and both files are what efabuild writes (regular files)."""
        try:
            return self.committed(key) is not None
        except fsutil.UnsafeEntry:
            return False

    def read_record_dict(self, key: str) -> dict | None:
        path = self.record_path(key)
        text = fsutil.read_under(self.root, path, RECORD_LIMIT)
        if text is None:
            return None
        data = _parse_json(text, path, "artifact record")
        if not isinstance(data, dict):
            raise EfabuildError(f"{shown(path)}: artifact record is not a JSON object")
        return data

    def keys(self) -> list[str]:
        """Keys of committed objects, sorted. Entries efabuild does not write are skipped with a
        warning that names them."""
        found = []
        for name, mode in self._entries("objects"):
            if stat.S_ISDIR(mode):
                found.extend(self._committed_in(self.objects_dir / name, ""))
            elif stat.S_ISLNK(mode):
                _warn("skipping %s: a symbolic link, not a directory", shown(self.objects_dir / name))
        return sorted(found)

    def _entries(self, directory: str) -> list[tuple[str, int]]:
        """(name, lstat mode) of each entry of a top directory of the store, sorted; [] when it
        is absent, with a warning when it is not a plain directory."""
        try:
            with fsutil.store_dir(self.root, directory) as fd:
                return sorted((e.name, e.stat(follow_symlinks=False).st_mode) for e in os.scandir(fd))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except fsutil.UnsafeEntry as exc:
            _warn("skipping %s", exc)
            return []

    def keys_with_prefix(self, prefix: str) -> list[str]:
        return sorted(self._committed_in(self.objects_dir / prefix[:2], prefix))

    def _committed_in(self, directory: Path, prefix: str) -> list[str]:
        try:
            with fsutil.store_dir(self.root, *fsutil.relative_parts(self.root, directory)) as fd:
                names = os.listdir(fd)
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
        """History of `name` as [{"key", "time"}...], newest last; [] when unknown. An entry a
        several-platform make wrote also has "index": the sha256 of the name's platform index."""
        path = self.ref_path(name)
        text = fsutil.read_under(self.root, path, REFS_LIMIT)
        if text is None:
            return []
        data = _parse_json(text, path, "ref file")
        history = data.get("history") if isinstance(data, dict) else None
        if not isinstance(history, list):
            raise EfabuildError(f"{shown(path)}: ref file has no history list")
        return [e for e in history
                if isinstance(e, dict) and is_key(e.get("key")) and isinstance(e.get("time", ""), str)]

    def ref_names(self) -> list[str]:
        """Every graph:layer with a ref file; other entries under refs/ are skipped with a warning."""
        names = []
        for graph_name, mode in self._entries("refs"):
            where = self.refs_dir / graph_name
            if not stat.S_ISDIR(mode):
                _warn("skipping %s: %s, not a directory of ref files", shown(where), fsutil.kind_of(mode))
                continue
            try:
                with fsutil.store_dir(self.root, "refs", graph_name) as fd:
                    files = sorted(os.listdir(fd))
            except (FileNotFoundError, NotADirectoryError, fsutil.UnsafeEntry):
                continue
            for file in files:
                layer = file[:-5] if file.endswith(".json") else ""
                if not (NAME_PART.fullmatch(graph_name) and NAME_PART.fullmatch(layer)):
                    if not file.startswith("."):  # editors' and tools' hidden files
                        _warn("skipping %s: not a ref file name (graph/layer.json)",
                                    shown(where / file))
                    continue
                names.append(f"{graph_name}:{layer}")
        return names

    def read_config(self) -> dict:
        """store.toml as a dict ({} when absent): tells a bare store where its S3 tier is."""
        try:
            text = fsutil.read_under(self.root, self.config_path, CONFIG_LIMIT)
        except fsutil.UnsafeEntry as exc:
            raise InputError(str(exc)) from None
        except FileNotFoundError:
            return {}
        if text is None:
            return {}
        from efabuild.configfile import parse_toml

        where = shown(self.config_path)
        try:
            return parse_toml(text.decode("utf-8"), where)
        except UnicodeDecodeError as exc:
            raise InputError(f"not UTF-8 text (byte {exc.start})", where) from None


def _brief(exc: BaseException) -> str:
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)


def _parse_json(text: bytes, path: Path, what: str) -> object:
    try:
        return json.loads(text)  # ValueError covers bytes that are not UTF-8
    except (ValueError, RecursionError) as exc:
        raise EfabuildError(f"{shown(path)}: unreadable {what} ({_brief(exc)})") from None


def _is_blake3(value: object) -> bool:
    # efabuild.host.digest.is_digest, without importing blake3 on lookup's fast path
    return isinstance(value, str) and value.startswith("blake3:") and is_key(value[len("blake3:"):])


def _brief_value(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def record_problems(data: dict) -> list[str]:
    """What is wrong with an artifact record read from a store ([] when nothing): a damaged or
    forged record names each field of the wrong type or form."""
    problems = [f"missing {name!r}" for name in ("key", "name", "size", "digest", "created") if name not in data]
    if problems:
        return problems
    if not is_key(data["key"]):
        problems.append(f"key {_brief_value(data['key'])} is not 64 hex characters")
    size = data["size"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        problems.append(f"size {_brief_value(size)} is not a byte count")
    if not _is_blake3(data["digest"]):
        problems.append(f"digest {_brief_value(data['digest'])} is not blake3:<hex>")
    manifest_digest = data.get("manifest_digest")
    if manifest_digest is not None and not _is_blake3(manifest_digest):
        problems.append(f"manifest_digest {_brief_value(manifest_digest)} is not blake3:<hex>")
    chunks = data.get("chunks")
    if chunks is not None and not _is_blake3(chunks):
        problems.append(f"chunks {_brief_value(chunks)} is not blake3:<hex>")
    sha256 = data.get("sha256")
    if sha256 is not None and not is_key(sha256):  # 64 lowercase hex, as is a key
        problems.append(f"sha256 {_brief_value(sha256)} is not 64 lowercase hex characters")
    platform = data.get("platform")
    if platform is not None and not (isinstance(platform, str) and PLATFORM.fullmatch(platform)):
        problems.append(f"platform {_brief_value(platform)} is not os/arch[/variant]")
    name = data["name"]
    graph, sep, layer = name.partition(":") if isinstance(name, str) else ("", "", "")
    if not (sep and NAME_PART.fullmatch(graph) and NAME_PART.fullmatch(layer)):
        problems.append(f"name {_brief_value(name)} is not graph:layer")
    if not isinstance(data["created"], str) or not data["created"]:
        problems.append(f"created {_brief_value(data['created'])} is not a time")
    export = data.get("export")
    if export is not None and not isinstance(export, dict):
        problems.append(f"export {_brief_value(export)} is not a table of export options")
    return problems


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
