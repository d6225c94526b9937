"""`efabuild ls`: what the store holds; the options and helpers `efabuild gc` shares with it."""

from __future__ import annotations

import argparse
import sys

from efabuild.cli.output import print_json, print_table
from efabuild.refs import short
from efabuild.store.gc.s3chunks import bucket_usage
from efabuild.store.progress import human_bytes
from efabuild.store.tiered import Store


def configure(name: str, sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        name, parents=[common],
        description="""
            Every artifact in the store: short key, name (graph:layer), size, the bytes it
            takes in S3 as stored and the bytes only it references there (what deleting it
            would free; `efabuild du` sums them), when it was created, and the tiers holding
            it (local, shared, s3).""",
        epilog="""
            examples:
              efabuild ls
              efabuild ls --store /fsx/efabuild --no-s3 --json""",
    )
    p.set_defaults(run=run_ls)
    add_store_options(p)


def add_store_options(p: argparse.ArgumentParser) -> None:
    """The options after a store command's own: which store, S3 or not, JSON."""
    p.add_argument("--store", metavar="PATH",
                   help="a store directory (default: $EFABUILD_STORE, else the workspace's [store])")
    p.add_argument("--no-s3", action="store_true", help="leave the S3 tier out")
    p.add_argument("--json", action="store_true", help="print JSON")


def store_of(args: argparse.Namespace) -> Store:
    return Store.locate(args.store)


def when(created: str) -> str:
    """'2026-11-30T04:32:11.123456Z' -> '2026-11-30 04:32:11Z' for tables."""
    return created.replace("T", " ")[:19] + "Z" if len(created) >= 19 else created


def run_ls(args: argparse.Namespace) -> int:
    store = store_of(args)
    listings = store.ls(remote=not args.no_s3)
    # what each S3 artifact takes in the bucket as stored, and what only it references
    in_s3 = [l.record for l in listings if "s3" in l.tiers]
    usage = {key: u for key, (_, u) in bucket_usage(store.s3, in_s3)[0].items()} if in_s3 else {}
    if args.json:
        out = [{**listing.record.to_dict(), "tiers": list(listing.tiers),
                "s3_stored": _field(usage.get(listing.record.key), "stored"),
                "s3_unique": _field(usage.get(listing.record.key), "unique")} for listing in listings]
        for item in out:
            item.pop("version", None)
        print_json("ls", {"artifacts": out})
        return 0
    if not listings:
        print("no artifacts", file=sys.stderr)
        return 0

    def s3_cell(key: str) -> str:
        u = usage.get(key)
        return "-" if u is None else f"{human_bytes(u.stored)}/{human_bytes(u.unique)}"

    several = len({l.record.platform for l in listings}) > 1
    print_table([(short(l.record.key), shown_name(l.record, several), human_bytes(l.record.size), s3_cell(l.record.key),
                  when(l.record.created), ",".join(l.tiers)) for l in listings],
                ("KEY", "NAME", "SIZE", "S3 STORED/UNIQUE", "CREATED", "TIERS"))
    return 0


def _field(usage, name: str) -> int | None:  # noqa: ANN001 - chunks.Usage or None
    return None if usage is None else getattr(usage, name)


def shown_name(record, several: bool) -> str:  # noqa: ANN001 - an ArtifactRecord
    """A record's name as plan and make show it: `demo:user@linux/arm64` when the listing holds
    several platforms, else `demo:user` (a record made before platforms were recorded has none)."""
    return f"{record.name}@{record.platform}" if several and record.platform else record.name


