"""The record stored beside every artifact: what it is, how big, its digest, how it was made."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from efabuild.errors import EfabuildError
from efabuild.store.layout import record_problems

RECORD_VERSION = 1


def utc_now() -> str:
    """UTC time as ISO 8601 with microseconds and a Z: sorts as text in time order."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ArtifactRecord(NamedTuple):
    key: str  # the layer key (64 hex)
    name: str  # "graph:layer" that produced it
    size: int  # bytes of the .sqsh
    digest: str  # "blake3:<hex>" of the .sqsh
    created: str  # UTC ISO time of the export
    export: Mapping[str, Any] = MappingProxyType({})  # export options (mksquashfs, tool versions)
    manifest_digest: str | None = None  # "blake3:<hex>" of the provenance manifest, if stored
    # hex sha256 of the .sqsh, for in-toto/cosign verifiers; None in records older than it
    sha256: str | None = None
    # "linux/arm64": the platform it was built for; None in records of one-platform stores made
    # before platforms were recorded (the workspace's single platform)
    platform: str | None = None
    # "blake3:<hex>" of the chunk index the artifact was cut into (ChunkIndex.identity): binds the
    # index's chunk ids to this record, so a lazy mount may serve chunks before reading them all;
    # None in records older than it and in stores that cut no chunks
    chunks: str | None = None

    @classmethod
    def for_file(
        cls,
        key: str,
        name: str,
        sqsh: str | os.PathLike[str],
        digest: str,
        export: dict[str, Any] | None = None,
        created: str | None = None,
        sha256: str | None = None,
        platform: str | None = None,
    ) -> ArtifactRecord:
        """A record for a freshly exported .sqsh (size read from the file)."""
        return cls(
            key=key,
            name=name,
            size=Path(sqsh).stat().st_size,
            digest=digest,
            created=created or utc_now(),
            export=dict(export or {}),
            sha256=sha256,
            platform=platform,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": RECORD_VERSION,
            "key": self.key,
            "name": self.name,
            "size": self.size,
            "digest": self.digest,
            "created": self.created,
            "export": dict(self.export),
            "manifest_digest": self.manifest_digest,
            **({"sha256": self.sha256} if self.sha256 is not None else {}),
            **({"platform": self.platform} if self.platform is not None else {}),
            **({"chunks": self.chunks} if self.chunks is not None else {}),
        }

    def to_json(self) -> bytes:
        """Deterministic bytes: sorted keys, fixed separators, trailing newline."""
        return (json.dumps(self.to_dict(), sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode()

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "artifact record") -> ArtifactRecord:
        """A record read from a store: every field of the right type, or one EfabuildError."""
        missing = [name for name in ("key", "name", "size", "digest", "created") if name not in data]
        if missing:
            raise EfabuildError(f"{where}: incomplete artifact record (missing {missing[0]!r})")
        if data.get("export") is not None and not isinstance(data["export"], dict):
            raise EfabuildError(f"{where}: " + "; ".join(record_problems(data)))
        export = data.get("export")
        record = cls(
            key=data["key"],
            name=data["name"],
            size=data["size"],
            digest=data["digest"],
            created=data["created"],
            export=dict(export or {}),
            manifest_digest=data.get("manifest_digest"),
            sha256=data.get("sha256"),
            platform=data.get("platform"),
            chunks=data.get("chunks"),
        )
        record.check(where)
        return record

    @classmethod
    def from_json(cls, text: bytes | str, where: str = "artifact record") -> ArtifactRecord:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            reason = "nested too deeply" if isinstance(exc, RecursionError) else exc
            raise EfabuildError(f"{where}: unreadable artifact record ({reason})") from None
        if not isinstance(data, dict):
            raise EfabuildError(f"{where}: artifact record is not a JSON object")
        return cls.from_dict(data, where)

    def check(self, where: str = "artifact record") -> None:
        """Refuse records that could not have come from a publish (damaged or forged)."""
        problems = record_problems(self.to_dict())
        if problems:
            raise EfabuildError(f"{where}: " + "; ".join(problems))
