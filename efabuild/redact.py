"""Which build args hold secrets, and how they are shown: never their value.

Secrets do not belong in build args (lint rule EFA013 says so); when one is there anyway, plans,
build records and manifests show a short digest instead, so a change is still visible.
"""

from __future__ import annotations

import blake3

SECRET_WORDS = ("SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "ACCESS_KEY", "PRIVATE")
REDACTED = "<redacted>"


def is_secret_name(name: str) -> bool:
    return any(word in name.upper() for word in SECRET_WORDS)


def shown_value(name: str, value: str) -> str:
    """`value`, or for a secret a stand-in that changes when the value changes (idempotent)."""
    if not is_secret_name(name) or (value.startswith("<redacted") and value.endswith(">")):
        return value
    return f"<redacted {blake3.blake3(f'{name}={value}'.encode()).hexdigest()[:12]}>"


def shown_args(args: dict[str, str]) -> dict[str, str]:
    return {name: shown_value(name, value) for name, value in args.items()}
