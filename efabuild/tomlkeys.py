"""Where a key is defined in TOML text: the line a message or a lint finding points at.

tomllib gives values, not positions, so the text is scanned once into an index of every table
header and key: `("layers", "user")` is the `[layers.user]` header (or a `user = {...}` line),
`("layers", "user", "args", "CUDA")` the line setting CUDA in an inline `args = {...}`, a dotted
`args.CUDA =` or an `[layers.user.args]` table. String contents are skipped, so Dockerfile text
that looks like TOML is never taken for a key. Pure: it reads no file.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from efabuild.configfile import MAX_TOML_NESTING, REST_OF_TOKEN


class KeyLine(NamedTuple):
    line: int  # the line of the [table] header or of `key =`
    # where the value's text begins: a multi-line string whose opening quotes end their line starts
    # on the next one (TOML drops that newline)
    text_line: int


def key_line(text: str, path: Sequence[str]) -> KeyLine | None:
    """Where `path` is defined in TOML `text`, or None. A table that only a subtable's header
    implies (`[layers.user.args]` without `[layers.user]`) is located at that header."""
    return key_lines(text).get(tuple(path))


@functools.lru_cache(maxsize=16)
def key_lines(text: str) -> Mapping[tuple[str, ...], KeyLine]:
    """Every table and key of `text` and where it is defined (the first definition), in one pass.

    Text that stops being TOML ends the scan: what came before it is still indexed.
    """
    scanner = _Scanner(text)
    try:
        scanner.scan()
    except _NotToml:
        pass
    return {**scanner.implied, **scanner.defined}


_BLANK = re.compile(r"(?:[ \t\r\n]|#[^\n]*)*")  # whitespace, line ends and comments
_SPACE = re.compile(r"[ \t]*")
_KEY_PART = re.compile(r"""[ \t]*(?:([A-Za-z0-9_-]+)|"((?:[^"\\\n]|\\.)*)"|'([^'\n]*)')[ \t]*""")
# a number, boolean or date (whose time may follow a space): up to the next separator
_SCALAR = re.compile(r"\d{4}-\d\d-\d\d \d\d:[^,\]}#\s]*|[^,\]}#\s]+")


class _NotToml(Exception):
    """The text stops being TOML here."""


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text = text
        self.line_ends = [match.start() for match in re.finditer("\n", text)]
        self.defined: dict[tuple[str, ...], KeyLine] = {}
        self.implied: dict[tuple[str, ...], KeyLine] = {}

    def line_at(self, pos: int) -> int:
        return bisect.bisect_left(self.line_ends, pos) + 1

    def scan(self) -> None:
        text, pos, table = self.text, 0, ()
        while True:
            pos = _BLANK.match(text, pos).end()
            if pos >= len(text):
                return
            line = self.line_at(pos)
            if text.startswith("[", pos):  # [table] or [[array of tables]]
                brackets = 2 if text.startswith("[[", pos) else 1
                table, pos = self.key(pos + brackets)
                if not text.startswith("]" * brackets, pos):
                    raise _NotToml
                self.define(table, line, line)
                pos += brackets
            else:
                key, pos = self.key(pos)
                if not text.startswith("=", pos):
                    raise _NotToml
                pos = self.value(table + key, line, pos + 1, 0)

    def key(self, pos: int) -> tuple[tuple[str, ...], int]:
        """A dotted key at `pos` as its parts, and where it ends."""
        parts = []
        while True:
            match = _KEY_PART.match(self.text, pos)
            if match is None:
                raise _NotToml
            parts.append(match.group(match.lastindex))  # the one alternative that matched
            pos = match.end()
            if not self.text.startswith(".", pos):
                return tuple(parts), pos
            pos += 1

    def value(self, path: tuple[str, ...] | None, line: int, pos: int, depth: int) -> int:
        """Skip the value at `pos`, defining `path` (None inside arrays); where the value ends."""
        text = self.text
        pos = _SPACE.match(text, pos).end()
        opening = text[pos:pos + 3] if text.startswith(('"""', "'''"), pos) else text[pos:pos + 1]
        if opening and opening in REST_OF_TOKEN and opening != "#":
            start = pos + len(opening)
            starts_below = len(opening) == 3 and text.startswith(("\n", "\r\n"), start)
            text_start = text.index("\n", start) + 1 if starts_below else start
            self.define(path, line, self.line_at(text_start))
            return REST_OF_TOKEN[opening].match(text, start).end()
        self.define(path, line, line)
        if depth > MAX_TOML_NESTING:
            raise _NotToml
        if opening == "{":
            return self.inline_table(path, pos + 1, depth + 1)
        if opening == "[":
            return self.array(pos + 1, depth + 1)
        match = _SCALAR.match(text, pos)
        if match is None:
            raise _NotToml
        return match.end()

    def inline_table(self, path: tuple[str, ...] | None, pos: int, depth: int) -> int:
        text = self.text
        while True:
            pos = _BLANK.match(text, pos).end()
            if text.startswith("}", pos):
                return pos + 1
            line = self.line_at(pos)
            key, pos = self.key(pos)
            if not text.startswith("=", pos):
                raise _NotToml
            pos = _BLANK.match(text, self.value(None if path is None else path + key, line, pos + 1, depth)).end()
            if text.startswith(",", pos):
                pos += 1
            elif not text.startswith("}", pos):
                raise _NotToml

    def array(self, pos: int, depth: int) -> int:
        text = self.text
        while True:
            pos = _BLANK.match(text, pos).end()
            if text.startswith("]", pos):
                return pos + 1
            if pos >= len(text):
                raise _NotToml
            pos = _BLANK.match(text, self.value(None, 0, pos, depth)).end()
            if text.startswith(",", pos):
                pos += 1
            elif not text.startswith("]", pos):
                raise _NotToml

    def define(self, path: tuple[str, ...] | None, line: int, text_line: int) -> None:
        if path is None:
            return
        if path not in self.defined:
            self.defined[path] = KeyLine(line, text_line)
        table = path[:-1]  # and the tables it implies, unless an earlier key implied them already
        while table and table not in self.implied:
            self.implied[table] = KeyLine(line, line)
            table = table[:-1]
