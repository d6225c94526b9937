"""The one local resolver: which key a ref names in the filesystem tiers and which tier holds an
intact copy, for `efabuild lookup`'s fast path (efabuild/pyxis/lookup.py) and `Store.resolve`.

A hit on a filesystem tier costs a few stats and small file reads: this module and what it
imports on that path are stdlib only (no attrs, boto3, python-on-whales).
"""

from __future__ import annotations

from efabuild.errors import EfabuildError
from efabuild.display import shown
from efabuild.store.layout import Layout, newest_ref, record_problems, resolve_in
from efabuild.refs import classify_ref
from efabuild.settings import StoreConfig


def local_key(layouts: list[Layout], ref: str) -> tuple[str | None, bool]:
    """(the key `ref` names according to these directories alone, or None; whether that answer
    is a name these directories only copied from S3 at a fetch, so that S3 says which key it
    names now). The one local resolver: `efabuild lookup`'s fast path and `Store.resolve`."""
    kind, value = classify_ref(ref)
    if kind != "name":
        return resolve_in(layouts, ref), False
    newest = newest_ref(layouts, value)
    if newest is None:
        return None, False
    return newest["key"], newest.get("via") == "s3"


def find_local(table: StoreConfig, ref: str, ask_s3: bool = False) -> tuple[str, Layout, dict] | None:
    """(key, layout of the tier holding it, its record) when a filesystem tier holds it intact,
    else None.

    Intact: the .sqsh and its record are regular files in the store (nothing below the store's
    root is followed) and the .sqsh has the size its record says (a stat; --verify re-hashes).
    A tier whose copy is not is passed over; when no tier has a good copy, the first problem
    found is raised, unless S3 can still supply it. With `ask_s3`, a name these tiers only copied
    from S3 at a fetch is not answered here: S3 says which key it names now.
    """
    layouts = [Layout(root) for _, root in table.roots()]
    key, via_s3 = local_key(layouts, ref)
    if key is None or (ask_s3 and via_s3):
        return None
    hit, problems = first_intact(layouts, key)
    if hit is not None:
        return key, *hit
    if problems and not ask_s3:
        raise problems[0]
    return None


def first_intact(layouts: list[Layout], key: str) -> tuple[tuple[Layout, dict] | None, list[EfabuildError]]:
    """((the first of these directories whose copy of `key` is intact, its record) or None; what
    is wrong with each copy passed over): the one check of every route that hands out a path."""
    problems = []
    for layout in layouts:
        try:
            record = intact_record(layout, key)
        except EfabuildError as exc:
            problems.append(exc)
            continue
        if record is not None:
            return (layout, record), problems
    return None, problems


def intact_record(layout: Layout, key: str) -> dict | None:
    """The record of `key` in this directory when its .sqsh is there and has the recorded size."""
    info = layout.committed(key)
    if info is None:
        return None
    record = layout.read_record_dict(key)
    if record is None:
        return None
    path = shown(layout.record_path(key))
    problems = record_problems(record)
    if problems:
        raise EfabuildError(f"{path}: " + "; ".join(problems))
    if record["key"] != key:
        raise EfabuildError(f"{path}: the record is for key {record['key'][:12]}, not for its file name")
    size = record["size"]
    if info.st_size != size:
        raise EfabuildError(f"{shown(layout.sqsh_path(key))}: corrupt artifact: {info.st_size} bytes, "
                            f"its record says {size}")
    return record
