"""The layer graph: parents as edges, cycle detection, dependency order and target selection."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

import networkx as nx

from efabuild.errors import InputError
from efabuild.model import Workspace


def layer_graph(ws: Workspace) -> nx.DiGraph:
    """Edges run parent -> child. Raises InputError naming a cycle."""
    graph = nx.DiGraph()
    for qualname, layer in ws.layers.items():
        graph.add_node(qualname, layer=layer)
    for qualname, layer in ws.layers.items():
        if layer.parent:
            graph.add_edge(layer.parent, qualname)
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        return graph
    names = [edge[0] for edge in cycle] + [cycle[0][0]]
    first = ws.layers[names[0]]
    raise InputError(f"cycle: {' -> '.join(names)}", f"{ws.relpath(first.source)}: layers.{first.name}.parent")


def select(ws: Workspace, graph: nx.DiGraph, targets: Iterable[str]) -> list[str]:
    """Resolve `GRAPH` or `GRAPH:LAYER` targets to the layers they need (with ancestors), in order.

    No targets selects everything.
    """
    targets = list(targets)
    if not targets:
        return dependency_order(graph)
    wanted: set[str] = set()
    graph_names = [g.name for g in ws.graphs]
    for target in targets:
        if ":" in target:
            if target not in graph:
                hint = difflib.get_close_matches(target, list(graph.nodes), n=1)
                raise InputError(f"unknown layer '{target}'" + (f" (did you mean '{hint[0]}'?)" if hint else ""))
            picked = {target}
        else:
            if target not in graph_names:
                hint = difflib.get_close_matches(target, graph_names, n=1)
                raise InputError(f"unknown graph '{target}'" + (f" (did you mean '{hint[0]}'?)" if hint else "")
                                 + f"; graphs: {', '.join(graph_names)}")
            picked = {n for n in graph.nodes if n.startswith(f"{target}:")}
        for name in picked:
            wanted.add(name)
            wanted |= nx.ancestors(graph, name)
    return [name for name in dependency_order(graph) if name in wanted]


def dependency_order(graph: nx.DiGraph) -> list[str]:
    """Parents before children; otherwise declaration order (graph by graph, as the files say)."""
    index = {name: i for i, name in enumerate(graph.nodes)}
    return list(nx.lexicographical_topological_sort(graph, key=index.__getitem__))
