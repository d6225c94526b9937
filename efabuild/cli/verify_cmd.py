"""`efabuild verify`: stored artifacts against their signatures, records and manifests.

Apart from `efabuild sign` and `trust`: a verification cached before reads stats only and loads no
cryptography, which signing a statement or reading a public key needs at once."""

from __future__ import annotations

import argparse
import sys

from efabuild.cli.output import print_json
from efabuild.errors import EfabuildError, InputError, NoCredentials
from efabuild.refs import short
from efabuild.signing.trust import policy_for
from efabuild.signing.verify import index_problems, verify_and_remember
from efabuild.store.config import locate
from efabuild.store.tiered import Store

STORE_HELP = "a store directory (default: $EFABUILD_STORE, else the workspace's [store])"


def configure(name: str, sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        name, parents=[common],
        description="""
            For each artifact on each filesystem tier: a valid signature by a key of the
            trust policy, the signed statement's subject equal to the file's digests,
            record and manifest consistent with both. With an S3 tier that holds it: its
            chunk index against its record and every chunk there (--deep: read and checked
            against its id). Prints one line per artifact and tier; exit 1 when any fails,
            with one line per failure.""",
        epilog="""
            examples:
              efabuild verify demo:user
              efabuild verify --all --store /fsx/efabuild --sha256
              efabuild verify --all --deep              # also read every S3 chunk""",
    )
    p.add_argument("refs", nargs="*", metavar="REF", help="a key, a unique key prefix (≥ 8 hex) or graph:layer")
    p.add_argument("--all", action="store_true", help="every artifact on the filesystem tiers")
    p.add_argument("--sha256", action="store_true",
                   help="also compute the file's sha256 and compare it (what third-party verifiers match)")
    p.add_argument("--deep", action="store_true",
                   help="read every S3 chunk (or whole object) and check it against its id")
    p.add_argument("--no-s3", action="store_true", help="leave the S3 tier out")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(run=run_verify)
    p.add_argument("--store", metavar="PATH", help=STORE_HELP)


def _resolve_vetted(store, ref: str, policy, results: list[dict]) -> str:  # noqa: ANN001 - a Store, a TrustPolicy
    """The key of `ref`; a name's platform index is verified on the way (a result of its own)."""
    found: list[str] = []
    def vet(data: bytes, envelope: bytes | None, where: str) -> None:
        found.extend(index_problems(data, envelope, policy, where))

    key = store.resolve(ref, remote=False, vet_index=vet)
    if found:
        results.append({"key": key, "name": ref, "tier": "platform index", "problems": found})
    return key


def run_verify(args: argparse.Namespace) -> int:
    if bool(args.refs) == bool(args.all):
        raise InputError("give REF... or --all")
    table = locate(args.store)
    policy = policy_for(table)
    store = Store.from_config(table, show_progress=False)
    if args.no_s3:
        store.skip_s3("--no-s3")
    results, failed = [], False
    keys = sorted({k for tier in store.fs_tiers for k in tier.layout.keys()}) if args.all else \
        [_resolve_vetted(store, ref, policy, results) for ref in args.refs]
    for key in keys:
        tiers = [tier for tier in store.fs_tiers if tier.has(key)]
        if not tiers:
            results.append({"key": key, "name": None, "tier": None, "problems": [
                f"{short(key)}: on no filesystem tier of {store.describe()} (efabuild lookup fetches it)"]})
        for tier in tiers:
            problems = verify_and_remember(tier.layout, key, policy, sha256=args.sha256)
            results.append({"key": key, "name": _recorded_name(tier, key), "tier": tier.name, "problems": problems})
        results += _s3_results(store, key, args.deep)
    for result in results:
        failed = failed or bool(result["problems"])
    if args.json:
        print_json("verify", {"ok": not failed, "policy": policy.source, "results": results})
    else:
        for result in results:
            where = f"{short(result['key'])} {result['tier'] or '-'}"
            if not result["problems"]:
                sys.stdout.write(f"ok    {where}\n")
            for problem in result["problems"]:
                sys.stdout.write(f"FAIL  {where}: {problem}\n")
    return 1 if failed else 0


def _s3_results(store, key: str, deep: bool) -> list[dict]:  # noqa: ANN001 - a Store
    """verify's row for S3's copy of `key` (none when S3 lacks it or is left out): can it still
    deliver it (store/chunked/health.py)? Without credentials S3 is left out with one warning."""
    if store.s3 is None:
        return []
    try:
        health = store.s3_health(key, deep=deep)
    except NoCredentials as exc:
        store.skip_s3(exc.reason)
        return []
    if health is None:
        return []
    record = store.s3.record(key)
    return [{"key": key, "name": record.name if record else None, "tier": "s3", "problems": list(health.problems)}]


def _recorded_name(tier, key: str) -> str | None:  # noqa: ANN001 - a FilesystemTier
    """The name (graph:layer) the tier's record gives the artifact; None when the record is
    unreadable (the problems say why)."""
    try:
        record = tier.record(key)
    except EfabuildError:
        return None
    return record.name if record is not None else None
