"""`efabuild pyxis-importer get IMAGE_URI | release`: the Pyxis importer protocol."""

from __future__ import annotations

import argparse
import sys


def configure(name: str, sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        name, parents=[common],
        help="Pyxis importer: `get efabuild://REF` prints the .sqsh path; `release` cleans up",
        description="Called by Pyxis (plugstack.conf importer=...): `get IMAGE_URI` prints the "
                    "absolute .sqsh path of efabuild://REF (Pyxis passes docker://efabuild://REF); "
                    "any other image is imported with `enroot import` into PYXIS_RUNTIME_PATH. "
                    "`release` removes that import and is idempotent.",
    )
    p.add_argument("action", choices=("get", "release"))
    p.add_argument("image", metavar="IMAGE_URI", nargs="?", help="efabuild://REF or any image Enroot imports (for get)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from efabuild import pyxis
    from efabuild.errors import InputError

    if args.action == "release":
        pyxis.release()
        return 0
    if not args.image:
        raise InputError("pyxis-importer get: missing IMAGE_URI (efabuild://REF)")
    path = pyxis.get(args.image)
    sys.stdout.write(f"{path}\n")
    sys.stdout.flush()
    return 0
