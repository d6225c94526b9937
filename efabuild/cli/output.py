"""How commands write what they found: aligned tables for a person, JSON for a program.

Every command renders through these two, so all tables look alike and all JSON follows one
convention (docs/reference/json.md): one object whose `format` names what it is and its version
(`efabuild.<what>/v1`), keys sorted, two-space indent, `null` for a missing value (never ""),
the same names for the same things: `name` (GRAPH:LAYER), `key`, `path` (a .sqsh); and ASCII
only (other characters as \\u escapes), so no terminal's or pipe's encoding can fail on a path
or a log line.
It imports only `json` and efabuild.display, which every command has loaded already.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from efabuild.display import as_utf8, shown


def table(rows: Sequence[Sequence[str]], header: Sequence[str] | None = None, indent: str = "",
          paint: Callable[[str], str] | None = None, painted: int | None = None) -> str:
    """Left-aligned columns two spaces apart, each line indented; the last column is not padded,
    so no line ends in spaces. `paint` colours the padded cells of column `painted` (not the
    header): widths are counted before any colour."""
    all_rows = ([header] if header else []) + [[_printable(cell) for cell in row] for row in rows]
    if not all_rows:
        return ""
    widths = [max(len(row[i]) for row in all_rows) for i in range(len(all_rows[0]) - 1)]
    lines = []
    for number, row in enumerate(all_rows):
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])] + [row[-1]]
        if paint is not None and painted is not None and (number or not header):
            cells[painted] = paint(cells[painted])
        lines.append((indent + "  ".join(cells)).rstrip())
    return "\n".join(lines)


def _printable(cell: str) -> str:
    """A cell as a terminal shows it: a control character from a file or log line escaped."""
    if cell.isprintable():
        return cell
    return shown(cell)


def print_table(rows: Sequence[Sequence[str]], header: Sequence[str] | None = None, indent: str = "") -> None:
    text = table(rows, header, indent)
    if text:
        sys.stdout.write(text + "\n")


FORMAT_VERSION = 1


def document(what: str, data: dict, verbatim: tuple[str, ...] = ()) -> dict:
    """`data` as a versioned efabuild document, "" made null; the `verbatim` fields hold stored
    documents of their own (a provenance manifest), shown exactly as stored."""
    kept = {name: data[name] for name in verbatim if name in data}
    return {"format": f"efabuild.{what}/v{FORMAT_VERSION}", **nulled(data), **kept}


def nulled(data: Any) -> Any:
    """Every empty-string value of a mapping, at any depth, as None: a missing value is null. A
    byte that is not UTF-8 in a name read from a disk or an image is written `\\xNN`, never as
    a lone surrogate escape that strict JSON parsers refuse."""
    if isinstance(data, dict):
        return {_utf8(key): None if value == "" else nulled(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [nulled(item) for item in data]
    return _utf8(data)


def _utf8(value: Any) -> Any:
    if isinstance(value, str) and not value.isascii():
        return as_utf8(value)
    return value


def to_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True)


def compact_json(data: Any) -> str:
    """One line: a progress event."""
    return json.dumps(nulled(data), sort_keys=True, separators=(",", ":"))


def print_json(what: str, data: dict, verbatim: tuple[str, ...] = ()) -> None:
    """Print `data` as the document `efabuild.<what>/v1`."""
    sys.stdout.write(to_json(document(what, data, verbatim)) + "\n")


def print_foreign_json(data: Any) -> None:
    """A document in a format others define (SARIF, in-toto): printed as that format has it."""
    sys.stdout.write(to_json(data) + "\n")
