"""`efabuild doctor LOG...`: diagnose NCCL, srun and build logs (exit 1 when a problem is found)."""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from contextlib import ExitStack

from efabuild.cli.output import print_json
from efabuild.configfile import read_text
from efabuild.display import shown
from efabuild.doctor import examine, render_text, to_json
from efabuild.errors import EfabuildError, InputError, NotFound

MAX_LINE = 1 << 20  # characters of one log line that are looked at; the rest of a longer one is skipped
MAX_MANIFEST_BYTES = 64 << 20


def configure(name, sub, common):
    p = sub.add_parser(
        name, parents=[common],
        description="""
            Read NCCL_DEBUG=INFO output, nccl-tests/PyTorch bandwidth lines, srun output and build
            logs, and say what they show: EFA path or TCP fallback, plugin and device trouble, two
            Open MPIs, empty apt lists, low bandwidth. Exit 1 when a problem is found.""",
        epilog="""
            examples:
              efabuild doctor slurm-1234.out --expect-nics 8 --baseline-gbps 340
              srun ... 2>&1 | efabuild doctor -
              efabuild doctor slurm-1234.out --artifact ngc-efa:user""",
    )
    p.add_argument("logs", nargs="+", metavar="LOG", help="log files; - reads standard input")
    p.add_argument("--expect-nics", type=_positive_int, metavar="N",
                   help="EFA devices per instance (e.g. 8): a different 'found N nics' is a problem")
    p.add_argument("--baseline-gbps", type=_positive_float, metavar="X",
                   help="known-good bus bandwidth in GB/s: far below it on Libfabric points at CPU cores per rank")
    p.add_argument("--artifact", metavar="REF",
                   help="compare the versions seen with this artifact's manifest (key, prefix or graph:layer)")
    p.add_argument("--store", metavar="PATH", help="the store holding --artifact (default: $EFABUILD_STORE, "
                                                   "else the workspace's)")
    p.add_argument("--manifest", metavar="FILE", help="compare with this manifest JSON file instead")
    p.add_argument("--json", action="store_true", help="print the diagnoses as JSON")
    p.set_defaults(run=run)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def run(args: argparse.Namespace) -> int:
    if args.manifest and args.artifact:
        raise InputError("give --artifact or --manifest, not both", "doctor")
    manifest = _manifest(args)
    with ExitStack() as stack:
        sources = []
        for name in args.logs:
            if name == "-":
                sources.append(("-", _bounded_lines(sys.stdin)))
                continue
            try:
                handle = stack.enter_context(open(name, encoding="utf-8", errors="replace"))
                kind = os.fstat(handle.fileno()).st_mode
            except OSError as exc:
                raise InputError(f"cannot read: {exc.strerror}", name) from None
            if stat.S_ISCHR(kind) or stat.S_ISBLK(kind):  # /dev/zero never ends; a pipe (<(...)) does
                raise InputError("a device, not a log file (give - to read standard input)", name)
            sources.append((name, _bounded_lines(handle)))
        report = examine(sources, expect_nics=args.expect_nics, baseline_gbps=args.baseline_gbps,
                         manifest=manifest, artifact=args.artifact or args.manifest, ref=args.artifact)
    if args.json:
        print_json("doctor", to_json(report))
    else:
        # the report quotes the logs' lines: a job's output may hold any escape
        print("\n".join(shown(line) for line in render_text(report).splitlines()))
    return 1 if report.problems else 0


def _bounded_lines(handle):  # noqa: ANN001, ANN202 - a text file, its lines
    """The lines of `handle`, each cut to MAX_LINE characters: a job's output may hold a line of
    gigabytes (a progress bar that never prints a newline), and what follows it still counts."""
    while line := handle.readline(MAX_LINE):
        if len(line) == MAX_LINE and not line.endswith("\n"):
            while (rest := handle.readline(MAX_LINE)) and not rest.endswith("\n"):
                pass  # the rest of an over-long line
        yield line


def _manifest(args: argparse.Namespace) -> dict | None:
    if args.manifest:
        try:
            data = json.loads(read_text(args.manifest, args.manifest, MAX_MANIFEST_BYTES))
        except (ValueError, RecursionError) as exc:
            raise InputError(f"not JSON: {_why(exc)}", args.manifest) from None
        if not isinstance(data, dict):
            raise InputError("not a manifest (expected a JSON object)", args.manifest)
        return data
    if not args.artifact:
        return None
    try:
        from efabuild.store import Store
    except ImportError:
        raise EfabuildError("--artifact needs the artifact store, which this installation lacks; "
                            "pass --manifest FILE") from None
    store = Store.locate(args.store)
    key = store.resolve(args.artifact)
    raw = store.manifest(key)
    if raw is None:
        raise NotFound(f"artifact {args.artifact} has no manifest to compare with")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise EfabuildError(f"the manifest of {args.artifact} is not JSON: {_why(exc)}") from None
    return data if isinstance(data, dict) else {}


def _why(exc: Exception) -> str:
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
