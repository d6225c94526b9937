"""Command line entry point: parses arguments and dispatches to one module per command group.

Command modules import at module level only what every command has loaded already (argparse,
efabuild.errors, efabuild.display, efabuild.notices): `efabuild --help` loads them all. Each imports
the rest (python-on-whales, boto3, blake3, the store) in the function that runs it, so `efabuild
lookup` stays close to the cost of starting Python.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import textwrap

from efabuild import __version__
from efabuild.cli import reporting
from efabuild.display import shown
from efabuild.errors import EfabuildError, InputError

# command name -> module under efabuild.cli that defines configure(parser) and run(args) -> int
COMMANDS: dict[str, str] = {
    "plan": "plan_cmd",
    "graph": "graph_cmd",
    "make": "make_cmd",
    "push": "push_cmd",
    "lookup": "lookup_cmd",
    "ls": "store_cmd",
    "gc": "store_cmd",
    "du": "du_cmd",
    "show": "provenance_cmd",
    "audit": "provenance_cmd",
    "diff": "provenance_cmd",
    "verify": "sign_cmd",
    "sign": "sign_cmd",
    "trust": "sign_cmd",
    "lint": "lint_cmd",
    "doctor": "doctor_cmd",
    "pyxis-importer": "pyxis_cmd",
    "prune-containers": "containers_cmd",
    "mount": "mount_cmd",
    "completion": "completion_cmd",
}


class Parser(argparse.ArgumentParser):
    """Every efabuild parser: no abbreviated options (`--ver` is not `--verify`), and help text as
    written, so the examples in an epilog keep their lines. Description and epilog are written
    indented in the source and dedented when help is shown (textwrap is not loaded otherwise)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def format_help(self) -> str:
        if self.description:
            self.description = textwrap.dedent(self.description).strip("\n")
        if self.epilog:
            self.epilog = textwrap.dedent(self.epilog).strip("\n")
        return super().format_help()


def _common_options() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
    common.add_argument(
        "-C", dest="directory", metavar="DIR", default=argparse.SUPPRESS,
        help="run in DIR (the workspace is found by walking up to BUILD.toml)",
    )
    return common


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or with `only` of that one command (a faster start)."""
    parser = Parser(
        prog="efabuild",
        description="""
            Build NGC + EFA training images layer by layer on BuildKit and store them as Enroot
            .sqsh artifacts by key, for Slurm + Pyxis jobs. `efabuild COMMAND --help` tells more.""",
        epilog="""
            examples:
              efabuild plan                    # what would be built, and why
              efabuild make demo               # build what changed; export and store the .sqsh
              efabuild lookup demo:user        # the .sqsh path for a job script
              efabuild completion bash > /etc/bash_completion.d/efabuild""",
    )
    parser.add_argument("--version", action="version", version=f"efabuild {__version__}")
    parser.add_argument("-C", dest="directory", metavar="DIR", default=None,
                        help="run in DIR (the workspace is found by walking up to BUILD.toml)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    common = _common_options()
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            continue
        module = importlib.import_module(f"efabuild.cli.{module_name}")
        module.configure(name, sub, common)
    return parser


def command_in(argv: list[str]) -> str | None:
    """The command `argv` names, when that is clear before parsing: global -C DIR aside, its first
    word. Then only that command's parser is built (building all of them costs `efabuild lookup`,
    run by every job, a fifth of its time); --help, --version and typos get the full parser."""
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "-C":
            index += 2
        elif arg.startswith("-C"):  # -CDIR
            index += 1
        elif arg.startswith("-"):
            return None
        else:
            return arg if arg in COMMANDS else None
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(command_in(argv))
    args = parser.parse_args(argv)
    reporting.install()  # what the library reports, printed as our own lines
    if args.directory:
        try:
            os.chdir(args.directory)
        except OSError as exc:
            print(f"efabuild: -C {args.directory}: {exc.strerror}", file=sys.stderr)
            return 2
    try:
        return int(args.run(args) or 0)
    except EfabuildError as exc:
        # bad input is always one line; an operation's failure may end with log lines
        print(f"efabuild: {one_line(str(exc)) if isinstance(exc, InputError) else exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("efabuild: interrupted", file=sys.stderr)
        return 130
    except PermissionError as exc:
        # typically a job user on a shared store others created: say where, not a traceback
        print(f"efabuild: {exc.filename or ''}: {exc.strerror} (a store shared by several users needs a "
              f"common group: chmod -R g+rwX,g+s on it and umask 002)", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # output piped into head & co.: not an error of ours
        return 0


def one_line(message: str) -> str:
    """A message as one line: a newline or other control character from the input (a layer name
    `"a\\n"`, a path) is shown escaped, as Python writes it, not acted on by the terminal; a byte
    that is not UTF-8 as `\\xNN` (display.shown, as every path in a message)."""
    if message.isprintable():
        return message
    return shown(message)


def pyxis_importer_main() -> int:
    """The `efabuild-pyxis-importer` console script that plugstack.conf names: Pyxis calls it with
    `get IMAGE_URI` or `release`. No argument parser: nothing but a path may reach stdout."""
    from efabuild.cli.pyxis_cmd import protocol  # deferred: no other command loads the importer's protocol

    try:
        return protocol(sys.argv[1:])
    except EfabuildError as exc:
        print(f"efabuild: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except PermissionError as exc:
        print(f"efabuild: {exc.filename or ''}: {exc.strerror}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
