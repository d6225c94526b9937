"""The layer graph: parents as edges, cycle detection, dependency order and target selection."""

from __future__ import annotations

import difflib
import heapq
from collections.abc import Iterable, Iterator

from efabuild.errors import InputError
from efabuild.model import Workspace
from efabuild.refs import PLATFORM_MARK, layer_of, on_platform


class LayerGraph:
    """Layers as nodes, each with its attributes (`layer` among them), edges parent -> child.

    The few graph operations a plan needs, on dicts. networkx answers the same, but importing it
    takes longer than the rest of a no-op plan (about 0.1 s of a 0.15 s budget).
    """

    def __init__(self) -> None:
        self.nodes: dict[str, dict] = {}
        self._children: dict[str, list[str]] = {}
        self._parents: dict[str, list[str]] = {}

    def add_node(self, name: str, **attributes: object) -> None:
        self.nodes.setdefault(name, {}).update(attributes)
        self._children.setdefault(name, [])
        self._parents.setdefault(name, [])

    def add_edge(self, parent: str, child: str) -> None:
        self.add_node(parent)
        self.add_node(child)
        if child not in self._children[parent]:
            self._children[parent].append(child)
            self._parents[child].append(parent)

    def __contains__(self, name: object) -> bool:
        return name in self.nodes

    def __iter__(self) -> Iterator[str]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def edges(self) -> list[tuple[str, str]]:
        return [(parent, child) for parent, children in self._children.items() for child in children]

    def successors(self, name: str) -> Iterator[str]:
        return iter(self._children[name])

    def predecessors(self, name: str) -> Iterator[str]:
        return iter(self._parents[name])

    def ancestors(self, name: str) -> set[str]:
        found: set[str] = set()
        stack = list(self._parents[name])
        while stack:
            current = stack.pop()
            if current not in found:
                found.add(current)
                stack.extend(self._parents[current])
        return found

    def find_cycle(self) -> list[str] | None:
        """One cycle as its nodes in edge order, None when there is none."""
        state: dict[str, int] = {}  # 1: on the current path, 2: done
        for start in self.nodes:
            if start in state:
                continue
            path, iterators = [start], [iter(self._children[start])]
            state[start] = 1
            while iterators:
                child = next(iterators[-1], None)
                if child is None:
                    state[path.pop()] = 2
                    iterators.pop()
                elif state.get(child) == 1:
                    return path[path.index(child):]
                elif child not in state:
                    state[child] = 1
                    path.append(child)
                    iterators.append(iter(self._children[child]))
        return None

    def topological_order(self) -> list[str]:
        """Parents before children; among the ready ones, the earliest added first."""
        index = {name: i for i, name in enumerate(self.nodes)}
        waiting = {name: len(parents) for name, parents in self._parents.items()}
        ready = [index[name] for name, count in waiting.items() if count == 0]
        heapq.heapify(ready)
        names = list(self.nodes)
        order: list[str] = []
        while ready:
            name = names[heapq.heappop(ready)]
            order.append(name)
            for child in self._children[name]:
                waiting[child] -= 1
                if waiting[child] == 0:
                    heapq.heappush(ready, index[child])
        return order


def layer_graph(ws: Workspace) -> LayerGraph:
    """Edges run parent -> child. Raises InputError naming a cycle."""
    graph = LayerGraph()
    for qualname, layer in ws.layers.items():
        graph.add_node(qualname, layer=layer)
    for qualname, layer in ws.layers.items():
        if layer.parent:
            graph.add_edge(layer.parent, qualname)
    cycle = graph.find_cycle()
    if cycle is None:
        return graph
    names = [*cycle, cycle[0]]
    first = ws.layers[names[0]]
    raise InputError(f"cycle: {' -> '.join(names)}", f"{ws.relpath(first.source)}: layers.{first.name}.parent")


def select(ws: Workspace, graph: LayerGraph, targets: Iterable[str]) -> list[str]:
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
            wanted |= graph.ancestors(name)
    return [name for name in dependency_order(graph) if name in wanted]


def dependency_order(graph: LayerGraph) -> list[str]:
    """Parents before children; otherwise declaration order (graph by graph, as the files say)."""
    return graph.topological_order()


def on_platforms(ws: Workspace, graph: LayerGraph, order: list[str],
                 only: frozenset[str] = frozenset()) -> tuple[LayerGraph, list[str]]:
    """One node per selected layer and platform it is built for, parents before children: each
    (layer, platform) has its own inputs, key, image, artifact and build record. In a
    one-platform workspace the nodes are the layers themselves, under their own names; with
    several, `graph:layer@os/arch` (refs.on_platform), a child on the same platform's parent.
    `only`: the platforms to keep (all when empty). Nodes carry `layer`, `platform`, `parent`."""
    several = ws.settings.builder.several
    if not several:
        platform = ws.settings.builder.platform
        for name in order:
            node = graph.nodes[name]
            node["platform"], node["parent"] = platform, node["layer"].parent
        return graph, order
    expanded = LayerGraph()
    expanded_order: list[str] = []
    for name in order:
        layer = graph.nodes[name]["layer"]
        for platform in layer.platforms:
            if only and platform not in only:
                continue
            node = on_platform(name, platform, True)
            parent = on_platform(layer.parent, platform, True) if layer.parent else None
            expanded.add_node(node, layer=layer, platform=platform, parent=parent)
            if parent is not None:
                expanded.add_edge(parent, node)
            expanded_order.append(node)
    return expanded, expanded_order


def split_targets(targets: Iterable[str]) -> tuple[list[str], frozenset[str]]:
    """`make demo:train@linux/arm64`: (the targets without platforms, the platforms named). A
    platform narrows the make only when every target names one."""
    targets = list(targets)
    plain = [layer_of(t) for t in targets]
    named = [t.partition(PLATFORM_MARK)[2] for t in targets]
    return plain, frozenset(named) if targets and all(named) else frozenset()
