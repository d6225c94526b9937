"""tomlkeys: the line where each table and key of a TOML file is defined.

Generated documents are written line by line while noting where each key goes, so the expected
lines come from the writer, not from a second scanner; tomllib checks every document is TOML.
"""

from __future__ import annotations

import pytest

import tomllib

from hypothesis import given, settings
from hypothesis import strategies as st

from efabuild.tomlkeys import KeyLine, key_line, key_lines

# Lines a Dockerfile (or any string) may hold that look like TOML: never keys of the file.
LOOKALIKES = ("[layers.fake]", "[[layers.fake.ignore]]", "base = \"x\"", "fake = { a = 1 }", "# a comment",
              "RUN echo [x] {y}", "ENV A=1 B='2'", "", "  indented = 3")
SCALARS = ('1', 'true', '"s"', "'lit'", '1979-05-27 07:32:00Z', '-0.5', '"a # not a comment"', "'''x'''")


class Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.expected: dict[tuple[str, ...], KeyLine] = {}
        self.implied: dict[tuple[str, ...], KeyLine] = {}

    @property
    def next_line(self) -> int:
        return len(self.lines) + 1

    def define(self, path: tuple[str, ...], line: int, text_line: int | None = None) -> None:
        self.expected[path] = KeyLine(line, text_line or line)
        for end in range(1, len(path)):
            self.implied.setdefault(path[:end], KeyLine(line, line))

    def want(self) -> dict[tuple[str, ...], KeyLine]:
        return {**self.implied, **self.expected}


@st.composite
def values(draw, writer: Writer, path: tuple[str, ...], key: str) -> None:
    """One `key = value` statement of one of the shapes a graph file uses, written to `writer`."""
    line = writer.next_line
    shape = draw(st.sampled_from(["scalar", "multiline", "same-line-multiline", "inline", "array",
                                  "multiline-array", "dotted"]))
    body = draw(st.lists(st.sampled_from(LOOKALIKES), min_size=1, max_size=4))
    if shape == "scalar":
        writer.lines.append(f"{key} = {draw(st.sampled_from(SCALARS))}")
        writer.define((*path, key), line)
    elif shape == "multiline":
        quote = draw(st.sampled_from(["'''", '"""']))
        writer.lines += [f"{key} = {quote}", *body, quote]
        writer.define((*path, key), line, line + 1)
    elif shape == "same-line-multiline":
        writer.lines += [f"{key} = '''{body[0] or 'RUN true'}", *body[1:], "'''"]
        writer.define((*path, key), line, line)
    elif shape == "inline":
        writer.lines.append(f'{key} = {{ a = 1, "b" = "{{x}}", c = [1, 2] }}')
        writer.define((*path, key), line)
        for inner in ("a", "b", "c"):
            writer.define((*path, key, inner), line)
    elif shape == "array":
        writer.lines.append(f'{key} = [{{ rule = "EFA001", reason = "[x]" }}, ]')
        writer.define((*path, key), line)
    elif shape == "multiline-array":
        writer.lines += [f"{key} = [", '  "a", # ] not the end', "  { z = 1 },", "]"]
        writer.define((*path, key), line)
    else:
        writer.lines.append(f"{key}.sub = 2")
        writer.define((*path, key, "sub"), line)
    if draw(st.booleans()):
        writer.lines.append(draw(st.sampled_from(["", "# [layers.commented]", "   "])))


@st.composite
def documents(draw) -> Writer:
    writer = Writer()
    for key in draw(st.lists(st.sampled_from(["title", "version"]), unique=True)):
        draw(values(writer, (), key))
    names = draw(st.lists(st.sampled_from(["user", "efa", "deep-ep", "a.b", "x y"]), min_size=1, unique=True))
    for name in names:
        quoted = draw(st.booleans()) or not name.replace("-", "").isalnum()
        shown = f'"{name}"' if quoted else name
        style = draw(st.sampled_from(["header", "spaced header", "subtable only", "array of tables"]))
        if style == "subtable only":  # [layers.NAME] only implied by its subtable
            writer.lines.append(f"[layers.{shown}.args]")
            writer.define(("layers", name, "args"), writer.next_line - 1)
            draw(values(writer, ("layers", name, "args"), "CUDA"))
            continue
        line = writer.next_line
        writer.lines.append({"header": f"[layers.{shown}]", "spaced header": f"[ layers . {shown} ]  # [x]",
                             "array of tables": f"[[layers.{shown}]]"}[style])
        writer.define(("layers", name), line)
        keys = draw(st.lists(st.sampled_from(["base", "dockerfile", "args", "ignore", "secrets"]), unique=True))
        for key in keys:
            draw(values(writer, ("layers", name), key))
    return writer


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(documents())
def test_every_key_is_found_on_the_line_it_was_written(writer):
    text = "\n".join(writer.lines) + "\n"
    tomllib.loads(text)  # the generator writes TOML
    key_lines.cache_clear()
    found = key_lines(text)
    want = writer.want()
    assert {path: found.get(path) for path in want} == want
    # nothing from inside a string or a comment is taken for a key
    assert not [path for path in found if "fake" in path or "commented" in path or "indented" in path]


def test_inline_dockerfile_text_starts_below_quotes_that_end_their_line():
    text = "[layers.a]\nbase = 'x'\ndockerfile = '''\nRUN true\n'''\n[layers.b]\ndockerfile = '''RUN a\nRUN b'''\n"
    assert key_line(text, ("layers", "a", "dockerfile")) == KeyLine(3, 4)
    assert key_line(text, ("layers", "b", "dockerfile")) == KeyLine(7, 7)
    assert key_line(text, ("layers", "b")) == KeyLine(6, 6)
    assert key_line(text, ("layers", "c")) is None


def test_the_first_definition_and_an_explicit_header_win():
    text = ("[layers.a.args]\nX = '1'\n[layers.a]\nbase = 'x'\n"
            "[[layers.a.ignore]]\nrule = 'A'\n[[layers.a.ignore]]\nrule = 'B'\n")
    tomllib.loads(text)
    assert key_line(text, ("layers", "a")).line == 3  # not the subtable that implied it first
    assert key_line(text, ("layers", "a", "ignore")).line == 5
    assert key_line(text, ("layers", "a", "ignore", "rule")).line == 6


def test_text_that_stops_being_toml_keeps_what_came_before():
    text = "[layers.a]\nbase = 'x'\nthis is not toml\n[layers.b]\n"
    assert key_line(text, ("layers", "a", "base")) == KeyLine(2, 2)
    assert key_line(text, ("layers", "b")) is None
    for broken in ("[layers.a", "a = ", "a = [1, 2", "a = {b = 1", "= 1", "a = '''open", "[" * 10_000):
        key_lines(broken)  # never raises nor recurses without bound
