"""Where a finding points: a line of the graph TOML or of the layer's Dockerfile file.

Inline Dockerfile text starts some lines into the graph file: its line N is the graph's line
(first line of the text) + N - 1. Keys of the layer's table (`base`, `args.NAME`) are found by
tomlkeys, the one TOML line locator the loader uses too; a key not found points at the nearest
enclosing key that is (`args` for a missing `args.NAME`), else at the `[layers.NAME]` header.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from efabuild import configfile
from efabuild.errors import InputError
from efabuild.model import Layer, Workspace
from efabuild.tomlkeys import KeyLine, key_lines


class Locator(NamedTuple):
    graph_file: str  # workspace-relative graph TOML
    text_file: str  # the file the Dockerfile text comes from (the graph itself when inline)
    text_first_line: int  # line in text_file of the text's first line
    table_line: int | None  # line of [layers.NAME] in the graph
    layer: str  # the layer's name: its table is ("layers", layer)
    keys: Mapping[tuple[str, ...], KeyLine]  # the graph's key index

    def text(self, line: int) -> tuple[str, int]:
        return self.text_file, self.text_first_line + line - 1

    def key(self, *path: str) -> tuple[str, int | None]:
        """Line of `base`, `digest`, or `args`, `NAME` inside the layer's table."""
        for end in range(len(path), 0, -1):
            found = self.keys.get(("layers", self.layer, *path[:end]))
            if found is not None:
                return self.graph_file, found.line
        return self.graph_file, self.table_line


class GraphTexts:
    """Each graph file read and indexed once, whatever the number of its layers: a lint of 10k
    layers must not read or scan a 10k-layer file 10k times."""

    def __init__(self) -> None:
        self._index: dict[Path, Mapping[tuple[str, ...], KeyLine]] = {}

    def get(self, path: Path) -> Mapping[tuple[str, ...], KeyLine]:
        found = self._index.get(path)
        if found is None:
            found = self._index[path] = key_lines(_read_text(path))
        return found


def locator_for(ws: Workspace, layer: Layer, texts: GraphTexts | None = None) -> Locator:
    graph_file = ws.relpath(layer.source)
    keys = (texts or GraphTexts()).get(layer.source)
    header = keys.get(("layers", layer.name))
    table_line = layer.line if layer.line is not None else header.line if header else None
    common = dict(graph_file=graph_file, table_line=table_line, layer=layer.name, keys=keys)
    if layer.dockerfile_file:
        return Locator(text_file=layer.dockerfile_file, text_first_line=1, **common)
    first = getattr(layer, "dockerfile_line", None)
    if not first or (table_line is not None and first <= table_line):
        # not recorded by the loader (inline text always starts below its table header)
        inline = keys.get(("layers", layer.name, "dockerfile"))
        first = inline.text_line if inline else None
    return Locator(text_file=graph_file, text_first_line=first or table_line or 1, **common)


def _read_text(path: Path) -> str:
    try:
        return configfile.read_text(path, str(path))
    except InputError:
        return ""
