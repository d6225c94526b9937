"""A small POSIX-shell reader: enough to see which commands a `RUN` line or a job script runs.

It splits a script into simple commands on `&&`, `||`, `;`, `|`, `&`, newlines and parentheses,
removes quotes, and expands `$VAR` / `${VAR}` / `${VAR:-default}` from a lookup. Unknown variables
stay as written (`${LD_LIBRARY_PATH}`), so a rule can still see where they were used. Assignments
that stand alone (`X=1`, `export X=1`) are remembered for the commands that follow.
Not a full shell: no globbing, arithmetic, functions or command substitution (kept literally).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import NamedTuple


Lookup = Callable[[str], "str | None"]

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)

# words that start or end a compound command but are not the program run
# (`fi`, `done`, `}` end up as commands of their own: they follow a `;` or a newline)
_LEADING_KEYWORDS = {"then", "else", "elif", "do", "if", "while", "until", "!", "time", "{", "(", "exec",
                     "nohup", "command", "fi", "done", "}", "esac"}
_SUDO_OPTIONS_WITH_VALUE = {"-u", "-g", "-C", "-h", "-p", "-r", "-t", "-U"}


class Command(NamedTuple):
    """One simple command: its words after expansion, the assignments before it, where it starts."""

    words: tuple[str, ...]  # every word as written (expanded, unquoted), assignments included
    argv: tuple[str, ...]  # the program and its arguments: no assignments, sudo/env, or keywords
    assigns: tuple[tuple[str, str], ...]  # `A=1 B=2 cmd` and `env A=1 cmd` prefixes
    offset: int  # where the command starts in the script text
    text: str  # the command's source text, as written

    @property
    def program(self) -> str:
        """The program's base name (`./efa_installer.sh` -> `efa_installer.sh`), or ''."""
        return self.argv[0].rsplit("/", 1)[-1] if self.argv else ""


class _Reader:
    def __init__(self, script: str, lookup: Lookup, local: dict[str, str]) -> None:
        self.s = script
        self.i = 0
        self.lookup = lookup
        self.local = local
        # what commands() has read so far
        self.out: list[Command] = []
        self.words: list[str] = []  # the current command's words
        self.word: list[str] = []  # pieces of the current word
        self.in_word = False
        self.cmd_start = -1  # where the current command starts, -1 before it does

    def value_of(self, name: str) -> str | None:
        if name in self.local:
            return self.local[name]
        return self.lookup(name)

    # --- expansions -------------------------------------------------------------------------

    def dollar(self) -> str:
        """Read a `$...` at self.i (pointing at `$`) and return its expansion or literal text."""
        s, start = self.s, self.i
        nxt = s[start + 1] if start + 1 < len(s) else ""
        if nxt == "{":
            end = _matching(s, start + 1, "{", "}")
            if end < 0:
                self.i = len(s)
                return s[start:]
            self.i = end + 1
            return self.braced(s[start + 2:end], s[start:end + 1])
        if nxt == "(":
            end = _matching(s, start + 1, "(", ")")
            self.i = len(s) if end < 0 else end + 1
            return s[start:self.i]  # command substitution: kept literally
        match = NAME.match(s, start + 1)
        if match:
            self.i = match.end()
            value = self.value_of(match.group(0))
            return s[start:self.i] if value is None else value
        self.i = start + 1 + (1 if nxt and nxt in "@*#?$!-0123456789" else 0)
        return s[start:self.i]

    def braced(self, inner: str, literal: str) -> str:
        match = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-=+?])(.*))?$", inner, re.DOTALL)
        if not match:
            return literal
        name, op, word = match.groups()
        value = self.value_of(name)
        if op is None:
            return literal if value is None else value
        unset = value is None or (op.startswith(":") and value == "")
        if op.endswith(("-", "=")):
            return _expand_word(word, self) if unset else value
        if op.endswith("+"):
            return "" if unset else _expand_word(word, self)
        return literal if value is None else value  # ${X:?msg}

    # --- words and commands -------------------------------------------------------------------

    # --- commands -----------------------------------------------------------------------------

    def commands(self) -> list[Command]:
        """The script's simple commands, in order (read once per reader)."""
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if self.cmd_start < 0 and not c.isspace() and c not in ";&|()":
                self.cmd_start = self.i
            if c == "\\" and s[self.i + 1:self.i + 2] == "\n":
                self.i += 2  # line continuation
            elif c in "\\'\"$`":
                self.add(self.quoted(c))
            elif c == "#" and not self.in_word:
                end = s.find("\n", self.i)
                self.i = len(s) if end < 0 else end
            elif c in " \t\r":
                self.end_word()
                self.i += 1
            elif c in "\n;()":
                self.end_command(self.i)
                self.i += 1
            elif c in "&|":
                self.operator(c)
            else:
                self.add(c)
                self.i += 1
        self.end_command(len(s))
        return self.out

    def add(self, text: str) -> None:
        self.word.append(text)
        self.in_word = True

    def end_word(self) -> None:
        if self.in_word:
            self.words.append("".join(self.word))
        self.word, self.in_word = [], False

    def end_command(self, at: int) -> None:
        self.end_word()
        if self.words:
            command = _command(self.words, self.cmd_start, self.s[self.cmd_start:at].strip())
            if command is not None:
                self.out.append(command)
                self.remember(command)
        self.words, self.cmd_start = [], -1

    def quoted(self, c: str) -> str:
        """Read an escape, a quoted string, an expansion or a backquoted command at self.i."""
        s = self.s
        if c == "\\":
            self.i += 2
            return s[self.i - 1:self.i]
        if c == '"':
            return self.double_quoted()
        if c == "$":
            return self.dollar()
        end = s.find(c, self.i + 1)  # ' or `
        end = len(s) if end < 0 else end
        text = s[self.i + 1:end] if c == "'" else s[self.i:end + 1]  # a backquoted command stays as written
        self.i = end + 1
        return text

    def operator(self, c: str) -> None:
        """`&&`, `||`, `|` and `&` end a command; `2>&1` and `&>` belong to a word."""
        s = self.s
        if c == "&" and self.word and self.word[-1].endswith((">", "<")):
            self.word.append(c)  # 2>&1
            self.i += 1
        elif c == "&" and s[self.i + 1:self.i + 2] == ">":
            self.add("&>")  # &> file
            self.i += 2
        else:
            self.end_command(self.i)
            self.i += 2 if s[self.i + 1:self.i + 2] == c else 1

    def double_quoted(self) -> str:
        s = self.s
        self.i += 1
        out: list[str] = []
        while self.i < len(s) and s[self.i] != '"':
            c = s[self.i]
            if c == "\\" and self.i + 1 < len(s) and s[self.i + 1] in '$`"\\\n':
                if s[self.i + 1] != "\n":
                    out.append(s[self.i + 1])
                self.i += 2
            elif c == "$":
                out.append(self.dollar())
            else:
                out.append(c)
                self.i += 1
        self.i += 1
        return "".join(out)

    def remember(self, command: Command) -> None:
        """`X=1` alone, or `export X=1`, sets X for the commands that follow."""
        if not command.argv:
            for name, value in command.assigns:
                self.local[name] = value
        elif command.argv[0] in ("export", "declare", "typeset", "readonly"):
            for word in command.argv[1:]:
                match = ASSIGNMENT.match(word)
                if match:
                    self.local[match.group(1)] = match.group(2)


def _matching(s: str, open_at: int, open_c: str, close_c: str) -> int:
    depth = 0
    for j in range(open_at, len(s)):
        if s[j] == open_c:
            depth += 1
        elif s[j] == close_c:
            depth -= 1
            if depth == 0:
                return j
    return -1


def _expand_word(word: str, reader: _Reader) -> str:
    inner = _Reader(word, reader.lookup, dict(reader.local))
    return " ".join(w for command in inner.commands() for w in command.words)


def _command(words: list[str], offset: int, text: str) -> Command | None:
    rest = list(words)
    while rest and rest[0] in _LEADING_KEYWORDS:
        rest.pop(0)
    assigns: list[tuple[str, str]] = []
    while True:
        while rest and ASSIGNMENT.match(rest[0]):
            name, value = ASSIGNMENT.match(rest[0]).groups()
            assigns.append((name, value))
            rest.pop(0)
        if rest and rest[0] in ("sudo", "env"):
            wrapper = rest.pop(0)
            while rest and rest[0].startswith("-"):
                option = rest.pop(0)
                if wrapper == "sudo" and option in _SUDO_OPTIONS_WITH_VALUE and rest:
                    rest.pop(0)
            continue
        break
    if not rest and not assigns:
        return None
    return Command(words=tuple(words), argv=_without_redirections(rest), assigns=tuple(assigns),
                   offset=max(offset, 0), text=text.rstrip(" \t\\"))


_REDIRECT_ALONE = re.compile(r"^\d*(>>|>\||>|<<<|<|&>>|&>|>&|<&)$")
_REDIRECT_JOINED = re.compile(r"^\d*(>>|>\||>|<<<|<|&>>|&>|>&|<&)\S")


def _without_redirections(words: list[str]) -> tuple[str, ...]:
    out: list[str] = []
    skip_next = False
    for word in words:
        if skip_next:
            skip_next = False
        elif _REDIRECT_ALONE.match(word):
            skip_next = True
        elif not _REDIRECT_JOINED.match(word):
            out.append(word)
    return tuple(out)


def no_lookup(_name: str) -> str | None:
    return None


def split_commands(script: str, lookup: Lookup = no_lookup,
                   local: dict[str, str] | None = None) -> list[Command]:
    """The simple commands of `script`, in order, expanded with `lookup` (unknown stay literal).

    `local` (if given) receives the variables the script assigns, so a caller can carry them on.
    """
    return _Reader(script, lookup, {} if local is None else local).commands()


def split_words(text: str, lookup: Lookup = no_lookup) -> list[str]:
    """Shell words of one line (quotes removed, variables expanded), e.g. for `ENV A=1 B="x y"`."""
    reader = _Reader(text.replace("\n", " "), lookup, {})
    words: list[str] = []
    for command in reader.commands():
        words.extend(command.words)
    return words


def lookup_in(*maps: Mapping[str, str]) -> Lookup:
    """A lookup that tries each mapping in turn."""

    def lookup(name: str) -> str | None:
        for mapping in maps:
            if name in mapping:
                return mapping[name]
        return None

    return lookup
