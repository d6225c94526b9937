"""`efabuild lookup REF`: print the path of an artifact's .sqsh (fast on a local hit)."""

from __future__ import annotations

import argparse


def configure(name: str, sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        name, parents=[common],
        help="print the absolute path of an artifact's .sqsh (for job scripts)",
        description="Print the absolute path of the .sqsh of REF on the shared or local tier, "
                    "fetching it from S3 when only S3 has it. Exit 1 with one line when REF is "
                    "absent or an ambiguous prefix.",
    )
    p.add_argument("ref", metavar="REF", help="a key, a unique key prefix (≥ 8 hex) or graph:layer")
    p.add_argument("--store", metavar="PATH",
                   help="a store directory (default: $EFABUILD_STORE, else the workspace's [store])")
    p.add_argument("--no-fetch", action="store_true", help="only look on the filesystem tiers; never fetch from S3")
    p.add_argument("--verify", action="store_true", help="re-hash the .sqsh and compare it with its record")
    p.add_argument("--require-signature", action="store_true",
                   help="refuse an artifact not signed by a key of the trust policy ([trust] in BUILD.toml, "
                        "else /etc/efabuild/trust.toml); a cached verification costs a few stats")
    p.add_argument("--json", action="store_true", help="print path, key, name, size, digest, created as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from efabuild.lookup import run as lookup

    return lookup(args)
