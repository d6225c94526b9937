"""`python -m efabuild.cli.build_fixtures`: build the offline demo fixture images (what
scripts/build-fixtures.py runs; the work is efabuild.make.fixtures')."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    import attrs

    from efabuild.make.fixtures import MINI_NGC_TAG, build_fixtures
    from efabuild.cli.output import print_json
    from efabuild.errors import EfabuildError

    parser = argparse.ArgumentParser(
        prog="python -m efabuild.cli.build_fixtures",
        description=f"Build the offline demo fixture images ({MINI_NGC_TAG}); "
        "does nothing when they are up to date.",
        epilog="examples:\n"
               "  python3 scripts/build-fixtures.py                   # from a checkout: the same command\n"
               "  python -m efabuild.cli.build_fixtures --force       # rebuild even when up to date\n"
               "  python -m efabuild.cli.build_fixtures --json        # tag, image ID and whether it was built",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    parser.add_argument("--source", type=Path, default=None,
                        help="the fixtures/ folder (default: the checkout's, else the installed package's)")
    parser.add_argument("--json", action="store_true", help="print the images as JSON")
    args = parser.parse_args(argv)
    try:
        images = build_fixtures(
            source=args.source, force=args.force,
            log=(lambda _: None) if args.json else (lambda m: print(m, file=sys.stderr)),
        )
    except EfabuildError as exc:
        print(f"efabuild: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.json:
        print_json("fixtures", {"images": [attrs.asdict(img) for img in images]})
        return 0
    for img in images:
        state = "built" if img.built else "up to date"
        print(f"{img.tag}: {state} in {img.seconds:.1f}s, image ID {img.image_id[:19]}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
