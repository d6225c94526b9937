"""Helpers for the platform tests: one name published for several platforms through the store's
public API (an artifact per platform, its record naming the platform, then the name's index),
and the node's machine as `uname -m` would say it.

This machine has one architecture: a test that needs "the other" node replaces os.uname's
machine (`as_machine`), which is all efabuild reads of the host to pick a platform.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from efabuild.platforms import index_bytes, index_digest
from efabuild.store.record import utc_now
from tests.kits.storekit import key_for, make_sqsh, record_for

NAME = "demo:train"
BOTH = ("linux/amd64", "linux/arm64")


def publish_platforms(store, directory: Path, name: str = NAME, platforms=BOTH, *, signer=None,  # noqa: ANN001
                      label: str = "v1", manifests: dict | None = None) -> dict[str, str]:
    """{platform: key} of `name` published for each platform, with its index (signed by `signer`)."""
    keys = {}
    for platform in platforms:
        where = directory / f"{label}-{platform.replace('/', '-')}"
        where.mkdir(parents=True)
        key = key_for(f"{name}@{platform}/{label}")
        sqsh = make_sqsh(where, os.urandom(20_000))
        record = record_for(key, name, sqsh)._replace(platform=platform)
        store.publish(key, sqsh, record, (manifests or {}).get(platform))
        keys[platform] = key
    data = index_bytes(name, keys, utc_now())
    envelope = None
    if signer is not None:
        from efabuild.signing.attest import signed_index

        envelope = signed_index(data, signer=signer)
    store.publish_index(name, keys, envelope=envelope, data=data)
    return keys


def as_machine(monkeypatch, machine: str) -> None:  # noqa: ANN001 - pytest's monkeypatch
    """This process's node reports `machine` from uname -m (x86_64, aarch64)."""
    real = os.uname()
    fake = os.uname_result((real.sysname, real.nodename, real.release, real.version, machine))
    monkeypatch.setattr(os, "uname", lambda: fake)


def other_machine() -> tuple[str, str]:
    """(the uname -m of the architecture this machine is not, its platform)."""
    return ("aarch64", "linux/arm64") if os.uname().machine == "x86_64" else ("x86_64", "linux/amd64")


def index_of(root: Path, name: str = NAME) -> tuple[Path, dict]:
    """(the path of the index the newest entry of `name` names on this store directory, the entry)."""
    graph, layer = name.split(":")
    entry = json.loads((root / "refs" / graph / f"{layer}.json").read_text())["history"][-1]
    digest = entry["index"]
    return root / "platforms" / digest[:2] / f"{digest}.json", entry


def rewrite_index(root: Path, data: bytes, name: str = NAME) -> Path:
    """What a store writer can do: a new index, and the name's newest entry pointed at it."""
    graph, layer = name.split(":")
    digest = index_digest(data)
    path = root / "platforms" / digest[:2] / f"{digest}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    refs = root / "refs" / graph / f"{layer}.json"
    document = json.loads(refs.read_text())
    document["history"][-1]["index"] = digest
    refs.write_text(json.dumps(document))
    return path
