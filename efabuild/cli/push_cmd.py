"""`efabuild push`: send layers the engine already has to the [registry] layer cache."""

from __future__ import annotations

import sys

from efabuild.cli.common import add_builder_option, with_builder, workspace
from efabuild.cli.output import print_json, table
from efabuild.engine.images import built_for_key, tag_image
from efabuild.engine.registry import push
from efabuild.errors import InputError
from efabuild.make.prepare import prepare
from efabuild.refs import KEY_LABEL, image_tag, short


def configure(name, sub, common):
    p = sub.add_parser(
        name, parents=[common],
        description="""
            Push every selected layer whose image the engine has to the [registry] layer cache, as
            REGISTRY/efabuild/<layer>:<key>: other machines then pull it instead of building it.
            make pushes what it builds; push sends what was built before [registry] was set, or
            after the registry lost it. A layer the engine does not have is named (make it first),
            and push exits 1; so is one whose image does not carry its key in the org.efabuild.key
            label (a name some other image was given on a shared engine): it is not pushed.""",
        epilog="""
            examples:
              efabuild push                     # every layer built so far
              efabuild push ngc-efa:user        # one layer and its ancestors
              efabuild push demo --json""",
    )
    p.add_argument("targets", nargs="*", metavar="GRAPH[:LAYER]", help="graphs or layers (default: all)")
    p.add_argument("--json", action="store_true", help="print each layer's outcome as JSON")
    add_builder_option(p)
    p.set_defaults(run=run)


def run(args) -> int:
    ws = with_builder(workspace(), args.builder)
    if ws.settings.registry is None:
        raise InputError("no [registry] table: nothing to push to (set [registry] url)", "BUILD.toml")
    prepared = prepare(ws, args.targets, require_engine=True)
    rows = []
    for lp in prepared.plan.layers:
        own = image_tag(lp.qualname.split(":", 1)[1], lp.key)
        if lp.key not in prepared.image_tags:
            rows.append({"name": lp.qualname, "key": lp.key, "pushed": None, "problem": "not built: make it first"})
            continue
        found = prepared.image_tags[lp.key]
        # whoever shares the engine can tag any image efabuild/<layer>:<key>; other machines would
        # pull it as that layer
        if not built_for_key(prepared.engine, found, lp.key):
            rows.append({"name": lp.qualname, "key": lp.key, "pushed": None,
                         "problem": f"{found} does not carry this key in its {KEY_LABEL} label"})
            continue
        if found != own:  # built under another layer's name (what stood under its own, it replaces)
            tag_image(prepared.engine, found, own)
        pushed = push(prepared.engine, own, ws.settings.registry)
        rows.append({"name": lp.qualname, "key": lp.key, "pushed": pushed, "problem": None})
    if args.json:
        print_json("push", {"layers": rows})
    else:
        print(table([[r["name"], short(r["key"]), r["pushed"] or r["problem"]] for r in rows],
                    ["LAYER", "KEY", "PUSHED"]))
    return _report_unpushed(rows)


def _report_unpushed(rows: list[dict]) -> int:
    missing = [r["name"] for r in rows if r["problem"] and r["problem"].startswith("not built")]
    if missing:
        print(f"efabuild: not pushed (not built): {', '.join(missing)}", file=sys.stderr)
    unlabelled = [r["name"] for r in rows if r["problem"] and not r["problem"].startswith("not built")]
    if unlabelled:
        print(f"efabuild: not pushed (an image not built for its key): {', '.join(unlabelled)}", file=sys.stderr)
    return 1 if missing or unlabelled else 0
