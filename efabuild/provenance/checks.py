"""What an audit says and what it is told: a check's status, and the facts gathered outside."""

from __future__ import annotations

import attrs

PASS, FAIL, WARN, SKIP = "ok", "FAIL", "warn", "skip"


@attrs.frozen
class Check:
    name: str
    status: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"check": self.name, "status": self.status, "message": self.message}


@attrs.frozen
class FileFacts:
    """The stored .sqsh as found now."""

    size: int
    digest: str  # blake3:<hex>


@attrs.frozen
class HostFacts:
    efa_installer: str | None = None
    source: str | None = None  # "--host-efa", a file path, or "BUILD.toml [audit]"


def failed(checks: list[Check]) -> bool:
    return any(c.status == FAIL for c in checks)
