"""`efabuild pyxis-importer get IMAGE_URI | release`: the Pyxis importer protocol.

Pyxis takes the first line of stdout as the .sqsh to start whenever the exit status is 0, so this
command parses its own arguments: anything but `get IMAGE_URI` or `release` is a usage line on
stderr and exit 2, never text on stdout. `efabuild pyxis-importer --help` writes its help to stderr,
exit 2, for the same reason.
"""

from __future__ import annotations

import argparse
import sys

from efabuild.errors import EfabuildError, InputError
from efabuild.pyxis import importer as pyxis

USAGE = ("usage: efabuild-pyxis-importer get IMAGE_URI | release (called by Pyxis, see plugstack.conf importer=; "
         "`efabuild pyxis-importer --help` explains)")


class HelpOnStderr(argparse.Action):
    """-h/--help: the help on stderr and exit 2, so Pyxis could never take it for a path."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.print_help(sys.stderr)
        parser.exit(2)


def configure(name: str, sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        name, parents=[common], add_help=False,
        description="""
            Called by Pyxis (plugstack.conf importer=...): `get IMAGE_URI` prints the absolute
            .sqsh path of efabuild://REF (Pyxis passes docker://efabuild://REF); any other image
            is imported with `enroot import` into PYXIS_RUNTIME_PATH. With `lazy = true` in the
            config, an artifact only S3 holds is mounted from its chunks (`efabuild mount`) in
            PYXIS_RUNTIME_PATH instead of fetched whole. `release` removes that import, unmounts
            that mount once nothing reads it, and is idempotent. The store comes from
            EFABUILD_STORE or /etc/efabuild/pyxis.toml.""",
        epilog="""
            examples:
              # plugstack.conf
              required /usr/local/lib/slurm/spank_pyxis.so use_squashfuse=1 importer=/path/to/efabuild-pyxis-importer
              srun --container-image=efabuild://ngc-efa:user ...
              EFABUILD_STORE=/fsx/efabuild efabuild pyxis-importer get docker://efabuild://ngc-efa:user""",
    )
    p.add_argument("-h", "--help", action=HelpOnStderr, nargs=0,
                   help="show this help on stderr and exit 2 (Pyxis starts whatever an exit 0 prints)")
    p.add_argument("words", nargs=argparse.REMAINDER, metavar="get IMAGE_URI | release",
                   help="get: print the .sqsh path of IMAGE_URI, efabuild://REF (graph:layer, key or key "
                        "prefix) as Pyxis passes it (docker://efabuild://REF), or any image `enroot import` "
                        "takes, imported first; release: remove what get imported or mounted for this job step")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return protocol(args.words)


def protocol(words: list[str]) -> int:
    """Run one importer call; raises InputError (exit 2, stderr) for anything else."""
    if words == ["release"]:
        pyxis.release()
        return 0
    if words == ["get"]:
        raise InputError(f"get: missing IMAGE_URI (efabuild://REF); {USAGE}")
    if len(words) != 2 or words[0] != "get" or words[1].startswith("-") or not words[1]:
        raise InputError(USAGE)
    path = str(pyxis.get(words[1]))
    if not path.startswith("/") or "\n" in path or "\r" in path:
        raise EfabuildError(f"refusing to hand Pyxis the path {path!r}: not an absolute single-line path")
    sys.stdout.write(f"{path}\n")
    sys.stdout.flush()
    return 0
