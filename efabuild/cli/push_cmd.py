"""`efabuild push`: send layers the engine already has to the [registry] layer cache."""

from __future__ import annotations

from efabuild.cli.common import add_builder_option


def configure(name, sub, common):
    p = sub.add_parser(
        name, parents=[common], help="push the built layers to the [registry] layer cache",
        description="""
            Push every selected layer whose image the engine has to the [registry] layer cache, as
            REGISTRY/efabuild/<layer>:<key>: other machines then pull it instead of building it.
            make pushes what it builds; push sends what was built before [registry] was set, or
            after the registry lost it. A layer the engine does not have is named (make it first),
            and push exits 1.""",
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
    import sys

    from efabuild.build.prepare import prepare
    from efabuild.cli.common import with_builder, workspace
    from efabuild.cli.output import print_json, table
    from efabuild.engine.images import image_exists, tag_image
    from efabuild.engine.registry import push
    from efabuild.errors import InputError
    from efabuild.refs import image_tag, short

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
        if not image_exists(prepared.engine, own):  # built under another layer's name: pushed under its own
            tag_image(prepared.engine, prepared.image_tags[lp.key], own)
        pushed = push(prepared.engine, own, ws.settings.registry)
        rows.append({"name": lp.qualname, "key": lp.key, "pushed": pushed, "problem": None})
    if args.json:
        print_json("push", {"layers": rows})
    else:
        print(table([[r["name"], short(r["key"]), r["pushed"] or r["problem"]] for r in rows],
                    ["LAYER", "KEY", "PUSHED"]))
    missing = [r["name"] for r in rows if r["pushed"] is None]
    if missing:
        print(f"efabuild: not pushed (not built): {', '.join(missing)}", file=sys.stderr)
    return 1 if missing else 0
