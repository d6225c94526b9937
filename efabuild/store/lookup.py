"""`efabuild lookup REF`: the path of an artifact's .sqsh, for job scripts and Pyxis.

A hit on a filesystem tier costs a few stats and small file reads: this module and what it
imports on that path are stdlib only (no attrs, boto3, python-on-whales). Only a miss, when the
store has an S3 tier and fetching is allowed, loads the full store.
"""

from __future__ import annotations

from pathlib import Path

from efabuild.errors import EfabuildError
from efabuild.store.fsutil import shown
from efabuild.store.layout import SQSH_SUFFIX, Layout, newest_ref, record_problems, resolve_in
from efabuild.refs import classify_ref
from efabuild.settings import StoreConfig
from efabuild.store.config import locate


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
    problems = []
    for layout in layouts:
        try:
            record = intact_record(layout, key)
        except EfabuildError as exc:
            problems.append(exc)
            continue
        if record is not None:
            return key, layout, record
    if problems and not ask_s3:
        raise problems[0]
    return None


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


def verify_tiers(table: StoreConfig, key: str) -> None:
    """Re-hash every filesystem tier's copy of `key` against its record (blake3 imported only
    here); one EfabuildError naming each tier whose copy is damaged."""
    from efabuild.store.record import ArtifactRecord
    from efabuild.store.transfer import DamagedCopy, check_file

    problems = []
    for name, root in table.roots():
        layout = Layout(root)
        try:
            record = intact_record(layout, key)
            if record is None:
                continue
            check_file(name, layout.sqsh_path(key).absolute(), ArtifactRecord.from_dict(record))
        except DamagedCopy as exc:
            problems.append(str(exc))
        except EfabuildError as exc:
            problems.append(f"{name} tier: {exc}")
    if problems:
        raise EfabuildError("; ".join(problems))


def lookup_path(ref: str, store: str | None = None, *, fetch: bool = True, verify: bool = False,
                cwd: Path | None = None, require_signature: bool = False, check_s3: bool = False,
                deep: bool = False) -> tuple[Path, dict]:
    """(absolute .sqsh path, its record as a dict) for `ref`.

    Raises NotFound (absent), AmbiguousRef (prefix matches several), InputError (bad REF or
    store settings) or EfabuildError (the stored copy is damaged or not a file); with
    `require_signature`, VerificationFailed unless the artifact is signed by a key of the trust
    policy (a cached verification costs stats only). `check_s3` (`lookup --verify`, not a job's
    start: a good file on the node is not refused for the bucket's damage): `verify` also asks
    whether S3 can still deliver the artifact (`deep`: reading every chunk).
    """
    table = locate(store, cwd)
    policy = None
    if require_signature:  # read first: a missing policy is a configuration error, found early
        from efabuild.signing.trust import policy_for

        policy = policy_for(table)
    hit = find_local(table, ref, ask_s3=fetch and table.s3 is not None)
    if hit is not None:
        key, layout, record = hit
        path = layout.sqsh_path(key).absolute()
        if verify:
            verify_tiers(table, key)
            if check_s3 and fetch and table.s3 is not None:  # can S3 still deliver it? (store/health.py)
                from efabuild.store.tiered import Store

                Store.from_config(table).check_s3(key, deep=deep)
        if policy is not None:
            _require_signed(layout, key, policy, ref)
        return path, record
    # A miss: the full store resolves remotely, fetches, and words the failure.
    from efabuild.store.tiered import Store

    full = Store.from_config(table)
    path = full.lookup(ref, fetch=fetch, verify=verify, deep=deep, check_s3=check_s3)
    key = path.name[: -len(SQSH_SUFFIX)]
    record = full.record(key)
    if policy is not None:
        _require_signed(Layout(path.parent.parent.parent), key, policy, ref)
    return path, record.to_dict() if record is not None else {}


def _require_signed(layout: Layout, key: str, policy, ref: str) -> None:  # noqa: ANN001
    from efabuild.signing.verify import VerificationFailed, require_signed

    try:
        require_signed(layout, key, policy)
    except VerificationFailed as exc:
        # one line for Pyxis to show: the first problem says enough to act on
        more = f" (and {len(exc.problems) - 1} more: efabuild verify {ref})" if len(exc.problems) > 1 else ""
        raise VerificationFailed([f"refusing {ref}: {exc.problems[0]}{more}"]) from None
