"""The layer DAG as a Graphviz picture: each layer a box coloured by its plan state (or by what
`make` did with it), with its short key and why it builds.

Pure: plan and outcomes in, Graphviz dot source out. `efabuild.cli.graphviz` turns the source into
SVG or PNG with Graphviz's `dot`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import attrs

from efabuild.display import shown

if TYPE_CHECKING:
    from efabuild.dag import LayerGraph

# fill colour of each plan state and make outcome; what will happen and what happened share one
# (to build / built), so a plan's picture and its make's picture read alike
STATE_COLOURS: dict[str, str] = {
    "available": "#c8e6c9",  # green: nothing to do
    "reused": "#c8e6c9",
    "to build": "#ffcc80",  # orange: a BuildKit build
    "built": "#ffcc80",
    "to pull": "#90caf9",  # blue: from the layer-cache registry
    "pulled": "#90caf9",
    "to copy": "#b39ddb",  # purple: a stored .sqsh copied between tiers
    "copied": "#b39ddb",
    "to export": "#fff59d",  # yellow: image → .sqsh
    "exported": "#fff59d",
    "failed": "#ef9a9a",  # red
    "skipped": "#e0e0e0",  # grey: a parent did not finish
}
UNKNOWN_COLOUR = "#ffffff"
BASE_COLOUR = "#eceff1"
_REASON_WIDTH = 48
_REASONS_SHOWN = 3
PROVISIONAL_NOTE = "* provisional key: may change once the base's digest is known"


@attrs.frozen
class Node:
    """One layer as the picture shows it."""

    qualname: str
    short_key: str
    state: str  # a key of STATE_COLOURS
    artifact: bool = False
    notes: tuple[str, ...] = ()  # why it builds or why it failed
    seconds: float | None = None  # how long make took with it
    provisional: bool = False  # the key may change once its base's digest is known (marked *)

    @property
    def colour(self) -> str:
        return STATE_COLOURS.get(self.state, UNKNOWN_COLOUR)


def plan_nodes(plan) -> dict[str, Node]:  # noqa: ANN001 - efabuild.plan.Plan
    """Each planned layer with its state and reasons."""
    return {lp.qualname: Node(lp.qualname, lp.short_key, lp.state, lp.artifact, tuple(lp.reasons),
                              provisional=lp.provisional) for lp in plan.layers}


def outcome_nodes(plan, outcomes: Iterable) -> dict[str, Node]:  # noqa: ANN001 - Plan, make.Outcome
    """Each layer as a make left it: its outcome and time, why it was built, why it failed."""
    planned = {lp.qualname: lp for lp in plan.layers}
    nodes = plan_nodes(plan)
    for outcome in outcomes:
        lp = planned.get(outcome.qualname)
        notes: list[str] = []
        if outcome.error:
            notes += _failure(outcome.error)
        elif lp is not None and outcome.status == "built":
            notes += lp.reasons
        nodes[outcome.qualname] = Node(outcome.qualname, nodes[outcome.qualname].short_key if lp else
                                       outcome.key[:12], outcome.status, lp.artifact if lp else False,
                                       tuple(notes), outcome.seconds or None)
    return nodes


def _failure(error: str) -> list[str]:
    """A make error in a box's few lines: `build of TAG failed at STEP: exit code N (log: …)` becomes
    the step and the exit code (the tag is the box's own name and key)."""
    head = re.sub(r" \(log: [^)]*\)$", "", error.splitlines()[0])
    head = re.sub(r"^build of \S+ ", "", head)
    step, sep, why = head.rpartition(": ")
    return [step, why] if sep and step.startswith("failed at ") else [head]


def dot_source(graph: LayerGraph, order: list[str], nodes: Mapping[str, Node], title: str = "") -> str:
    """Graphviz source: a stack as images are, bases at the bottom and each layer above what it is
    built on (arrows point at it), and a legend of the states shown."""
    selected = [name for name in order if name in nodes]
    lines = [
        "digraph efabuild {",
        "  rankdir=TB;",
        '  graph [fontname="Helvetica", fontsize=11, labelloc=t' + (f", label={_quote(title)}" if title else "") + "];",
        '  node [fontname="Helvetica", fontsize=10, style="filled", shape=box];',
        '  edge [color="#607d8b"];',
    ]
    bases: dict[str, str] = {}
    for name in selected:
        node = nodes[name]
        key = node.short_key + ("*" if node.provisional else "")
        label = [node.qualname + ("  [.sqsh]" if node.artifact else ""),
                 f"{key}  {node.state}" + (f" in {node.seconds:.1f}s" if node.seconds else "")]
        label += [_clip(note) for note in node.notes[:_REASONS_SHOWN]]
        if len(node.notes) > _REASONS_SHOWN:
            label.append(f"… {len(node.notes) - _REASONS_SHOWN} more")
        shape = "box3d" if node.artifact else "box"
        lines.append(f"  {_quote(name)} [shape={shape}, fillcolor={_quote(node.colour)}, "
                     f"label={_lines(label)}, tooltip={_quote(node.state)}, class={_quote(_css(node.state))}];")
        layer = graph.nodes[name]["layer"]
        if layer.base is not None:
            bases.setdefault(layer.base.ref, f"base{len(bases)}")
            lines.append(f"  {_quote(name)} -> {_quote(bases[layer.base.ref])};")
    for ref, ident in bases.items():
        lines.append(f"  {_quote(ident)} [shape=cylinder, fillcolor={_quote(BASE_COLOUR)}, label={_quote(ref)}];")
    chosen = set(selected)
    for parent, child in graph.edges:
        if parent in chosen and child in chosen:
            lines.append(f"  {_quote(child)} -> {_quote(parent)};")
    lines += _legend([nodes[name].state for name in selected], any(nodes[name].provisional for name in selected))
    lines.append("}")
    return "\n".join(lines) + "\n"


def _legend(states: list[str], provisional: bool = False) -> list[str]:
    shown = list(dict.fromkeys(states))
    if not shown:
        return []
    cells = "".join(f'<TD BGCOLOR="{STATE_COLOURS.get(s, UNKNOWN_COLOUR)}">{_html(s)}</TD>' for s in shown)
    rows = "<TR>" + cells + "</TR>"
    if provisional:  # explained once, as `efabuild plan` does under its table
        rows += f'<TR><TD COLSPAN="{len(shown)}">{_html(PROVISIONAL_NOTE)}</TD></TR>'
    return ['  legend [shape=plaintext, style="", label=<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0" '
            f'CELLPADDING="4">{rows}</TABLE>>];']


def _clip(text: str) -> str:
    return text if len(text) <= _REASON_WIDTH else text[: _REASON_WIDTH - 1] + "…"


def _css(state: str) -> str:
    return "state-" + state.replace(" ", "-")


def _quote(text: str) -> str:
    return '"' + _dot_text(text) + '"'


def _lines(lines: list[str]) -> str:
    # "\l" ends a left-justified line in a Graphviz label
    escaped = [_dot_text(line) for line in lines]
    return '"' + "\\l".join(escaped) + '\\l"'


def _dot_text(text: str) -> str:
    """Text inside a DOT string: a newline as a space, other control characters shown escaped
    (an SVG holding them is no XML), then backslashes and quotes escaped for dot."""
    text = shown(text.replace("\n", " "))
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
