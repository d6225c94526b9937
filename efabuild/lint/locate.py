"""Where a finding points: a line of the graph TOML or of the layer's Dockerfile file.

Inline Dockerfile text starts some lines into the graph file: its line N is the graph's line
(first line of the text) + N - 1. Keys of the layer's table (`base`, `args.NAME`) are found by
scanning the table's lines; anything not found points at the `[layers.NAME]` header.
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs

from efabuild import configfile
from efabuild.errors import InputError
from efabuild.model import Layer, Workspace


@attrs.frozen
class Locator:
    graph_file: str  # workspace-relative graph TOML
    text_file: str  # the file the Dockerfile text comes from (the graph itself when inline)
    text_first_line: int  # line in text_file of the text's first line
    table_line: int | None  # line of [layers.NAME] in the graph
    table_lines: tuple[tuple[int, str], ...]  # (line number, text) of the layer's table and subtables

    def text(self, line: int) -> tuple[str, int]:
        return self.text_file, self.text_first_line + line - 1

    def key(self, *path: str) -> tuple[str, int | None]:
        """Line of `base`, `digest`, or `args`, `NAME` inside the layer's table."""
        line = _find_key(self.table_lines, path)
        return self.graph_file, line if line is not None else self.table_line


class GraphTexts:
    """Each graph file read and indexed once, whatever the number of its layers: a lint of 10k
    layers must not read or scan a 10k-layer file 10k times."""

    def __init__(self) -> None:
        self._index: dict[Path, _GraphText] = {}
        self.files_indexed = 0  # how many times a file was read and split (for tests)

    def get(self, path: Path) -> _GraphText:
        found = self._index.get(path)
        if found is None:
            found = self._index[path] = _GraphText(_read_lines(path))
            self.files_indexed += 1
        return found


class _GraphText:
    """A graph file's lines and, for each layer, the lines of its table and subtables."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.headers: dict[str, int] = {}  # layer -> line of its first [layers.NAME] header
        self.tables: dict[str, list[tuple[int, str]]] = {}
        owner: str | None = None
        for number, text in enumerate(lines, 1):
            if _TABLE_START.match(text):
                header = _LAYER_HEADER.match(text)
                owner = (header.group(1) or header.group(2)) if header else None
                # the layer's own table starts its lines; a subtable before it belongs to nobody
                if owner is not None and owner not in self.headers:
                    if _OWN_TABLE_END.match(text, header.end() - 1):
                        self.headers[owner] = number
                        self.tables[owner] = []
                    else:
                        owner = None
            if owner is not None and owner in self.tables:
                self.tables[owner].append((number, text))

    def table(self, name: str, table_line: int | None) -> tuple[tuple[int, str], ...]:
        """The header line and every line up to the next table that is not one of this layer's."""
        if table_line is None:
            return ()
        if self.headers.get(name) == table_line:
            return tuple(self.tables[name])
        return _table_lines(self.lines, table_line, name)  # a header the index did not see


def locator_for(ws: Workspace, layer: Layer, texts: GraphTexts | None = None) -> Locator:
    graph_file = ws.relpath(layer.source)
    text = (texts or GraphTexts()).get(layer.source)
    table_line = layer.line if layer.line is not None else text.headers.get(layer.name)
    table = text.table(layer.name, table_line)
    if layer.dockerfile_file:
        return Locator(graph_file=graph_file, text_file=layer.dockerfile_file, text_first_line=1,
                       table_line=table_line, table_lines=table)
    first = getattr(layer, "dockerfile_line", None)
    if not first or (table_line is not None and first <= table_line):
        # not recorded by the loader (inline text always starts below its table header)
        first = _inline_text_line(table, layer.dockerfile)
    return Locator(graph_file=graph_file, text_file=graph_file, text_first_line=first or table_line or 1,
                   table_line=table_line, table_lines=table)


_TABLE_START = re.compile(r"\s*\[")
_LAYER_HEADER = re.compile(r'\s*\[+\s*layers\s*\.\s*(?:"([^"]*)"|([A-Za-z0-9_-]+))\s*[.\]]')
_OWN_TABLE_END = re.compile(r"\]\s*(?:#.*)?$")  # `[layers.NAME]` itself, not `[layers.NAME.args]`


def _read_lines(path: Path) -> list[str]:
    try:
        return configfile.read_text(path, str(path)).splitlines()
    except InputError:
        return []


def _table_lines(lines: list[str], table_line: int | None, name: str) -> tuple[tuple[int, str], ...]:
    """The header line and every line up to the next table that is not one of this layer's subtables."""
    if table_line is None:
        return ()
    own = re.compile(rf'^\s*\[+\s*layers\s*\.\s*"?{re.escape(name)}"?\s*[.\]]')
    out = [(table_line, lines[table_line - 1])] if table_line <= len(lines) else []
    for index in range(table_line, len(lines)):
        text = lines[index]
        if re.match(r"^\s*\[", text) and not own.match(text):
            break
        out.append((index + 1, text))
    return tuple(out)


_MULTILINE_START = re.compile(r'^\s*dockerfile\s*=\s*("""|\'\'\'|"|\')(.*)$')


def _inline_text_line(table: tuple[tuple[int, str], ...], text: str) -> int | None:
    for number, line in table:
        match = _MULTILINE_START.match(line)
        if match:
            quote, rest = match.groups()
            # TOML drops the newline right after an opening triple quote
            return number + 1 if len(quote) == 3 and not rest.strip() else number
    return None


def _find_key(table: tuple[tuple[int, str], ...], path: tuple[str, ...]) -> int | None:
    """`("base",)` matches `base = ...`; `("args", "X")` matches X inside `args = {...}` or [..args]."""
    if not path:
        return None
    head, rest = path[0], path[1:]
    key = re.compile(rf'^\s*"?{re.escape(head)}"?\s*=')
    sub = re.compile(rf'^\s*\[\s*layers\s*\.[^\]]*\.\s*"?{re.escape(head)}"?\s*\]')
    for position, (number, line) in enumerate(table):
        if key.match(line):
            if not rest:
                return number
            inner = re.compile(rf'(^|[{{,\s])"?{re.escape(rest[0])}"?\s*=')
            # an inline table may span lines until its closing brace
            for later_number, later in table[position:]:
                if inner.search(later.split("=", 1)[1] if later_number == number else later):
                    return later_number
                if "}" in later:
                    break
            return number
        if sub.match(line) and rest:
            inner_key = re.compile(rf'^\s*"?{re.escape(rest[0])}"?\s*=')
            for later_number, later in table[position + 1:]:
                if re.match(r"^\s*\[", later):
                    break
                if inner_key.match(later):
                    return later_number
            return number
    return None
