"""Which store a command uses: one `StoreConfig`, parsed once, by one parser.

Stdlib only (`efabuild lookup` runs this on its fast path): the values are NamedTuples, which are
as frozen as attrs classes but cost no import.

A store is found, in order, from `--store PATH`, `$EFABUILD_STORE` (a bare store directory, e.g.
on a compute node; its S3 tier, if any, is read from PATH/store.toml), or the workspace: BUILD.toml
found at or above the current directory, its `[store]` table:

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

`workspace.py` (plan, make) and `locate` (lookup, ls, gc, audit) both call `parse_store_table`,
so a setting one accepts the other accepts too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from efabuild.configfile import load_toml
from efabuild.errors import InputError
from efabuild.grammar import endpoint_url_problem
from efabuild.store.layout import Layout
from efabuild.refs import classify_ref

BUILD_FILE = "BUILD.toml"
STORE_ENV = "EFABUILD_STORE"
DEFAULT_LOCAL = "cache"
DEFAULT_KEEP = 3
S3_KEYS = ("bucket", "prefix", "region", "endpoint_url")
STORE_KEYS = ("local", "shared", "keep", "pins", "s3")
# Kernel filesystems: a store there writes into the kernel's view, never onto a disk.
FORBIDDEN_ROOTS = (Path("/proc"), Path("/sys"), Path("/dev"))


class S3Config(NamedTuple):
    """Where a store's S3 tier is. Never credentials: boto3's standard chain supplies those."""

    bucket: str
    prefix: str = ""
    region: str | None = None
    endpoint_url: str | None = None


class StoreConfig(NamedTuple):
    """A store's tiers and gc policy; paths absolute."""

    local: Path
    shared: Path | None = None
    s3: S3Config | None = None
    keep: int = DEFAULT_KEEP  # gc keeps the newest N keys of every name
    pins: tuple[str, ...] = ()  # refs or keys gc never deletes
    source: str = BUILD_FILE  # what the settings came from, for messages
    bare: bool = False  # a store directory given by path, not a workspace's [store]

    def roots(self) -> list[tuple[str, Path]]:
        """Filesystem tiers in lookup order: shared first (every node sees it), then local."""
        if self.bare:
            return [("store", self.local)]
        tiers = [("shared", self.shared)] if self.shared else []
        return tiers + [("local", self.local)]


def _type_name(value: object) -> str:
    return {dict: "a table", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
            float: "a float"}.get(type(value), type(value).__name__)


def _string(value: object, where: str, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise InputError(f"must be a string, not {_type_name(value)}", where)
    if not value and not allow_empty:
        raise InputError("must not be empty", where)
    return value


def _known(table: dict, known: tuple[str, ...], where: str) -> None:
    for key in table:
        if key not in known:
            import difflib  # only for the message: lookup's fast path never pays for it

            hint = difflib.get_close_matches(str(key), known, n=1)
            suggestion = f" (did you mean '{hint[0]}'?)" if hint else f" (known: {', '.join(known)})"
            raise InputError(f"unknown key {key!r}{suggestion}", where)


def store_dir(value: object, base: Path, where: str) -> Path:
    """A store directory setting as an absolute path, or a one-line InputError.

    Refused: empty, NUL bytes, `~user` of no such user, the filesystem root, kernel filesystems
    (/proc, /sys, /dev), and anything that exists but is not a directory.
    """
    text = _string(value, where)
    if "\0" in text:
        raise InputError("must not contain a NUL byte", where)
    expanded = os.path.expanduser(text)
    if expanded.startswith("~"):
        raise InputError(f"{text!r}: no such user", where)
    path = Path(os.path.normpath(base / expanded))  # lexical: `..` is resolved, links are not
    try:
        real = path.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise InputError(f"{text!r}: cannot resolve ({exc})", where) from None
    for checked in {path, real}:
        if checked == Path(checked.anchor):
            raise InputError(f"{text!r} is the filesystem root; give a directory of its own", where)
        for forbidden in FORBIDDEN_ROOTS:
            if checked == forbidden or forbidden in checked.parents:
                raise InputError(f"{text!r} is under {forbidden}, not a place to store files", where)
    if real.exists() and not real.is_dir():
        raise InputError(f"{text!r} is not a directory (a store is a directory)", where)
    return path


def parse_s3_table(table: object, where: str) -> S3Config:
    if not isinstance(table, dict):
        raise InputError(f"must be a table, not {_type_name(table)}", where)
    _known(table, S3_KEYS, where)
    if "bucket" not in table:
        raise InputError("missing key 'bucket': the S3 tier needs a bucket", where)
    bucket = _string(table["bucket"], f"{where}.bucket")
    prefix = _string(table.get("prefix", ""), f"{where}.prefix", allow_empty=True).strip("/")
    optional = {}
    for name in ("region", "endpoint_url"):
        value = table.get(name)
        optional[name] = None if value is None else _string(value, f"{where}.{name}")
    problem = optional["endpoint_url"] and endpoint_url_problem(optional["endpoint_url"])
    if problem:
        raise InputError(problem, f"{where}.endpoint_url")
    return S3Config(bucket, prefix, optional["region"], optional["endpoint_url"])


def parse_store_table(table: object, root: Path, file: str) -> StoreConfig:
    """BUILD.toml's [store] table (None when absent); `file` names BUILD.toml in messages."""
    where = f"{file}: store"
    if table is None:
        table = {}
    if not isinstance(table, dict):
        raise InputError(f"must be a table, not {_type_name(table)}", where)
    _known(table, STORE_KEYS, where)
    local = store_dir(table.get("local", DEFAULT_LOCAL), root, f"{where}.local")
    shared = None if "shared" not in table else store_dir(table["shared"], root, f"{where}.shared")
    keep = table.get("keep", DEFAULT_KEEP)
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise InputError(f"must be a whole number ≥ 1, not {keep!r}", f"{where}.keep")
    pins = table.get("pins", [])
    if not isinstance(pins, list):
        raise InputError(f"must be a list of keys or graph:layer names, not {_type_name(pins)}",
                         f"{where}.pins")
    for index, pin in enumerate(pins):
        pin_where = f"{where}.pins[{index}]"
        _string(pin, pin_where)
        try:
            classify_ref(pin)
        except InputError as exc:
            raise InputError(exc.problem, pin_where) from None
    s3 = None if table.get("s3") is None else parse_s3_table(table["s3"], f"{where}.s3")
    return StoreConfig(local, shared, s3, keep, tuple(pins), file)


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
    s3 = None if s3 is None else parse_s3_table(s3, f"{root / 'store.toml'}: s3")
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
