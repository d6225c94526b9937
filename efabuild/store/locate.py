"""Which store a command uses, found cheaply (stdlib only: `efabuild lookup` runs this).

In order: `--store PATH`, then `$EFABUILD_STORE` (a bare store directory, e.g. on a compute node;
its S3 tier, if any, is read from PATH/store.toml), then the workspace: walk up from the current
directory to BUILD.toml and read only its `[store]` table:

    [store]
    local = "cache"              # default; relative to the workspace
    shared = "/fsx/efabuild"     # optional shared filesystem (FSx for Lustre)
    keep = 3                     # gc keeps the newest N keys of every name
    pins = ["ngc-efa:user"]      # refs or keys gc never deletes

    [store.s3]                   # optional
    bucket = "my-bucket"
    prefix = "efabuild"
    region = "us-east-1"
    endpoint_url = "http://127.0.0.1:9000"   # S3-compatible stores only
"""

from __future__ import annotations

import os
from pathlib import Path

from efabuild.configfile import load_toml
from efabuild.errors import InputError
from efabuild.grammar import endpoint_url_problem
from efabuild.store.layout import Layout, classify_ref

BUILD_FILE = "BUILD.toml"
STORE_ENV = "EFABUILD_STORE"
DEFAULT_LOCAL = "cache"
DEFAULT_KEEP = 3
S3_KEYS = ("bucket", "prefix", "region", "endpoint_url")
STORE_KEYS = ("local", "shared", "keep", "pins", "s3")


class StoreTable:
    """The [store] table, validated; paths absolute. (A plain class: no attrs on the fast path.)"""

    __slots__ = ("local", "shared", "s3", "keep", "pins", "source", "bare")

    def __init__(self, local: Path, shared: Path | None, s3: dict | None, keep: int,
                 pins: tuple[str, ...], source: str, bare: bool = False) -> None:
        self.local = local
        self.shared = shared
        self.s3 = s3  # {"bucket", "prefix", "region", "endpoint_url"} or None
        self.keep = keep
        self.pins = pins
        self.source = source  # what the settings came from, for messages
        self.bare = bare  # a store directory given by path, not a workspace's settings

    def roots(self) -> list[tuple[str, Path]]:
        """Filesystem tiers in lookup order: shared first (every node sees it), then local."""
        if self.bare:
            return [("store", self.local)]
        tiers = [("shared", self.shared)] if self.shared else []
        return tiers + [("local", self.local)]


def find_build_toml(start: Path) -> Path | None:
    start = start.absolute()
    for directory in (start, *start.parents):
        candidate = directory / BUILD_FILE
        if candidate.is_file():
            return candidate
    return None


def _string(value: object, where: str, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not allow_empty):
        raise InputError(f"must be a non-empty string, not {value!r}", where)
    return value


def parse_s3_table(table: object, where: str) -> dict:
    if not isinstance(table, dict):
        raise InputError(f"must be a table, not {table!r}", where)
    unknown = sorted(set(table) - set(S3_KEYS))
    if unknown:
        raise InputError(f"unknown key {unknown[0]!r} (known: {', '.join(S3_KEYS)})", where)
    if "bucket" not in table:
        raise InputError("missing key 'bucket'", where)
    s3 = {"bucket": _string(table["bucket"], f"{where}.bucket")}
    s3["prefix"] = _string(table.get("prefix", ""), f"{where}.prefix", allow_empty=True).strip("/")
    for name in ("region", "endpoint_url"):
        value = table.get(name)
        s3[name] = None if value is None else _string(value, f"{where}.{name}")
    problem = s3["endpoint_url"] and endpoint_url_problem(s3["endpoint_url"])
    if problem:
        raise InputError(problem, f"{where}.endpoint_url")
    return s3


def parse_store_table(table: object, root: Path, where: str) -> StoreTable:
    """Validate a [store] table; `where` is e.g. 'BUILD.toml: store' for one-line messages."""
    if table is None:
        table = {}
    if not isinstance(table, dict):
        raise InputError(f"must be a table, not {table!r}", where)
    unknown = sorted(set(table) - set(STORE_KEYS))
    if unknown:
        raise InputError(f"unknown key {unknown[0]!r} (known: {', '.join(STORE_KEYS)})", where)
    local = root / Path(_string(table.get("local", DEFAULT_LOCAL), f"{where}.local")).expanduser()
    shared = table.get("shared")
    shared_path = None if shared is None else root / Path(_string(shared, f"{where}.shared")).expanduser()
    keep = table.get("keep", DEFAULT_KEEP)
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise InputError(f"must be a whole number ≥ 1, not {keep!r}", f"{where}.keep")
    pins = table.get("pins", [])
    if not isinstance(pins, list):
        raise InputError(f"must be a list of keys or graph:layer names, not {pins!r}", f"{where}.pins")
    for index, pin in enumerate(pins):
        pin_where = f"{where}.pins[{index}]"
        _string(pin, pin_where)
        try:
            classify_ref(pin)
        except InputError as exc:
            raise InputError(exc.problem, pin_where) from None
    s3 = None if table.get("s3") is None else parse_s3_table(table["s3"], f"{where}.s3")
    return StoreTable(local.absolute(), shared_path.absolute() if shared_path else None, s3, keep,
                      tuple(pins), where.split(":")[0])


def load_build_store(build_toml: Path) -> StoreTable:
    data = load_toml(build_toml, str(build_toml))
    return parse_store_table(data.get("store"), build_toml.parent, f"{build_toml}: store")


def bare_store(path: str, source: str) -> StoreTable:
    """A store directory given by path: one filesystem tier, S3 from its store.toml."""
    expanded = os.path.expanduser(path)
    if expanded.startswith("~"):
        raise InputError(f"{path!r}: no such user", source)
    root = Path(expanded).absolute()
    if root.exists() and not root.is_dir():
        raise InputError(f"{path!r} is not a directory (a store is a directory)", source)
    config = Layout(root).read_config()
    s3 = config.get("s3")
    s3 = None if s3 is None else parse_s3_table(s3, f"{root / 'store.toml'}: s3")
    return StoreTable(root, None, s3, DEFAULT_KEEP, (), source, bare=True)


def locate(store: str | None, cwd: Path | None = None) -> StoreTable:
    """The store for a command: --store, then $EFABUILD_STORE, then the workspace's [store]."""
    if store:
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
