"""Which store a command uses: one `StoreConfig` (settings.py parses it), located once.

Stdlib only (`efabuild lookup` runs this on its fast path).

A store is found, in order, from `--store PATH`, `$EFABUILD_STORE` (a bare store directory, e.g.
on a compute node; its S3 tier, if any, is read from PATH/store.toml), or the workspace: BUILD.toml
found at or above the current directory, its `[store]` table.
"""

from __future__ import annotations

import os
from pathlib import Path

from efabuild.configfile import load_toml
from efabuild.errors import InputError
from efabuild.storesettings import BUILD_FILE, DEFAULT_KEEP, S3Config, StoreConfig, parse_s3_table, parse_store_table, store_dir
from efabuild.store.layout import Layout

STORE_ENV = "EFABUILD_STORE"


def find_build_toml(start: Path) -> Path | None:
    start = start.absolute()
    for directory in (start, *start.parents):
        candidate = directory / BUILD_FILE
        if candidate.is_file():
            return candidate
    return None


def load_build_store(build_toml: Path) -> StoreConfig:
    data = load_toml(build_toml, str(build_toml))
    return parse_store_table(data.get("store"), build_toml.parent, str(build_toml))


def bare_store(path: str, source: str) -> StoreConfig:
    """A store directory given by path: one filesystem tier, S3 from its store.toml."""
    root = store_dir(path, Path.cwd(), source)
    config = Layout(root).read_config()
    s3 = config.get("s3")
    s3 = None if s3 is None else parse_s3_table(s3, str(root / "store.toml"), "s3")
    return StoreConfig(root, None, s3, DEFAULT_KEEP, (), source, bare=True)


def locate(store: str | None, cwd: Path | None = None) -> StoreConfig:
    """The store for a command: --store, then $EFABUILD_STORE, then the workspace's [store]."""
    if store is not None:
        return bare_store(store, "--store")
    env = os.environ.get(STORE_ENV)
    if env:
        return bare_store(env, STORE_ENV)
    build_toml = find_build_toml(cwd or Path.cwd())
    if build_toml is None:
        raise InputError(
            f"no store: give --store PATH, set {STORE_ENV}, or run inside a workspace (no {BUILD_FILE} "
            f"in {cwd or Path.cwd()} or above)"
        )
    return load_build_store(build_toml)


def store_config_text(s3: S3Config) -> str:
    """store.toml for a store directory: where its S3 tier is. Never credentials."""
    import json  # TOML's basic strings are JSON's; loaded here, off lookup's path

    lines = [
        "# Where this store's S3 tier is; written by efabuild when it publishes.",
        "# No credentials here: boto3's standard chain (environment, ~/.aws, instance role) supplies them.",
        "[s3]",
    ]
    for name in ("bucket", "prefix", "region", "endpoint_url"):
        value = getattr(s3, name)
        if value:
            lines.append(f"{name} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"
