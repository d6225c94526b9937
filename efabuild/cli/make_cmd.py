"""`efabuild make`: build what the plan says, export and publish the artifacts."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from efabuild import notices
from efabuild.cli.colour import Palette, palette_for
from efabuild.cli.common import add_builder_option, with_builder, workspace, write_file
from efabuild.cli.live import JsonReporter, announce_after, outcome_json, planning_line, reporter_for
from efabuild.cli.output import print_json, table
from efabuild.cli.plan_cmd import plan_json, render
from efabuild.errors import EfabuildError, InputError
from efabuild.host.scratch import check_temp_dir
from efabuild.make import run as make
from efabuild.make.prepare import prepare
from efabuild.plan import COPY
from efabuild.refs import short


def configure(name, sub, common):
    p = sub.add_parser(
        name, parents=[common],
        description="""
            Lint, then build every selected layer whose key has no image yet (or pull it from the
            [registry] layer cache), export each artifact layer to an Enroot .sqsh with its
            provenance manifest, and publish it to every store tier. Exit 1 when a layer failed.""",
        epilog="""
            examples:
              efabuild make demo                # the demo graph
              efabuild make ngc-efa:user -j 1   # one layer and what it needs, one build at a time
              efabuild make --dry-run           # the plan; builds nothing
              efabuild make demo --graph make.svg""",
    )
    p.add_argument("targets", nargs="*", metavar="GRAPH[:LAYER]", help="graphs or layers (default: all)")
    p.add_argument("-j", "--jobs", type=int, default=None, help="layers built in parallel (default: [builder] jobs)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and build nothing")
    p.add_argument("--no-lint", action="store_true", help="build even when lint finds errors")
    p.add_argument("--full-export", action="store_true",
                   help="export every artifact layer whole, not from its ancestor's .sqsh (to compare the two, or "
                        "to drop a child's dead bytes); as [export] incremental = false. An artifact stored under its "
                        "key already is not exported again (make names it): its full export comes with its next key")
    p.add_argument("--check", action="store_true",
                   help="rebuild each GRAPH:LAYER without the build cache on its parent's image (parents are "
                        "not rebuilt) and compare with its stored .sqsh; exit 1 when they differ")
    add_builder_option(p)
    p.add_argument("--progress", choices=("auto", "tty", "plain", "json"), default="auto",
                   help="progress on stderr: tty a live view per layer, plain one line per event, json one "
                        "JSON object per event; auto (default) is tty on a terminal, else plain")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON (efabuild.make/v1)")
    p.add_argument("--graph", metavar="FILE",
                   help="also draw what make did (.svg or .png, with Graphviz): each layer coloured by "
                        "its outcome, with its key, time and why it was built or failed")
    p.set_defaults(run=run)


def run(args) -> int:
    ws = workspace()
    if args.jobs is not None and args.jobs < 1:
        raise InputError("--jobs must be at least 1")
    ws = with_builder(ws, args.builder)
    if args.full_export:
        ws = ws._replace(settings=ws.settings._replace(export=ws.settings.export._replace(incremental=False)))
    if not args.dry_run:
        check_temp_dir()  # one line before the plan, not a failure per build
    if args.check:
        return _check(ws, args)
    if args.graph:
        _graph_format(args.graph)  # a bad name stops here, not after the builds
    if args.progress == "json":  # the library's warnings and notes are events too: stderr stays JSON
        notices.use(JsonReporter(sys.stderr).notice)
    # what killed makes left is looked for while the plan walks; removed once the make runs
    leftovers = None if args.dry_run else make.LeftoverSearch(ws)
    with announce_after(planning_line(sys.stderr, args.progress)):
        prepared = _prepared(ws, args)
    if args.full_export:
        _note_kept_artifacts(prepared)
    if args.dry_run:
        if args.json:
            print_json("plan", plan_json(prepared))
        else:
            _print_plan(prepared, sys.stdout, args.progress)
        if args.graph:
            _draw(args.graph, prepared, None)
        return 0
    make.check_secrets(prepared)  # before the plan is printed: bad input is one line
    _print_plan(prepared, sys.stderr, args.progress)
    reporter = reporter_for(sys.stderr, args.progress)
    _sigterm_interrupts()  # scancel and timeouts send SIGTERM: stop builds as Ctrl-C does
    try:
        result = make.run(prepared, reporter, jobs=args.jobs or ws.settings.builder.jobs, leftovers=leftovers)
    finally:
        reporter.close()
    return _report(args, prepared, result)


def _note_kept_artifacts(prepared) -> None:
    """--full-export exports the keys this make exports; an artifact stored under its key already
    stays as it is (jobs, signatures and verified copies refer to its bytes): say which, not nothing."""
    kept = [layer.qualname for layer in prepared.plan.layers
            if layer.artifact and (layer.stored or layer.action == COPY)]
    if kept:
        shown = ", ".join(kept[:4]) + (f" and {len(kept) - 4} more" if len(kept) > 4 else "")
        notices.note(f"--full-export: {shown} {'is' if len(kept) == 1 else 'are'} stored already under "
                     f"{'its key' if len(kept) == 1 else 'their keys'} and not exported again (a key's artifact "
                     "is never rewritten); a layer's full export comes with its next key")


def _print_plan(prepared, stream, progress: str) -> None:
    """The plan before the builds: a table, or with --progress json the plan's own JSON as an event."""
    if progress == "json" and stream is sys.stderr:
        JsonReporter(stream).emit("plan", **plan_json(prepared))
    else:
        print(render(prepared.plan, prepared.engine_error, palette_for(stream)), file=stream)


def _prepared(ws, args):
    """The plan, linted first unless --no-lint: lint's errors are shown before the one-line stop."""
    try:
        return make.prepare_make(ws, args.targets, lint=not args.no_lint, require_engine=not args.dry_run)
    except make.LintFailed as exc:
        from efabuild.lint import render_text

        print(render_text(exc.findings), file=sys.stderr)
        raise


def _report(args, prepared, result) -> int:
    if args.graph:
        try:
            _draw(args.graph, prepared, result)
        except EfabuildError as exc:  # the builds are done and stored: the picture is not worth failing
            print(f"efabuild: warning: --graph {args.graph}: {exc}", file=sys.stderr)
    paths = _artifact_paths(prepared, result)
    if args.json:
        print_json("make", {"layers": [_with_platform(outcome_json(o, paths.get(o.qualname)), result)
                                       for o in result.outcomes],
                            "failed": result.failed, "skipped_tiers": result.skipped_tiers})
    else:
        print(summary(result, paths, palette_for(sys.stdout)))
    # each failure once, with its step and the end of its log, where the user looks last (with
    # --progress json its finished event carries it: stderr stays JSON)
    failed = palette_for(sys.stderr).state(make.FAILED)
    for outcome in result.outcomes:
        if outcome.status == make.FAILED and args.progress != "json":
            print(f"efabuild: {outcome.qualname} {failed}: {outcome.error}", file=sys.stderr)
    return 1 if result.failed or result.skipped_tiers else 0


def _artifact_paths(prepared, result) -> dict[str, str]:
    """Layer -> its .sqsh in the store, for every artifact layer the make left stored, reused or
    new: a program reading make --json needs no lookup after it."""
    plans = prepared.plan.by_name()
    paths = {}
    for outcome in result.outcomes:
        if outcome.artifact:
            paths[outcome.qualname] = outcome.artifact
        elif plans[outcome.qualname].artifact and outcome.status not in (make.FAILED, make.SKIPPED):
            hit = prepared.store.local_hit(outcome.key)
            if hit is not None:
                paths[outcome.qualname] = str(hit[1])
    return paths


def summary(result, paths=None, palette=None) -> str:
    """The table at the end of a make: each layer's outcome, time and artifact, then the counts.
    A failure's message follows once, below it; its row says only that it failed, and when."""
    paths = paths if paths is not None else {o.qualname: o.artifact for o in result.outcomes}
    rows = [[o.qualname, short(o.key), o.status, f"{o.seconds:.1f}s", paths.get(o.qualname) or ""]
            for o in result.outcomes]
    tail = ", ".join(f"{n} {s}" for s, n in result.counts().items()) or "nothing to do"
    tail += "".join(f"; {tier} tier skipped: {why}" for tier, why in result.skipped_tiers.items())
    palette = palette or Palette(False)
    return table(rows, ["LAYER", "KEY", "RESULT", "TIME", "ARTIFACT"], paint=palette.state, painted=2) + "\n" + tail


def _check(ws, args) -> int:
    if not args.targets or any(":" not in target for target in args.targets):
        raise InputError("--check takes the layers to check as GRAPH:LAYER")
    if args.dry_run:
        raise InputError("--check and --dry-run do not go together")
    from efabuild.make import check  # its attrs classes: a no-op make loads none

    prepared = prepare(ws, args.targets, require_engine=True)
    reporter = reporter_for(sys.stderr, args.progress)
    _sigterm_interrupts()
    results = []
    plans = prepared.plan.by_name()
    # GRAPH:LAYER checks it on every platform it is built for; GRAPH:LAYER@os/arch on that one
    names = [name for target in args.targets for name in plans if name == target or plans[name].layer == target]
    try:
        for name in dict.fromkeys(names):
            results.append(check.check_layer(prepared, name, reporter))
    finally:
        reporter.close()
    if args.json:
        print_json("check", {"checks": [check.to_json(r) for r in results]})
    else:
        print("\n".join(check.render(r) for r in results))
    return 0 if all(r.identical for r in results) else 1


def _sigterm_interrupts() -> None:
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def _with_platform(data: dict, result) -> dict:  # noqa: ANN001 - a MakeResult
    """A layer of make --json with its graph:layer and platform apart: `name` is
    graph:layer@os/arch in a several-platform workspace."""
    layer, platform = result.layers.get(data["name"], (data["name"], None))
    return {**data, "layer": layer, "platform": platform}


def _graph_format(name: str) -> str:
    from efabuild.cli.graphviz import format_of, require_dot  # only with --graph: see _draw

    require_dot()
    return format_of(Path(name))


def _draw(name: str, prepared, result) -> None:
    """The --graph picture: the plan (a dry run) or what the make did with each layer."""
    # only --graph loads them: picture's attrs classes (15 ms), graphviz's subprocess and ctypes
    # (through host.children, 6 ms); a no-op make loads neither
    from efabuild.cli import graphviz, picture

    if result is None:
        nodes, title = picture.plan_nodes(prepared.plan), "efabuild make --dry-run"
    else:
        nodes, title = picture.outcome_nodes(prepared.plan, result.outcomes), "efabuild make"
    source = picture.dot_source(prepared.graph, prepared.order, nodes, title)
    write_file(name, graphviz.render(source, _graph_format(name)))
