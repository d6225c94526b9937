"""`efabuild graph`: the layer DAG as text, Graphviz dot or Mermaid."""

from __future__ import annotations


def configure(name, sub, common):
    p = sub.add_parser(
        name, parents=[common], help="print the layer graph",
        description="""
            The layers and what each is built on (its parent layer, or a base image), as an
            indented tree, Graphviz dot or Mermaid. Artifact layers (exported to .sqsh) are marked.""",
        epilog="""
            examples:
              efabuild graph                    # every graph as a tree
              efabuild graph demo --format mermaid
              efabuild graph --format dot | dot -Tsvg > layers.svg""",
    )
    p.add_argument("targets", nargs="*", metavar="GRAPH[:LAYER]", help="graphs or layers (default: all)")
    p.add_argument("--format", choices=("text", "dot", "mermaid"), default="text",
                   help="text: an indented tree, children under their parent (default); dot: Graphviz "
                        "source, artifact layers as 3-D boxes, bases as cylinders; mermaid: a Mermaid "
                        "flowchart for Markdown")
    p.set_defaults(run=run)


def run(args) -> int:
    from efabuild import dag
    from efabuild.cli.common import workspace

    ws = workspace()
    graph = dag.layer_graph(ws)
    order = dag.select(ws, graph, args.targets)
    print(render(graph, order, args.format))
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

    def walk(name: str, depth: int) -> None:
        lines.append("  " * depth + _label(graph.nodes[name]["layer"]))
        for child in graph.successors(name):
            if child in selected:
                walk(child, depth + 1)

    for name in order:
        if not any(p in selected for p in graph.predecessors(name)):
            walk(name, 0)
    return "\n".join(lines)
