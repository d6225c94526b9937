"""`efabuild graph`: the layer DAG as text, Graphviz dot or Mermaid, or drawn as SVG/PNG with each
layer coloured by its plan state."""

from __future__ import annotations

import sys

from efabuild import dag
from efabuild.cli import graphviz, picture
from efabuild.cli.common import add_builder_option, with_builder, workspace, write_file
from efabuild.errors import InputError
from efabuild.make.prepare import prepare

PICTURES = ("svg", "png")


def configure(name, sub, common):
    p = sub.add_parser(
        name, parents=[common],
        description="""
            The layers and what each is built on (its parent layer, or a base image), as an
            indented tree, Graphviz dot or Mermaid. Artifact layers (exported to .sqsh) are marked.
            svg and png draw it with Graphviz, each layer coloured by its plan state (available,
            to build, to pull, to export, to copy) with its short key and why it builds: they
            plan first, as `efabuild plan` does.""",
        epilog="""
            examples:
              efabuild graph                    # every graph as a tree
              efabuild graph demo --format mermaid
              efabuild graph demo --format svg -o plan.svg
              efabuild graph --format png --offline > plan.png""",
    )
    p.add_argument("targets", nargs="*", metavar="GRAPH[:LAYER]", help="graphs or layers (default: all)")
    p.add_argument("--format", choices=("text", "dot", "mermaid", *PICTURES), default="text",
                   help="text: an indented tree, children under their parent (default); dot: Graphviz "
                        "source, artifact layers as 3-D boxes, bases as cylinders; mermaid: a Mermaid "
                        "flowchart for Markdown; svg, png: the plan drawn by Graphviz's dot, layers "
                        "coloured by state")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write svg or png here (atomically) instead of standard output")
    p.add_argument("--offline", action="store_true",
                   help="svg, png: plan without the engine or S3, as `efabuild plan --offline`")
    add_builder_option(p)
    p.set_defaults(run=run)


def run(args) -> int:
    if args.format not in PICTURES and (args.output or args.offline or args.builder):
        raise InputError(f"-o, --offline and --builder go with --format svg or png, not {args.format}")
    ws = workspace()
    if args.format in PICTURES:
        return _draw(ws, args)
    graph = dag.layer_graph(ws)
    order = dag.select(ws, graph, args.targets)
    print(render(graph, order, args.format))
    return 0


def _draw(ws, args) -> int:
    if not args.output and sys.stdout.isatty() and args.format == "png":
        raise InputError("a PNG is not for a terminal: give -o FILE.png or redirect standard output")
    prepared = prepare(with_builder(ws, args.builder), args.targets, use_engine=not args.offline)
    title = "efabuild plan" + (" (offline)" if args.offline else "")
    source = picture.dot_source(prepared.graph, prepared.order, picture.plan_nodes(prepared.plan), title)
    data = graphviz.render(source, args.format)
    if args.output:
        write_file(args.output, data)
    else:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    return 0


def _label(layer) -> str:
    origin = f"FROM {layer.base.ref}" if layer.base else ""
    return f"{layer.qualname}{' [.sqsh]' if layer.artifact else ''}" + (f"  ({origin})" if origin else "")


def render(graph, order: list[str], fmt: str) -> str:
    selected = set(order)
    edges = [(a, b) for a, b in graph.edges if a in selected and b in selected]
    if fmt == "dot":
        lines = ["digraph efabuild {", "  rankdir=BT;"]
        for name in order:
            layer = graph.nodes[name]["layer"]
            shape = "box3d" if layer.artifact else "box"
            lines.append(f'  "{name}" [shape={shape}];')
            if layer.base:
                lines.append(f'  "{layer.base.ref}" [shape=cylinder];')
                lines.append(f'  "{name}" -> "{layer.base.ref}";')
        lines += [f'  "{b}" -> "{a}";' for a, b in edges]
        return "\n".join(lines + ["}"])
    if fmt == "mermaid":
        ids = {name: f"n{i}" for i, name in enumerate(order)}
        lines = ["graph BT"]
        for name in order:
            layer = graph.nodes[name]["layer"]
            lines.append(f'  {ids[name]}["{name}{" .sqsh" if layer.artifact else ""}"]')
            if layer.base:
                lines.append(f'  {ids[name]} --> b{ids[name]}[("{layer.base.ref}")]')
        lines += [f"  {ids[b]} --> {ids[a]}" for a, b in edges]
        return "\n".join(lines)
    lines = []
    for name in order:
        if any(p in selected for p in graph.predecessors(name)):
            continue
        # depth first with an explicit stack: a chain of thousands of layers needs no recursion
        stack = [(name, 0)]
        while stack:
            current, depth = stack.pop()
            lines.append("  " * depth + _label(graph.nodes[current]["layer"]))
            children = [child for child in graph.successors(current) if child in selected]
            stack.extend((child, depth + 1) for child in reversed(children))
    return "\n".join(lines)
