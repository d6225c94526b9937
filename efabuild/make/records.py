"""What was built: the inputs behind every key, and each layer's build history.

Kept under the local store (`builds/`), so a later plan can say which input changed since the last
build of a layer. Files are written with write-temp-then-rename: a reader sees a whole record or none.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from efabuild.configfile import read_bytes
from efabuild.keys import LayerInputs, canonical_json
from efabuild.host.fsutil import atomic_write_bytes
from efabuild.errors import InputError

HISTORY_LIMIT = 50
MAX_BYTES = 64 << 20  # a key's inputs list its context files: tens of MiB for the largest contexts


class BuildRecords:
    """`default_platform`: what an entry without a platform was built for (written before entries
    named theirs: a one-platform workspace's). A layer's entries of every platform share its file."""

    def __init__(self, store_root: Path, default_platform: str | None = None) -> None:
        self.default_platform = default_platform
        self.root = store_root / "builds"
        # the store's tmp/: a writer killed mid-write leaves its temp file where gc and make look
        self.tmp_dir = store_root / "tmp"

    def _key_path(self, key: str) -> Path:
        return self.root / "keys" / key[:2] / f"{key}.json"

    def _layer_path(self, qualname: str) -> Path:
        graph, layer = qualname.split(":", 1)
        return self.root / "layers" / graph / f"{layer}.json"

    def inputs(self, key: str) -> LayerInputs | None:
        data = _read_json(self._key_path(key))
        return LayerInputs.from_dict(data) if data else None

    def history(self, qualname: str) -> list[dict[str, Any]]:
        data = _read_json(self._layer_path(qualname))
        builds = data.get("builds") if data else None
        # entries without a key string are no builds (a damaged or planted file)
        return [entry for entry in builds if isinstance(entry, dict) and isinstance(entry.get("key"), str)] \
            if isinstance(builds, list) else []

    def last_key(self, qualname: str, platform: str | None = None) -> str | None:
        """The key of the layer's last build on `platform` (any platform's when it has none there,
        or none is given): a plan's baseline, whose reasons then say the platform changed."""
        history = self.history(qualname)
        on = [entry for entry in history if entry.get("platform", self.default_platform) == platform]
        history = on or history
        return history[-1]["key"] if history else None

    def built_keys(self, qualnames) -> set[str]:
        return {entry["key"] for name in qualnames for entry in self.history(name)}

    def record(self, qualname: str, key: str, inputs: LayerInputs, seconds: float | None = None) -> None:
        key_path = self._key_path(key)
        if not key_path.exists():
            # what a later plan compares; secrets only as digests (the key itself is already made)
            atomic_write_bytes(key_path, canonical_json(inputs.to_shown_dict()), self.tmp_dir)
        history = [entry for entry in self.history(qualname) if entry["key"] != key]
        entry: dict[str, Any] = {"key": key, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                 "platform": inputs.platform}
        if seconds is not None:
            entry["seconds"] = round(seconds, 3)
        history.append(entry)
        atomic_write_bytes(self._layer_path(qualname),
                           json.dumps({"builds": history[-HISTORY_LIMIT:]}, indent=1).encode(), self.tmp_dir)


def _read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`; None when absent, unreadable or not one (treated as absent: the
    next build rewrites it). The local store may sit on a shared path, so whatever is planted there
    is read bounded: a regular file, opened without blocking (a FIFO), of at most MAX_BYTES."""
    try:
        data = json.loads(read_bytes(path, str(path), MAX_BYTES))
    except (InputError, ValueError):
        return None
    return data if isinstance(data, dict) else None
