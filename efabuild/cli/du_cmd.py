"""`efabuild du`: what the store's artifacts cost, and what deduplication saves in S3."""

from __future__ import annotations

import argparse

from efabuild.cli.output import print_json, print_table
from efabuild.refs import short
from efabuild.store.gc.s3chunks import bucket_usage
from efabuild.store.progress import human_bytes
from efabuild.store.tiered import Store


def configure(name: str, sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        name, parents=[common],
        description="""
            For every artifact: its size, and in the S3 tier the bytes its chunks take as stored
            (compressed) and the bytes only it references (what deleting it would free). The last
            lines sum each tier and give S3's deduplication ratio: the artifacts' sizes over the
            bytes stored. Reads every chunk index of the bucket (as `ls` does for its S3 column).""",
        epilog="""
            examples:
              efabuild du
              efabuild du --store /fsx/efabuild --json""",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--store", metavar="PATH",
                   help="a store directory (default: $EFABUILD_STORE, else the workspace's [store])")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    store = Store.locate(args.store)
    tiers = {}
    for tier in store.fs_tiers:
        records = tier.list()
        tiers[tier.name] = {"artifacts": len(records), "bytes": sum(r.size for r in records)}
    artifacts, stored, garbage = ({}, 0, 0) if store.s3 is None else bucket_usage(store.s3)
    if store.s3 is not None:
        logical = sum(record.size for record, _ in artifacts.values())
        tiers["s3"] = {"artifacts": len(artifacts), "bytes": logical, "stored_bytes": stored,
                       "unreferenced_bytes": garbage,
                       "dedup_ratio": round(logical / stored, 3) if stored else None}
    several = len({record.platform for record, _ in artifacts.values()}) > 1
    rows = [{"key": key, "name": record.name, "platform": record.platform, "size": record.size, "stored": u.stored,
             "unique": u.unique, "shown": f"{record.name}@{record.platform}" if several and record.platform else record.name}
            for key, (record, u) in sorted(artifacts.items(), key=lambda kv: (kv[1][0].name, kv[1][0].created))]
    if args.json:
        print_json("du", {"tiers": tiers, "s3_artifacts": [{k: v for k, v in r.items() if k != "shown"} for r in rows]})
        return 0
    if rows:
        print_table([(short(r["key"]), r["shown"], human_bytes(r["size"]), human_bytes(r["stored"]),
                      human_bytes(r["unique"])) for r in rows],
                    ("KEY", "NAME", "SIZE", "S3 STORED", "S3 UNIQUE"))
    for name, t in tiers.items():
        line = f"{name}: {t['artifacts']} artifacts, {human_bytes(t['bytes'])}"
        if name == "s3":
            ratio = f"{t['dedup_ratio']:.2f}×" if t["dedup_ratio"] else "-"
            line += (f" in {human_bytes(t['stored_bytes'])} stored (dedup {ratio}); "
                     f"{human_bytes(t['unreferenced_bytes'])} unreferenced, for gc")
        print(line)
    return 0

