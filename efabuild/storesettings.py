"""BUILD.toml's [store] table (and a bare store's store.toml): where a store's tiers are and its gc policy.

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

`workspace.py` (plan, make) and `store.config.locate` (lookup, ls, gc, audit) both call
`parse_store_table`, so a setting one accepts the other accepts too. Stdlib only: `efabuild lookup`
reads it on its fast path, and its values are NamedTuples (frozen, costing no import).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from efabuild import grammar
from efabuild.configfile import Table, type_name
from efabuild.errors import InputError
from efabuild.refs import classify_ref

BUILD_FILE = "BUILD.toml"
DEFAULT_LOCAL = "cache"
DEFAULT_KEEP = 3
S3_KEYS = ("bucket", "prefix", "region", "endpoint_url")
STORE_KEYS = ("local", "shared", "keep", "pins", "s3")
LOCAL_TIER = "local"  # the node's own tier; "shared" (FSx) and "store" (a bare path) every node sees
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
        return tiers + [(LOCAL_TIER, self.local)]


def _string(value: object, where: str, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise InputError(f"must be a string, not {type_name(value)}", where)
    if not value and not allow_empty:
        raise InputError("must not be empty", where)
    return value


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


def parse_s3_table(table: object, file: str, dotted: str) -> S3Config:
    """An S3 tier's table: BUILD.toml's [store.s3] or a bare store's store.toml [s3]."""
    t = Table(table, file, dotted, S3_KEYS, unknown_at_table=True)
    if "bucket" not in table:
        raise InputError("missing key 'bucket': the S3 tier needs a bucket", t.where())
    bucket = _string(table["bucket"], t.where("bucket"))
    prefix = _string(table.get("prefix", ""), t.where("prefix"), allow_empty=True).strip("/")
    optional = {}
    for name in ("region", "endpoint_url"):
        value = table.get(name)
        optional[name] = None if value is None else _string(value, t.where(name))
    for name, check in (("region", grammar.region_problem), ("endpoint_url", grammar.endpoint_url_problem)):
        problem = optional[name] and check(optional[name])
        if problem:
            raise InputError(problem, t.where(name))
    return S3Config(bucket, prefix, optional["region"], optional["endpoint_url"])


def parse_store_table(table: object, root: Path, file: str) -> StoreConfig:
    """BUILD.toml's [store] table (None when absent); `file` names BUILD.toml in messages."""
    t = Table({} if table is None else table, file, "store", STORE_KEYS, unknown_at_table=True)
    local = store_dir(t.data.get("local", DEFAULT_LOCAL), root, t.where("local"))
    shared = None if "shared" not in t.data else store_dir(t.data["shared"], root, t.where("shared"))
    keep = t.data.get("keep", DEFAULT_KEEP)
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise InputError(f"must be a whole number ≥ 1, not {keep!r}", t.where("keep"))
    pins = t.data.get("pins", [])
    if not isinstance(pins, list):
        raise InputError(f"must be a list of keys or graph:layer names, not {type_name(pins)}", t.where("pins"))
    for index, pin in enumerate(pins):
        pin_where = t.where(f"pins[{index}]")
        _string(pin, pin_where)
        try:
            classify_ref(pin)
        except InputError as exc:
            raise InputError(exc.problem, pin_where) from None
    s3 = None if t.data.get("s3") is None else parse_s3_table(t.data["s3"], file, "store.s3")
    return StoreConfig(local, shared, s3, keep, tuple(pins), file)
