"""How commands write what they found: aligned tables for a person, JSON for a program.

Every command renders through these two, so all tables look alike and all JSON follows one
convention: keys sorted, two-space indent, `null` for a missing value, and ASCII only (other
characters as \\u escapes), so no terminal's or pipe's encoding can fail on a path or a log line.
Only `json` is imported, lazily, so `efabuild lookup` stays as cheap to start as it is.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any


def table(rows: Sequence[Sequence[str]], header: Sequence[str] | None = None, indent: str = "") -> str:
    """Left-aligned columns two spaces apart, each line indented; the last column is not padded,
    so no line ends in spaces."""
    all_rows = ([header] if header else []) + list(rows)
    if not all_rows:
        return ""
    widths = [max(len(row[i]) for row in all_rows) for i in range(len(all_rows[0]) - 1)]
    lines = []
    for row in all_rows:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])] + [row[-1]]
        lines.append((indent + "  ".join(cells)).rstrip())
    return "\n".join(lines)


def print_table(rows: Sequence[Sequence[str]], header: Sequence[str] | None = None, indent: str = "") -> None:
    text = table(rows, header, indent)
    if text:
        sys.stdout.write(text + "\n")


def to_json(data: Any) -> str:
    import json

    return json.dumps(data, indent=2, sort_keys=True)


def print_json(data: Any) -> None:
    sys.stdout.write(to_json(data) + "\n")
