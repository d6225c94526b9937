"""`efabuild lookup REF`: the path of an artifact's .sqsh, for job scripts and Pyxis, with the
signature enforced at job start when asked.

A hit on a filesystem tier costs a few stats and small file reads: this module and what it
imports on that path are stdlib only (no attrs, boto3, python-on-whales). Only a miss, when the
store has an S3 tier and fetching is allowed, loads the full store.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from efabuild.errors import EfabuildError
from efabuild.host.statstamp import others_may_write
from efabuild.storesettings import StoreConfig
from efabuild.store.config import locate
from efabuild.store.layout import ENVELOPE_SUFFIX, SQSH_SUFFIX, Layout
from efabuild.store.lookup import find_local, intact_record
from efabuild.store.platformindex import Wanted


def verify_tiers(table: StoreConfig, key: str, *, cache: bool = False,
                 fetched: tuple[Path, tuple[int, int] | None] | None = None) -> None:
    """Re-hash every filesystem tier's copy of `key` against its record (blake3 imported only
    here); one EfabuildError naming each tier whose copy is damaged.

    With `cache`, a copy this user verified before and unchanged since (signing/verifycache.py:
    the same stat stamps of the .sqsh and its record, against the same digest) is not read again,
    nor the very file this process's fetch has just checked before committing it (`fetched`: its
    path, device and inode; hashing it again could not even be remembered, its stamp unsettled)."""
    problems = []
    for name, root in table.roots():
        layout = Layout(root)
        try:
            record = intact_record(layout, key)
            if record is None or _checked_by_fetch(layout.sqsh_path(key).absolute(), fetched):
                continue
            if cache:
                _check_cached(name, layout, key, record)
            else:
                _check_copy(name, layout.sqsh_path(key).absolute(), record)
        except EfabuildError as exc:
            problems.append(_tier_problem(name, exc))
    if problems:
        raise EfabuildError("; ".join(problems))


def _checked_by_fetch(sqsh: Path, fetched: tuple[Path, tuple[int, int] | None] | None) -> bool:
    """Whether `sqsh` is still the file the fetch checked: the same inode (not one renamed over
    it in a shared tier since), which only this user can write."""
    if fetched is None or fetched[0] != sqsh or fetched[1] is None:
        return False
    try:
        info = os.lstat(sqsh)
    except OSError:
        return False
    return (info.st_dev, info.st_ino) == fetched[1] and stat.S_ISREG(info.st_mode) and not others_may_write(info)


def _check_copy(tier: str, sqsh: Path, record: dict) -> None:
    from efabuild.store.record import ArtifactRecord
    from efabuild.store.transfer import check_file

    check_file(tier, sqsh, ArtifactRecord.from_dict(record))


def _tier_problem(tier: str, exc: EfabuildError) -> str:
    from efabuild.store.transfer import DamagedCopy  # only when a copy failed

    return str(exc) if isinstance(exc, DamagedCopy) else f"{tier} tier: {exc}"


def _check_cached(tier: str, layout: Layout, key: str, record: dict) -> None:
    """_check_copy, answered from the verification cache when it holds this copy as it is now."""
    from efabuild.signing import verifycache

    sqsh = layout.sqsh_path(key).absolute()
    paths = {"sqsh": sqsh, "record": layout.record_path(key)}
    stamps = verifycache.take_stamps(paths)
    # bound to the digest read here: a record replaced after it was read is another entry
    against = f"blake3:{record['digest']}"
    if verifycache.is_verified(sqsh, key, stamps, against, kind="digest"):
        return
    started = time.time()
    _check_copy(tier, sqsh, record)
    verifycache.remember(sqsh, key, paths, stamps, against, started, kind="digest")


def lookup_path(ref: str, store: str | None = None, *, fetch: bool = True, verify: bool = False,
                cwd: Path | None = None, require_signature: bool = False,
                verify_cache: bool = False, check_s3: bool = False, deep: bool = False,
                platform: str | None = None, environ: dict[str, str] | None = None) -> tuple[Path, dict]:
    """(absolute .sqsh path, its record as a dict) for `ref`: a name's on `platform`, `@os/arch`,
    $EFABUILD_PLATFORM (of `environ`) or the node's machine, by its platform index
    (store/platformindex.py), whose signature `require_signature` checks too. `verify` re-hashes
    every filesystem tier's copy on a hit; with `verify_cache`, not those this user verified
    before and unchanged since (the importer's `verify = true`).

    Raises NotFound (absent), AmbiguousRef (prefix matches several), InputError (bad REF or
    store settings) or EfabuildError (the stored copy is damaged or not a file); with
    `require_signature`, VerificationFailed unless the artifact is signed by a key of the trust
    policy (a cached verification costs stats only). `check_s3` (`lookup --verify`, not a job's
    start: a good file on the node is not refused for the bucket's damage): `verify` also asks
    whether S3 can still deliver the artifact (`deep`: reading every chunk).
    """
    table = locate(store, cwd)
    policy, vet_index = _policy(table, ref) if require_signature else (None, None)
    wanted = Wanted.of(ref, platform, environ)
    hit = find_local(table, ref, ask_s3=fetch and table.s3 is not None, wanted=wanted, vet=vet_index)
    if hit is not None:
        key, layout, record = hit
        path = layout.sqsh_path(key).absolute()
        if verify:
            verify_tiers(table, key, cache=verify_cache)
            if check_s3 and fetch and table.s3 is not None:  # can S3 still deliver it? (store/chunked/health.py)
                from efabuild.store.tiered import Store

                Store.from_config(table).check_s3(key, deep=deep)
        if policy is not None:
            _require_signed(layout, key, policy, ref)
        return path, record
    # A miss, or no intact copy here: the full store resolves remotely, fetches (replacing a
    # damaged copy), and words the failure. An unsigned fetch is refused before it writes a byte.
    from efabuild.signing.verify import VerificationFailed, refusal
    from efabuild.store.tiered import Store

    full = Store.from_config(table)
    vet = None if policy is None else _signed_in_s3(full, policy)
    try:
        # a name copied from S3 comes here at every start: its copy is checked against the cache too
        # (one this start fetched was checked by the fetch; the next start hashes and remembers it)
        path = full.lookup(wanted.ref, fetch=fetch, verify=verify and not verify_cache, vet=vet,
                           deep=deep, check_s3=check_s3, platform=wanted.platform, vet_index=vet_index,
                           environ=environ)
    except VerificationFailed as exc:
        raise refusal(exc, ref) from None
    key = path.name[: -len(SQSH_SUFFIX)]
    if verify and verify_cache:
        verify_tiers(table, key, cache=True, fetched=full.fetched.get(key))
    layout = Layout(path.parent.parent.parent)
    record = layout.read_record_dict(key)  # the record of the copy handed out
    if policy is not None:
        _require_signed(layout, key, policy, ref)
    return path, record or {}


def _policy(table: StoreConfig, ref: str):  # noqa: ANN202 - (TrustPolicy, IndexVet), signing loaded only here
    """The trust policy, read first (a missing one is a configuration error, found early), and the
    vet of a name's platform index under it."""
    from efabuild.signing.trust import policy_for
    from efabuild.signing.verify import signed_index_vet

    policy = policy_for(table)
    return policy, signed_index_vet(policy, ref)


def _signed_in_s3(full, policy):  # noqa: ANN001, ANN202 - a Store, a TrustPolicy; a Store.lookup vet
    """Refuses (VerificationFailed) an artifact S3 holds without a statement signed by a key of
    `policy` for its record, before a fetch writes any of it: a refused fetch leaves nothing a
    plain lookup would then serve. The copy fetched is verified in full once it is stored."""
    from efabuild.signing.verify import VerificationFailed, signed_problems

    def vet(record, sidecars: dict[str, bytes]) -> None:  # noqa: ANN001 - an ArtifactRecord
        s3 = full.s3
        problems = signed_problems(sidecars.get(ENVELOPE_SUFFIX), record.key, record, policy, record.digest,
                                   None, sqsh=s3.describe(record.key), where=s3.url(s3.envelope_object(record.key)))
        if problems:
            raise VerificationFailed(problems)

    return vet


def _require_signed(layout: Layout, key: str, policy, ref: str) -> None:  # noqa: ANN001
    from efabuild.signing.verify import VerificationFailed, refusal, require_signed

    try:
        require_signed(layout, key, policy)
    except VerificationFailed as exc:
        raise refusal(exc, ref) from None
