"""`python -m efabuild.cli.build_fixtures`: build the offline demo fixture images (what
scripts/build-fixtures.py runs; the work is efabuild.make.fixtures')."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import attrs

from efabuild.cli.output import print_json
from efabuild.errors import EfabuildError
from efabuild.make.fixtures import HOST_PLATFORM, MINI_NGC_TAG, build_fixtures, publish_index
from efabuild.settings import BuilderSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m efabuild.cli.build_fixtures",
        description=f"Build the offline demo fixture images ({MINI_NGC_TAG}); "
        "does nothing when they are up to date.",
        epilog="examples:\n"
               "  python3 scripts/build-fixtures.py                   # from a checkout: the same command\n"
               "  python -m efabuild.cli.build_fixtures --force       # rebuild even when up to date\n"
               "  python -m efabuild.cli.build_fixtures --json        # tag, image ID and whether it was built\n"
               "  python -m efabuild.cli.build_fixtures --platform linux/amd64 --platform linux/arm64 \\\n"
               "      --registry $(bash scripts/start-registry.sh)   # both, and one multi-platform index",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    parser.add_argument("--source", type=Path, default=None,
                        help="the fixtures/ folder (default: the checkout's, else the installed package's)")
    parser.add_argument("--json", action="store_true", help="print the images as JSON")
    parser.add_argument("--platform", action="append", choices=(HOST_PLATFORM, "linux/arm64"), default=None,
                        help=f"build the base for this platform (repeatable; default {HOST_PLATFORM}); "
                             "linux/arm64 runs under QEMU (scripts/setup-host.sh registers it)")
    parser.add_argument("--registry", metavar="HOST:PORT", default=None,
                        help=f"push each platform's base and one multi-platform index REGISTRY/{MINI_NGC_TAG}")
    args = parser.parse_args(argv)
    platforms = tuple(dict.fromkeys(args.platform or [HOST_PLATFORM]))
    index = None
    try:
        images = build_fixtures(
            source=args.source, force=args.force, platforms=platforms,
            log=(lambda _: None) if args.json else (lambda m: print(m, file=sys.stderr)),
        )
        if args.registry:
            from efabuild.engine.client import connect

            index = publish_index(connect(BuilderSettings()), images, platforms, args.registry)
    except EfabuildError as exc:
        print(f"efabuild: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.json:
        print_json("fixtures", {"images": [attrs.asdict(img) for img in images], "index": index})
        return 0
    for img in images:
        state = "built" if img.built else "up to date"
        print(f"{img.tag}: {state} in {img.seconds:.1f}s, image ID {img.image_id[:19]}")
    if index:
        print(f"index: {index}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
