"""The provenance manifest: deterministic JSON stored beside every artifact.

It pins what a `.sqsh` is (key, name, digest, size, export options), what was asked for (the base
and every layer's declared inputs, from the base up to this layer) and what is really inside
(the measured versions), with the tool versions and times of the build and the workspace's git
commit and remote (`vcs`, when it was a checkout: not in the .sqsh, which the key alone decides). `encode` gives the
canonical bytes whose blake3 the store records as `manifest_digest`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from efabuild import __version__
from efabuild.host.digest import bytes_digest
from efabuild.display import as_utf8
from efabuild.errors import EfabuildError
from efabuild.provenance.measured import Measured
from efabuild.redact import REDACTED, is_secret_arg

SCHEMA = "efabuild.manifest/v1"
_KEY = re.compile(r"^[0-9a-f]{64}$")
_DIGEST = re.compile(r"^blake3:[0-9a-f]{64}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def build_manifest(
    *,
    key: str,
    name: str,
    sqsh_digest: str,
    sqsh_size: int,
    export_options: Mapping[str, Any],
    base: Any,
    chain: list[Mapping[str, Any]],
    measured: Measured | Mapping[str, Any],
    builder: Mapping[str, Any],
    times: Mapping[str, Any],
    sqsh_sha256: str | None = None,
    vcs: Mapping[str, str] | None = None,
    platform: str | None = None,
    chunk_index: str | None = None,
) -> dict[str, Any]:
    """The manifest of one artifact.

    base: a `BaseImage`, a {"ref", "digest"} dict or None. chain: one {"layer", "key", "inputs"}
    per layer from the base up to this one (inputs as `LayerInputs.to_dict()` gives them: the
    Dockerfile text is replaced by its digest). builder: tool versions, e.g. {"buildkit": "v0.13.2"}
    (efabuild's own version is added). times: datetimes or ISO strings, e.g. started/finished.
    sqsh_sha256: hex sha256 of the .sqsh when the exporter computed it (for in-toto consumers).
    vcs: {"revision": HEAD's commit, "source": the remote's URL} of the workspace, what it has of them.
    platform: what the artifact was built for ("linux/arm64"), as its record says it too.
    chunk_index: the identity of the chunk index the .sqsh was cut into (ChunkIndex.identity), so
    that a signature over the statement covers the chunk ids a lazy mount serves by.
    """
    if not _KEY.match(key):
        raise EfabuildError(f"manifest: key {key!r} is not 64 lowercase hex characters")
    if not _DIGEST.match(sqsh_digest):
        raise EfabuildError(f"manifest: .sqsh digest {sqsh_digest!r} is not blake3:<hex>")
    if sqsh_sha256 is not None and not _SHA256.match(sqsh_sha256):
        raise EfabuildError(f"manifest: sha256 {sqsh_sha256!r} is not 64 lowercase hex characters")
    artifact: dict[str, Any] = {"digest": sqsh_digest, "size": int(sqsh_size), "export": _plain(export_options)}
    if sqsh_sha256 is not None:
        artifact["sha256"] = sqsh_sha256
    if chunk_index is not None:  # absent in manifests made before it, and where no chunks were cut
        if not _DIGEST.match(chunk_index):
            raise EfabuildError(f"manifest: chunk index {chunk_index!r} is not blake3:<hex>")
        artifact["chunk_index"] = chunk_index
    manifest = {
        "schema": SCHEMA,
        "key": key,
        "name": name,
        "artifact": artifact,
        "base": _base(base),
        "chain": [_chain_entry(entry) for entry in chain],
        "measured": measured.to_dict() if isinstance(measured, Measured) else _plain(measured),
        "builder": {"efabuild": __version__, **_plain(builder)},
        "times": {k: _utc(v) for k, v in sorted(times.items())},
    }
    if vcs:  # absent outside a git checkout, as in manifests made before it was recorded
        manifest["vcs"] = {k: str(v) for k, v in sorted(vcs.items())}
    if platform:  # absent in manifests made before it was recorded (the chain's inputs name it)
        manifest["platform"] = platform
    _check_no_floats(manifest, "manifest")
    return _utf8(manifest)


def _utf8(value: Any) -> Any:
    """Paths measured in an image may hold bytes that are not UTF-8: written `\\xNN`, since the
    manifest is UTF-8 JSON."""
    if isinstance(value, str):
        return as_utf8(value)
    if isinstance(value, dict):
        return {_utf8(k): _utf8(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_utf8(item) for item in value]
    return value


def encode(manifest: Mapping[str, Any]) -> bytes:
    """Canonical bytes: sorted keys, one-space indent, UTF-8, trailing newline."""
    _check_no_floats(manifest, "manifest")
    return (json.dumps(manifest, sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def digest(data: bytes) -> str:
    """"blake3:<hex>" of manifest bytes: what the store records as manifest_digest."""
    return bytes_digest(data)


def decode(data: bytes, where: str = "manifest") -> dict[str, Any]:
    """A stored manifest back as a dict; EfabuildError naming `where` when it is not one."""
    try:
        manifest = json.loads(data)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        reason = "nested too deeply" if isinstance(exc, RecursionError) else exc
        raise EfabuildError(f"{where}: unreadable manifest ({reason})") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        found = manifest.get("schema") if isinstance(manifest, dict) else type(manifest).__name__
        raise EfabuildError(f"{where}: not an efabuild manifest (schema {found!r}, expected {SCHEMA!r})")
    for field in ("key", "name", "artifact", "chain", "measured"):
        if field not in manifest:
            raise EfabuildError(f"{where}: manifest has no {field!r}")
    _check_shape(manifest, where)
    return manifest


# the container type every part of a manifest must have, so readers never meet a surprise
_SHAPE: tuple[tuple[tuple[str, ...], type], ...] = (
    (("artifact",), dict), (("chain",), list), (("measured",), dict),
    (("measured", "components"), dict), (("measured", "openmpi"), list), (("measured", "env"), dict),
)


def _check_shape(manifest: Mapping[str, Any], where: str) -> None:
    for path, kind in _SHAPE:
        value: Any = manifest
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None and not isinstance(value, kind):
            raise EfabuildError(f"{where}: manifest field {'.'.join(path)} is not a{'n array' if kind is list else ' table'}")
    components = manifest["measured"].get("components") or {}
    if any(not isinstance(entry, dict) for entry in components.values()) or \
            any(not isinstance(entry, dict) for entry in manifest["chain"] + (manifest["measured"].get("openmpi") or [])):
        raise EfabuildError(f"{where}: manifest has an entry that is not a table")


def measured_of(manifest: Mapping[str, Any]) -> Measured:
    return Measured.from_dict(manifest.get("measured") or {})


def platform_of(manifest: Mapping[str, Any]) -> str | None:
    """The platform the artifact's own layer was built for (its key's input), None when unknown."""
    if isinstance(manifest.get("platform"), str):
        return manifest["platform"]
    chain = manifest.get("chain") or []
    inputs = (chain[-1].get("inputs") if isinstance(chain[-1], dict) else None) if chain else None
    platform = inputs.get("platform") if isinstance(inputs, dict) else None
    return platform if isinstance(platform, str) else None


def declared_args(manifest: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """Build args over the whole chain: name -> (value, layer). A later layer's value wins."""
    found: dict[str, tuple[str, str]] = {}
    for entry in manifest.get("chain", []):
        for arg, value in ((entry.get("inputs") or {}).get("args") or {}).items():
            found[arg] = (value, entry.get("layer", "?"))
    return found


# ---- helpers ---------------------------------------------------------------------------------
def _base(base: Any) -> dict[str, Any] | None:
    if base is None:
        return None
    if isinstance(base, Mapping):  # a multi-platform base: its index's digest beside the platform's
        index = {"index_digest": base["index_digest"]} if base.get("index_digest") else {}
        return {"ref": base.get("ref"), "digest": base.get("digest"), **index}
    return {"ref": getattr(base, "ref", None), "digest": getattr(base, "digest", None)}


def _chain_entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    inputs = dict(entry.get("inputs") or {})
    text = inputs.pop("dockerfile", None)
    if text is not None:
        inputs["dockerfile_digest"] = digest(text.encode("utf-8"))
    if "args" in inputs:
        inputs["args"] = {k: REDACTED if is_secret_arg(k, str(v)) else v for k, v in dict(inputs["args"]).items()}
    return {"layer": entry["layer"], "key": entry["key"], "inputs": _plain(inputs)}


def _utc(value: Any) -> str:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise EfabuildError("manifest: times must be timezone-aware")
        return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(value, str):
        return value
    raise EfabuildError(f"manifest: time {value!r} is neither a datetime nor an ISO string")


def _plain(value: Any) -> Any:
    """A JSON-ready copy: mappings to dicts, tuples to lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _check_no_floats(value: Any, where: str) -> None:
    # floats print differently across versions and platforms: a manifest holds none
    if isinstance(value, float):
        raise EfabuildError(f"{where}: floats are not allowed in a manifest ({value!r})")
    if isinstance(value, Mapping):
        for k, v in value.items():
            _check_no_floats(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_no_floats(v, f"{where}[{i}]")
