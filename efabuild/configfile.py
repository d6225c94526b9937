"""Reading a config or graph file the user points at: a regular file of bounded size, as TOML,
and its tables read with their types checked.

Every BUILD.toml, graph, Dockerfile file and store.toml goes through `read_text`, so a path that
names a FIFO (which would block an open forever), a device (`/dev/zero` never ends), a directory or
a huge file is one InputError line, in bounded time and memory. Stdlib only: `efabuild lookup`
reads store.toml and BUILD.toml's [store] on its fast path.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from typing import Any

from efabuild.errors import InputError
from efabuild.grammar import platform_problem

MAX_CONFIG_BYTES = 4 * 1024 * 1024  # far above any real graph; small enough to read at once
# tomllib recurses once per nesting level of arrays and inline tables; real files nest a few deep
MAX_TOML_NESTING = 100
_TOML_LINE = re.compile(r"\(at line (\d+), column \d+\)")


def read_bytes(path: str | os.PathLike, where: str, limit: int = MAX_CONFIG_BYTES) -> bytes:
    """The contents of a regular file of at most `limit` bytes, else InputError naming `where`.

    Opened non-blocking so that a FIFO cannot hang the open; checked with fstat on the open
    descriptor (no race with a swapped path); read at most limit + 1 bytes, so a file that grows
    or lies about its size is still bounded.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise InputError("file not found", where) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", where) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"not a regular file ({_kind(st.st_mode)})", where)
        if st.st_size > limit:
            raise InputError(f"too large: {st.st_size} bytes (at most {_mib(limit)})", where)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise InputError(f"too large: more than {limit} bytes (at most {_mib(limit)})", where)
        return b"".join(chunks)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", where) from None
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike, where: str, limit: int = MAX_CONFIG_BYTES) -> str:
    data = read_bytes(path, where, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start})", where) from None


def parse_toml(text: str, where: str) -> dict[str, Any]:
    """TOML text as a dict; a syntax error names its line (`where:LINE: invalid TOML: ...`)."""
    depth = _nesting(text)
    if depth > MAX_TOML_NESTING:
        raise InputError(f"invalid TOML: arrays or inline tables nested {depth} deep "
                         f"(at most {MAX_TOML_NESTING})", where)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        line = _TOML_LINE.search(message)
        problem = _TOML_LINE.sub("", message).strip()
        raise InputError(f"invalid TOML: {problem}", f"{where}:{line.group(1)}" if line else where) from None
    except RecursionError:  # a nesting the scan above did not see; never a traceback
        raise InputError("invalid TOML: nested too deeply", where) from None


def load_toml(path: str | os.PathLike, where: str, missing: dict[str, Any] | None = None,
              limit: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """The file as TOML; `missing` (when given) stands for a file that does not exist."""
    if missing is not None and not os.path.lexists(path):
        return missing
    return parse_toml(read_text(path, where, limit), where)


def _nesting(text: str) -> int:
    """An upper bound of the nesting of `[` and `{` outside strings and comments (linear scan).

    Table headers (`[a]`, `[[a]]`) open and close on one line, so they count at most 2.
    """
    depth = deepest = 0
    index = 0
    while True:
        token = _TOKEN.search(text, index)
        if token is None:
            return deepest
        char = token.group()
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
            index = token.end()
        elif char in "]}":
            depth = max(depth - 1, 0)
            index = token.end()
        else:  # a comment or a string: skip to its end
            closing = REST_OF_TOKEN[char].match(text, token.end())
            index = closing.end() if closing else len(text)


_TOKEN = re.compile(r"""[\[\]{}#]|""\"|'''|"|'""")
# the rest of a comment or a string after its opening token; an unterminated one ends at its line's
# end (single-line strings) or at the end of the text: tomllib reports those. A multi-line string may
# end in one or two quotes of its own right before its closing three.
REST_OF_TOKEN = {
    "#": re.compile(r"[^\n]*"),
    '"""': re.compile(r'(?:[^"\\]|\\.|"(?!""))*(?:"{3,5}|$)', re.DOTALL),
    "'''": re.compile(r"(?:[^']|'(?!''))*(?:'{3,5}|$)", re.DOTALL),
    '"': re.compile(r'(?:[^"\\\n]|\\.)*"?'),
    "'": re.compile(r"[^'\n]*'?"),
}


class Table:
    """A TOML table and where it is (file and dotted path), for messages: typed reads, and unknown
    keys refused with a suggestion.

    An unknown key is named at its own place (`BUILD.toml: builder.jbos: unknown key ...`), or, with
    `unknown_at_table`, by the table (`BUILD.toml: store: unknown key 'shard' ...`).
    """

    def __init__(self, data: Any, file: str, dotted: str, known: tuple[str, ...],
                 unknown_at_table: bool = False) -> None:
        self.data, self.file, self.dotted = data, file, dotted
        if not isinstance(data, dict):
            raise InputError(f"must be a table, not {type_name(data)}", self.where())
        for key in data:
            if key not in known:
                if unknown_at_table:
                    check_known(key, known, self.where(), "key")
                raise InputError(f"unknown key{_suggestion(key, known)}", self.where(key))

    def where(self, key: str | None = None) -> str:
        """`file: dotted.key`, for a message about `key` (about the table itself without one)."""
        dotted = ".".join(part for part in (self.dotted, key) if part)
        return f"{self.file}: {dotted}" if dotted else self.file

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        if key not in self.data:
            return default
        value = self.data[key]
        if kind is int and isinstance(value, bool) or not isinstance(value, kind):
            expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise InputError(f"must be {_ARTICLES.get(expected, expected)}, not {type_name(value)}",
                             self.where(key))
        return value

    def str_list(self, key: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        values = self.get(key, list)
        if values is None:
            return default
        for value in values:
            if not isinstance(value, str):
                raise InputError(f"must be a list of strings, found {type_name(value)}", self.where(key))
        return tuple(values)

    def table(self, key: str, known: tuple[str, ...]) -> Table | None:
        if key not in self.data:
            return None
        return Table(self.data[key], self.file, ".".join(part for part in (self.dotted, key) if part), known)


def type_name(value: Any) -> str:
    """How a message names a TOML value's type: `must be a string, not an integer`."""
    return {dict: "a table", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
            float: "a float"}.get(type(value)) or _TOML_DATES.get(type(value).__name__, type(value).__name__)


# TOML's date and time values, as tomllib returns them (datetime's classes, named to spare its import)
_TOML_DATES = {"date": "a date", "datetime": "a date-time", "time": "a time"}


_ARTICLES = {"str": "a string", "int": "an integer", "bool": "a boolean", "list": "an array", "dict": "a table"}


def check_known(value: str, known: tuple[str, ...], where: str, what: str) -> None:
    """InputError `unknown WHAT 'value' (did you mean ...?)` unless `value` is one of `known`."""
    if value not in known:
        raise InputError(f"unknown {what} {value!r}{_suggestion(value, known)}", where)


def _suggestion(value: str, known: tuple[str, ...]) -> str:
    import difflib  # only for a message: lookup's fast path never pays for it

    hint = difflib.get_close_matches(str(value), known, n=1)
    return f" (did you mean '{hint[0]}'?)" if hint else f" (known: {', '.join(known)})"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"


def _mib(limit: int) -> str:
    return f"{limit // (1024 * 1024)} MiB" if limit % (1024 * 1024) == 0 else f"{limit} bytes"


def platform_list(t: Table, key: str, allowed: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """A non-empty list of os/arch[/variant] platforms, no repeats; with `allowed`, a subset of it.
    Also a graph's and a layer's `platforms` (workspace.py)."""
    values = t.str_list(key)
    if not values:
        raise InputError("an empty list: name at least one platform, like \"linux/amd64\"", t.where(key))
    for value in values:
        problem = platform_problem(value)
        if problem:
            raise InputError(f"{value[:40]!r}{'…' if len(value) > 40 else ''}: {problem}", t.where(key))
        if allowed is not None and value not in allowed:
            raise InputError(f"{value!r} is not one of the workspace's [builder] platforms "
                             f"({', '.join(allowed)})", t.where(key))
    if len(set(values)) != len(values):
        raise InputError("names a platform twice", t.where(key))
    return tuple(values)


def builder_platforms(t: Table, default: str) -> tuple[str, ...]:
    """[builder] `platforms = [...]`, or the older `platform = "..."` as a list of one; never both."""
    if "platform" in t.data and "platforms" in t.data:
        raise InputError("set platform or platforms, not both (platform = \"x\" is platforms = [\"x\"])",
                         t.where("platforms"))
    if "platform" in t.data:
        value = t.get("platform", str)
        problem = platform_problem(value)
        if problem:
            raise InputError(problem, t.where("platform"))
        platforms, key = (value,), "platform"
    elif "platforms" in t.data:
        platforms, key = platform_list(t, "platforms"), "platforms"
    else:
        return (default,)
    other = next((p for p in platforms if not p.startswith("linux/")), None)
    if other is not None:  # else QEMU is offered for it, and BuildKit fails on the base
        raise InputError(f"{other!r}: an Enroot image is a Linux root filesystem: name linux/ platforms only",
                         t.where(key))
    return platforms
