"""The one local resolver: which key a ref names in the filesystem tiers and which tier holds an
intact copy, for `efabuild lookup`'s fast path (efabuild/pyxis/lookup.py) and `Store.resolve`.

A hit on a filesystem tier costs a few stats and small file reads: this module and what it
imports on that path are stdlib only (no attrs, boto3, python-on-whales).
"""

from __future__ import annotations

from efabuild.errors import EfabuildError
from efabuild.display import shown
from efabuild.store.layout import Layout, newest_ref, record_problems, resolve_in
from efabuild.store.platformindex import IndexVet, Resolved, Wanted, check_record, choose, manifest_platform_of
from efabuild.refs import classify_ref
from efabuild.storesettings import StoreConfig


def local_choice(layouts: list[Layout], wanted: Wanted, vet: IndexVet | None = None) -> Resolved | None:
    """What `wanted` names according to these directories alone (None: they don't know it). The
    one local resolver: `efabuild lookup`'s fast path and `Store.resolve`. A name whose newest
    entry names a platform index resolves to the key of the platform wanted (platformindex.py)."""
    kind, value = classify_ref(wanted.ref)
    if kind != "name":
        key = resolve_in(layouts, wanted.ref)
        return None if key is None else Resolved(key)
    newest = newest_ref(layouts, value)
    if newest is None:
        return None
    found_in = [layouts[0]]  # the directory the index was read from: what a message about it names

    def read(digest: str) -> tuple[bytes | None, bytes | None]:
        for layout in layouts:
            found = layout.read_platform_index(digest)
            if found[0] is not None:
                found_in[0] = layout
                return found
        return None, None

    return choose(newest, value, wanted, read, lambda digest: shown(found_in[0].platform_index_path(digest)), vet)


def find_local(table: StoreConfig, ref: str, ask_s3: bool = False, *, wanted: Wanted | None = None,
               vet: IndexVet | None = None) -> tuple[str, Layout, dict] | None:
    """(key, layout of the tier holding it, its record) when a filesystem tier holds it intact,
    else None.

    Intact: the .sqsh and its record are regular files in the store (nothing below the store's
    root is followed) and the .sqsh has the size its record says (a stat; --verify re-hashes).
    A tier whose copy is not is passed over; when no tier has a good copy, the first problem
    found is raised, unless S3 can still supply it. With `ask_s3`, a name these tiers only copied
    from S3 at a fetch is not answered here: S3 says which key it names now. A key a platform
    index picked must have a record of that name and platform (else EfabuildError).
    """
    layouts = [Layout(root) for _, root in table.roots()]
    wanted = Wanted.of(ref) if wanted is None else wanted
    resolved = local_choice(layouts, wanted, vet)
    if resolved is None or (ask_s3 and resolved.via_s3):
        return None
    key = resolved.key
    hit, problems = first_intact(layouts, key)
    if hit is not None:
        check_record(resolved, wanted, hit[1], manifest_platform_of(hit[0], key), signed=vet is not None)
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
