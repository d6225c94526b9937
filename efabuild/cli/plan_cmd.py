"""`efabuild plan`: every layer's key, state and, for layers to build, why."""

from __future__ import annotations

import sys

from efabuild.cli.colour import Palette, palette_for
from efabuild.cli.common import add_builder_option, with_builder, workspace
from efabuild.cli.live import announce_after, planning_line
from efabuild.cli.output import print_json, table
from efabuild.make.prepare import prepare
from efabuild.plan import NOTHING


def configure(name, sub, common):
    p = sub.add_parser(
        name, parents=[common],
        description="""
            Every selected layer with its key, its state (available, to build, to pull, to export,
            to copy between store tiers) and, for a layer to build, why: changed build args,
            Dockerfile lines, context files, base digest, or a changed parent. A key marked * is
            provisional: its base's digest is not known for sure (--offline, or unresolved), and
            the key may change once it is. Builds nothing.""",
        epilog="""
            examples:
              efabuild plan                     # every graph
              efabuild plan demo:user           # one layer and its ancestors
              efabuild plan --offline --json    # from the build records only, as data""",
    )
    p.add_argument("targets", nargs="*", metavar="GRAPH[:LAYER]", help="graphs or layers (default: all)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON (efabuild.plan/v1)")
    p.add_argument("--offline", action="store_true", help="ask neither the engine nor S3: base digests as at their last build, "
                        "availability from the build records")
    add_builder_option(p)
    p.set_defaults(run=run)


def run(args) -> int:
    with announce_after(planning_line(sys.stderr, "plain")):
        prepared = prepare(with_builder(workspace(), args.builder), args.targets, use_engine=not args.offline)
    if args.json:
        print_json("plan", plan_json(prepared))
    else:
        print(render(prepared.plan, prepared.engine_error, palette_for(sys.stdout)))
    return 0


def plan_json(prepared) -> dict:
    """The plan as data (plan --json, and make's plan event with --progress json)."""
    data = prepared.plan.to_json()
    data["engine"] = None if prepared.engine_error else "reachable"
    data["engine_error"] = prepared.engine_error
    return data


def render(plan, engine_error: str | None, palette=None) -> str:
    rows = []
    for lp in plan.layers:
        why = "; ".join(lp.why)
        state = lp.state + (" (.sqsh)" if lp.artifact and lp.stored else "")
        rows.append([lp.qualname, lp.short_key + ("*" if lp.provisional else ""), state, why])
    palette = palette or Palette(False)
    lines = [table(rows, ["LAYER", "KEY", "STATE", "WHY"], paint=palette.state, painted=2)]
    for base in plan.bases:
        ref = base.ref + (f"@{base.platform}" if base.platform else "")
        if base.source == "recorded":
            lines.append(f"base {ref}: {base.digest} (as at its last build; not checked offline)")
        elif base.digest:
            index = f", in index {base.index_digest}" if base.index_digest else ""
            lines.append(f"base {ref}: {base.digest} ({base.source}{index})")
        else:
            lines.append(f"base {ref}: digest unresolved, the key uses the tag only")
    if engine_error:
        lines.append(f"engine not consulted ({engine_error}); availability from build records")
    if any(lp.provisional for lp in plan.layers):
        lines.append("* provisional key: may change once the base's digest is known (a make resolves it)")
    counts = {action: len(plan.of(action)) for action in ("build", "pull", "export", "copy")}
    available = len(plan.of(NOTHING))
    lines.append(f"{counts['build']} to build, {counts['pull']} to pull, {counts['export']} to export, "
                 + (f"{counts['copy']} to copy, " if counts["copy"] else "") + f"{available} available")
    return "\n".join(lines)
