"""`efabuild gc`: removing old artifacts, and what interrupted writes and killed makes left."""

from __future__ import annotations

import argparse
import os
import shutil

from efabuild import notices
from efabuild.cli.common import workspace
from efabuild.cli.output import print_json
from efabuild.cli.store_cmd import add_store_options, store_of, when
from efabuild.display import shown
from efabuild.engine import leftovers
from efabuild.engine.client import connect
from efabuild.errors import EfabuildError, InputError
from efabuild.host import scratch
from efabuild.make.oldimages import remove_old_images
from efabuild.make.prepare import prepare
from efabuild.refs import short
from efabuild.store.chunked.health import chunk_problems
from efabuild.store.config import STORE_ENV
from efabuild.store.progress import human_bytes


def configure(name: str, sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        name, parents=[common],
        description="""
            Keeps the newest --keep keys of every name on every platform (an arm64 build never
            pushes out the amd64 ones), what every name currently points at,
            and pinned refs/keys ([store] pins in BUILD.toml, --pin); removes the rest and
            leftovers of interrupted writes from every tier, and of makes killed on this host
            (build contexts, export containers, make --check images). Prints what it would
            delete unless --yes.""",
        epilog="""
            examples:
              efabuild gc                       # what would be deleted
              efabuild gc --keep 2 --pin ngc-efa:user --yes
              efabuild gc --images --yes        # also the engine images of keys no layer has now""",
    )
    p.add_argument("--keep", type=int, metavar="N", help="keys kept per name and platform (default: [store] keep, else 3)")
    p.add_argument("--pin", action="append", default=[], metavar="REF",
                   help="also keep this key, key prefix or graph:layer (all its versions); repeatable")
    p.add_argument("--yes", action="store_true", help="really delete")
    p.add_argument("--images", action="store_true",
                   help="also remove the engine images this workspace built whose key no layer has any more "
                        "(efabuild/<layer>:<key>; other workspaces' images are never touched)")
    p.add_argument("--s3", action="store_true",
                   help="also delete from the S3 tier of a bare store (--store, EFABUILD_STORE): "
                        "without it a compute node's gc only says what S3 would lose")
    p.add_argument("--deep", action="store_true",
                   help="also read every S3 chunk an index names and report those that fail their id "
                        "(missing ones are reported always)")
    p.set_defaults(run=run_gc)
    add_store_options(p)


def _dead_scratch_dirs(remove: bool) -> list:
    found = scratch.dead_scratch_dirs()
    if remove:
        for path in found:
            scratch.remove(path)
    return found


def _old_images(args: argparse.Namespace, remove: bool) -> list[tuple[str, str]]:
    """gc --images: the workspace's own old engine images, as (tier, item) leftovers."""
    if args.store:
        raise InputError("--images needs a workspace (its build records say which images it made), not --store")
    found = remove_old_images(prepare(workspace(), require_engine=True), remove)
    return [("engine", f"image {tag}" + (f" (kept: {why})" if why else "")) for tag, why in found]


def _dead_engine_leftovers(args: argparse.Namespace, stores: list, remove: bool) -> list[str]:
    """In a workspace: export containers into its store and make --check images that its engine
    holds for makes killed on this host (a bare store on a compute node has no engine to ask)."""
    if args.store or os.environ.get(STORE_ENV) or shutil.which("docker") is None:
        return []

    try:
        settings = workspace().settings
    except EfabuildError as exc:  # the store was found; the workspace around it does not load
        notices.warn(f"engine leftovers not looked for: {exc}")
        return []
    try:
        engine = connect(settings.builder)
        found = leftovers.find(engine, stores)
        if remove:
            leftovers.remove(engine, found)
    except EfabuildError:
        return []  # no engine answering here: nothing of it to clean
    return found.described()


def run_gc(args: argparse.Namespace) -> int:
    store = store_of(args)
    if args.s3 and args.no_s3:
        raise InputError("give --s3 or --no-s3, not both")
    # A workspace's store is the builder's: its gc covers S3. A bare store is a node's view of
    # a shared one: S3 only when asked.
    report = store.gc(keep=args.keep, pins=store.pins + tuple(args.pin), dry_run=not args.yes,
                      remote=not args.no_s3, delete_remote=args.s3 or not store.bare)
    in_engine = _dead_engine_leftovers(args, [tier.root for tier in store.fs_tiers], remove=args.yes)
    debris = [*report.debris, *(("host", str(path)) for path in _dead_scratch_dirs(remove=args.yes)),
              *(("engine", item) for item in in_engine)]
    if args.images:
        debris += _old_images(args, remove=args.yes)
    busy = set(report.busy)
    problems = _chunk_problems(store, args.deep) if not args.no_s3 else []
    if args.json:
        print_json("gc", {**_gc_json(report, debris, busy), "s3_chunk_problems": [
            {"chunk": p.cid, "problem": p.problem, "artifacts": list(p.keys)} for p, _ in problems]})
        return 0
    verb = "would delete" if report.dry_run else "deleted"
    for r in report.removals:
        state = "skipped (in use)" if (r.tier, r.record.key) in busy else verb
        print(f"{state}  {r.tier}  {short(r.record.key)}  {r.record.name}  {human_bytes(r.record.size)}"
              f"  {when(r.record.created)}")
    for r in report.spared:
        print(f"would delete with --s3  {r.tier}  {short(r.record.key)}  {r.record.name}  "
              f"{human_bytes(r.record.size)}  {when(r.record.created)}")
    for tier, item in debris:  # names in tmp/ are anyone's: escaped, never raw on root's terminal
        print(f"{'would remove' if report.dry_run else 'removed'} leftover  {tier}  {shown(item)}")
    for tier in sorted({tier for tier, _ in report.expired_chunks}):
        count = sum(1 for t, _ in report.expired_chunks if t == tier)
        done = f"would remove {count}" if report.dry_run else f"removed {report.expired_removed} of {count}"
        print(f"{done} chunks lazy mounts left on the {tier} tier for other nodes, unread for a week")
    if report.chunks is not None and (report.chunks.deleted or report.chunks.marked):
        print(f"{verb} {report.chunks.deleted} s3 chunks no artifact uses ({human_bytes(report.chunks.deleted_bytes)})"
              + (f"; {report.chunks.marked} unused chunks marked, deleted by a gc after the grace period"
                 if report.chunks.marked and not report.dry_run else ""))
    for p, users in problems:  # gc cannot fix them: a make of one of those keys stores the chunk again
        print(f"s3 chunk {p.cid} ({users}): {p.problem}; `efabuild make` of it stores it again")
    freed = sum(r.record.size for r in report.removals if (r.tier, r.record.key) not in busy)
    summary = (f"{len(report.removals) - len(busy)} objects, {human_bytes(freed)}; "
               f"kept {len(report.kept)} keys (newest {report.keep} per name, current refs, pins)")
    if report.spared:
        summary += f"; S3 left alone ({len(report.spared)} objects, give --s3 to delete them there too)"
    if report.dry_run:
        print(f"gc: would delete {summary}; run with --yes to delete")
    else:
        print(f"gc: deleted {summary}")
    return 0


def _chunk_problems(store, deep: bool) -> list:  # noqa: ANN001 - a Store
    """[(health.ChunkProblem, 'KEY NAME, ...' of the artifacts it breaks)] of the S3 chunks an
    index names that are missing (with `deep`: or fail their id)."""
    if store.s3 is None:
        return []
    found = chunk_problems(store.s3, deep=deep)
    names: dict[str, str] = {}
    for key in {key for p in found for key in p.keys}:
        try:
            record = store.s3.record(key)
        except EfabuildError:
            record = None
        names[key] = record.name if record is not None else "?"
    return [(p, ", ".join(f"{short(k)} {names[k]}" for k in p.keys)) for p in found]


def _gc_json(report, debris: list[tuple[str, str]], busy: set) -> dict:  # noqa: ANN001 - GcReport
    """What gc removed (or would), left behind and kept, as data for --json."""
    return {
        "dry_run": report.dry_run,
        "keep": report.keep,
        "removals": [
            {"tier": r.tier, "key": r.record.key, "name": r.record.name, "size": r.record.size,
             "created": r.record.created, "skipped_busy": (r.tier, r.record.key) in busy}
            for r in report.removals
        ],
        "debris": [{"tier": tier, "item": item} for tier, item in debris],
        "expired_chunks": [{"tier": tier, "item": item} for tier, item in report.expired_chunks],
        "expired_chunks_removed": report.expired_removed,
        "spared": [{"tier": r.tier, "key": r.record.key, "name": r.record.name, "size": r.record.size,
                    "created": r.record.created} for r in report.spared],
        "kept": list(report.kept),
        "s3_chunks": None if report.chunks is None else {
            "deleted": report.chunks.deleted, "deleted_bytes": report.chunks.deleted_bytes,
            "marked": report.chunks.marked, "referenced": report.chunks.referenced},
        "freed": 0 if report.dry_run else sum(
            r.record.size for r in report.removals if (r.tier, r.record.key) not in busy),
    }
