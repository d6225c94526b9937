"""`efabuild lint [GRAPH|SCRIPT...]`: the guide's pitfalls in graphs and job scripts, before a build."""

from __future__ import annotations

import argparse
from pathlib import Path

from efabuild import __version__
from efabuild.cli.output import print_foreign_json, print_json
from efabuild.errors import InputError
from efabuild.lint import errors_only, lint_workspace, render_text, to_json
from efabuild.lint.sarif import to_sarif
from efabuild.workspace import find_root, load_workspace


def configure(name, sub, common):
    p = sub.add_parser(
        name, parents=[common],
        description="""
            Check each layer's Dockerfile text, args and base, and the job scripts under scripts/,
            for the known NGC + EFA pitfalls (rules EFA000-EFA024, listed in docs/guides/lint.md). Exit 1 when
            any finding is an error.""",
        epilog="""
            examples:
              efabuild lint
              efabuild lint ngc-efa scripts/example-job.sbatch
              efabuild lint --json
              efabuild lint --format sarif > efabuild-lint.sarif   # for code scanning""",
    )
    p.add_argument("targets", nargs="*", metavar="GRAPH",
                   help="graph names or files (default: every graph and the job scripts under scripts/); "
                        "a path to a job script lints that script")
    p.add_argument("--format", choices=("text", "json", "sarif"), default=None,
                   help="text: one line and a fix per finding, then totals (default); json: the findings "
                        "and counts; sarif: a SARIF 2.1.0 log for code-scanning services (GitHub, GitLab)")
    p.add_argument("--json", action="store_true", help="the same as --format json")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.json and args.format not in (None, "json"):
        raise InputError(f"--json and --format {args.format} ask for two outputs: give one", "lint")
    fmt = "json" if args.json else args.format or "text"
    ws = load_workspace(find_root(Path.cwd()))
    graph_names = {graph.name for graph in ws.graphs}
    graph_files = {ws.relpath(graph.source) for graph in ws.graphs}
    graphs: list[str] = []
    scripts: list[Path] = []
    for target in args.targets:
        path = Path(target)
        if target in graph_names or ws.relpath(path.resolve()) in graph_files:
            graphs.append(target if target in graph_names else ws.relpath(path.resolve()))
        elif path.is_file():
            scripts.append(path.resolve())
        else:
            known = ", ".join(sorted(graph_names)) or "none"
            raise InputError(f"'{target}' is neither a graph (graphs: {known}) nor a file", "lint")
    if args.targets:
        findings = lint_workspace(ws, graphs, scripts)
    else:
        findings = lint_workspace(ws)
    if fmt == "json":
        print_json("lint", to_json(findings))
    elif fmt == "sarif":
        print_foreign_json(to_sarif(findings, ws.root, __version__))
    else:
        print(render_text(findings))
    return 1 if errors_only(findings) else 0
