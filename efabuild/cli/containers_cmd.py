"""`efabuild prune-containers NAME --keep KEY`: remove the Enroot containers Pyxis kept on this node
for a name's earlier artifacts (a job's last step, or a Slurm epilog)."""

from __future__ import annotations

import argparse
import sys

from efabuild.display import shown
from efabuild.pyxis.containers import check_base, check_key_part, prune


def configure(name: str, sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        name, parents=[common],
        description="""
            A job that names its container by the artifact's key (--container-name=NAME-${KEY:0:12})
            never starts an old image, and leaves one container per build on each node (Pyxis's
            default container_scope=global keeps them as pyxis_NAME-<12 hex>). This removes those of
            NAME whose key is not KEY's, with `enroot remove`, as the user who runs it (Enroot's
            containers are per user); a container a process runs in is left and named.""",
        epilog="""
            examples:
              efabuild prune-containers train --keep "$KEY"
              srun --ntasks-per-node=1 efabuild prune-containers train --keep "$KEY"   # every node of the job""",
    )
    p.add_argument("base", metavar="NAME", help="the container name before -<key> (train for train-0123456789ab)")
    p.add_argument("--keep", metavar="KEY", required=True, help="the key whose container stays (12 to 64 hex digits)")
    p.add_argument("--dry-run", action="store_true", help="say what would be removed; remove nothing")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    keep = check_key_part(args.keep.lower())
    removed, busy = prune(check_base(args.base), keep, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for name in removed:
        sys.stdout.write(f"{verb} {shown(name)}\n")
    for name in busy:
        sys.stderr.write(f"efabuild: {shown(name)} is running: left in place\n")
    if not removed and not busy:
        sys.stdout.write(f"no other containers of {args.base}\n")
    return 0
