"""Command line entry point: parses arguments and dispatches to one module per command group.

`efabuild CMD ...` imports and configures CMD's module alone, so a command module imports what it
runs at its header like any other module. `efabuild --help`, no command or an unknown one are
answered from SUMMARIES, loading no command module; completion and the docs build every parser.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

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
    "gc": "gc_cmd",
    "du": "du_cmd",
    "show": "provenance_cmd",
    "audit": "provenance_cmd",
    "diff": "provenance_cmd",
    "verify": "verify_cmd",
    "sign": "sign_cmd",
    "trust": "sign_cmd",
    "lint": "lint_cmd",
    "doctor": "doctor_cmd",
    "pyxis-importer": "pyxis_cmd",
    "prune-containers": "containers_cmd",
    "mount": "mount_cmd",
    "completion": "completion_cmd",
}

# command name -> its line in `efabuild --help` (every command module's parser gets its help here)
SUMMARIES: dict[str, str] = {
    "plan": "show what would be built, pulled or exported, and why",
    "graph": "print or draw the layer graph",
    "make": "build the layers whose key changed; export artifacts",
    "push": "push the built layers to the [registry] layer cache",
    "lookup": "print the absolute path of an artifact's .sqsh (for job scripts)",
    "ls": "list stored artifacts: key, name, size, S3 stored/unique bytes, created, tiers",
    "gc": "delete all but the newest N artifacts of every name and platform (dry run unless --yes)",
    "du": "bytes each artifact takes in each tier, and S3's dedup ratio",
    "show": "an artifact's provenance manifest as a table",
    "audit": "check artifacts: integrity, drift, pitfalls, policy",
    "diff": "what differs between two artifacts",
    "verify": "check artifacts against their signatures, records and manifests",
    "sign": "add a signature to artifacts' stored statements",
    "trust": "resolve the workspace's [trust] keys; write a node's trust policy",
    "lint": "check graphs and job scripts for the NGC + EFA pitfalls (exit 1 on errors)",
    "doctor": "diagnose NCCL (NCCL_DEBUG=INFO), srun and build logs: EFA path, TCP fallback, MPI clash...",
    "pyxis-importer": "Pyxis importer: `get efabuild://REF` prints the .sqsh path; `release` cleans up",
    "prune-containers": "remove the Enroot containers Pyxis kept for a container name's earlier artifacts",
    "mount": "serve an artifact's .sqsh from its chunks through FUSE, fetching them as they are read",
    "completion": "print a shell completion script (bash, zsh, tcsh)",
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
        import textwrap  # 1 ms that a lookup, run by every job, does not spend

        if self.description:
            self.description = textwrap.dedent(self.description).strip("\n")
        if self.epilog:
            self.epilog = textwrap.dedent(self.epilog).strip("\n")
        return super().format_help()


class _Commands(argparse._SubParsersAction):
    """The subcommands' action: each command's help line comes from SUMMARIES."""

    def add_parser(self, name: str, **kwargs) -> argparse.ArgumentParser:
        kwargs.setdefault("help", SUMMARIES[name])
        return super().add_parser(name, **kwargs)


def _common_options() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
    common.add_argument(
        "-C", dest="directory", metavar="DIR", default=argparse.SUPPRESS,
        help="run in DIR (the workspace is found by walking up to BUILD.toml)",
    )
    return common


def build_parser(only: str | None = None, *, summaries_only: bool = False) -> argparse.ArgumentParser:
    """The parser of every command, or with `only` of that one command (a faster start). With
    `summaries_only` each command is a bare stand-in with its SUMMARIES line and no command module
    is imported: enough for the top-level help, the version and an unknown command's error."""
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
    parser.register("action", "parsers", _Commands)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    common = _common_options()
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            continue
        if summaries_only:
            sub.add_parser(name, add_help=False)
            continue
        module = importlib.import_module(f"efabuild.cli.{module_name}")
        module.configure(name, sub, common)
    return parser


def command_in(argv: list[str]) -> str | None:
    """The command `argv` names, when that is clear before parsing: global -C DIR aside, its first
    word. Then only that command's module is loaded and its parser built (building all of them
    would load every command's imports); --help, --version and typos are answered from SUMMARIES."""
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
    command = command_in(argv)
    if command is None:
        # --help, --version, no command or an unknown one end here (exit 0 or 2); what gets past
        # (a command after an option only its parser knows) is parsed again by every parser
        build_parser(summaries_only=True).parse_known_args(argv)
    parser = build_parser(command)
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
