"""A small Dockerfile reader: instructions with their line numbers, and what each one does.

`parse` turns text into instructions (line continuations joined, comments dropped, heredocs
collected). `evaluate` walks them the way BuildKit would for one layer: build args (`ARG`, with
the graph's values overriding defaults), `ENV` (inherited from the parent layers and carried on),
and every `RUN` split into simple commands with variables expanded. Line numbers are 1-based
lines of the text given; callers map them to the graph or Dockerfile file.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Mapping
from typing import NamedTuple

from rpds import HashTrieMap

from efabuild.lint.shell import Command, lookup_in, split_commands, split_words

_INSTRUCTION = re.compile(r"^\s*([A-Za-z]+)(?:\s+|$)(.*)$", re.DOTALL)
_CONTINUATION = re.compile(r"\\[ \t]*$")
_HEREDOC = re.compile(r"<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
_HEREDOC_KEYWORDS = {"RUN", "COPY", "ADD"}


class Heredoc(NamedTuple):
    name: str
    body: str
    line: int  # line of the body's first line


class Instruction(NamedTuple):
    keyword: str  # upper case: RUN, ENV, ARG, ...
    value: str  # the text after the keyword, continuation lines joined
    line: int  # line of the keyword
    end_line: int
    # (offset in value, line): where each joined physical line starts, to map offsets back to lines
    segments: tuple[tuple[int, int], ...] = ()
    heredocs: tuple[Heredoc, ...] = ()

    def line_at(self, offset: int) -> int:
        starts = [start for start, _ in self.segments]
        index = bisect.bisect_right(starts, offset) - 1
        return self.segments[max(index, 0)][1] if self.segments else self.line


def parse(text: str) -> tuple[Instruction, ...]:
    lines = text.splitlines()
    out: list[Instruction] = []
    i = 0
    while i < len(lines):
        raw = lines[i]
        if not raw.strip() or raw.lstrip().startswith("#"):
            i += 1
            continue
        match = _INSTRUCTION.match(raw)
        if not match:  # not an instruction: leave it to BuildKit to complain
            i += 1
            continue
        keyword, value = match.group(1).upper(), match.group(2)
        start = i
        segments = [(0, i + 1)]
        while _CONTINUATION.search(value) and i + 1 < len(lines):
            value = _CONTINUATION.sub("", value)
            i += 1
            # comment and empty lines inside a continued instruction are dropped by BuildKit
            while i < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith("#")):
                i += 1
            if i >= len(lines):
                break
            segments.append((len(value), i + 1))
            value += lines[i]
        value = _CONTINUATION.sub("", value)
        heredocs: list[Heredoc] = []
        if keyword in _HEREDOC_KEYWORDS:
            for dash, _quote, name in _HEREDOC.findall(value):
                body_start = i + 1
                body: list[str] = []
                i += 1
                while i < len(lines) and (lines[i].strip() if dash else lines[i]) != name:
                    body.append(lines[i].lstrip("\t") if dash else lines[i])
                    i += 1
                heredocs.append(Heredoc(name=name, body="\n".join(body), line=body_start + 1))
        out.append(Instruction(keyword=keyword, value=value, line=start + 1, end_line=i + 1,
                               segments=tuple(segments), heredocs=tuple(heredocs)))
        i += 1
    return tuple(out)


# --- evaluation -------------------------------------------------------------------------------


class ArgDecl(NamedTuple):
    name: str
    value: str | None  # the graph's build arg, else the default, else None
    line: int
    from_graph: bool  # the value comes from the graph's `args`


class EnvSet(NamedTuple):
    name: str
    value: str  # expanded; unknown variables left as `${NAME}`
    raw: str  # as written
    line: int


class RunCommand(NamedTuple):
    command: Command
    line: int  # line of the command itself, not of the RUN keyword
    run_line: int  # line of the RUN keyword
    run_index: int  # which RUN of the layer (0-based): commands of one RUN share it


class Evaluated(NamedTuple):
    instructions: tuple[Instruction, ...]
    args: tuple[ArgDecl, ...]
    envs: tuple[EnvSet, ...]
    runs: tuple[RunCommand, ...]
    env_after: Mapping[str, str]  # the image environment after this layer

    def arg(self, name: str) -> ArgDecl | None:
        found = [a for a in self.args if a.name == name]
        return found[-1] if found else None


def evaluate(text: str, build_args: Mapping[str, str] | None = None,
             env_before: Mapping[str, str] | None = None) -> Evaluated:
    """Walk a layer's Dockerfile text as one build would, starting from the parent's environment."""
    build_args = dict(build_args or {})
    # a persistent map: a child layer starts from its parent's environment without copying it, so
    # a chain of n layers that each set an ENV costs O(n log n), not O(n²) time and memory
    env: HashTrieMap = env_before if isinstance(env_before, HashTrieMap) else HashTrieMap(env_before or {})
    arg_values: dict[str, str] = {}
    args: list[ArgDecl] = []
    envs: list[EnvSet] = []
    runs: list[RunCommand] = []
    instructions = parse(text)
    run_index = 0
    for ins in instructions:
        lookup = lookup_in(env, arg_values)  # ENV wins over ARG of the same name, as in BuildKit
        if ins.keyword == "ARG":
            for word in split_words(ins.value):
                name, _, default = word.partition("=")
                has_default = "=" in word
                if name in build_args:
                    value, from_graph = build_args[name], True
                else:
                    value = _expand(default, lookup) if has_default else None
                    from_graph = False
                if value is not None:
                    arg_values[name] = value
                args.append(ArgDecl(name=name, value=value, line=ins.line, from_graph=from_graph))
        elif ins.keyword == "ENV":
            for name, raw, value in _env_pairs(ins.value, lookup):
                envs.append(EnvSet(name=name, value=value, raw=raw, line=ins.line))
                env = env.insert(name, value)
        elif ins.keyword == "RUN":
            for command, line in run_commands(ins, lookup):
                runs.append(RunCommand(command=command, line=line, run_line=ins.line, run_index=run_index))
            run_index += 1
    return Evaluated(instructions=instructions, args=tuple(args), envs=tuple(envs), runs=tuple(runs),
                     env_after=env)


def run_commands(ins: Instruction, lookup) -> list[tuple[Command, int]]:
    """The commands of a RUN with the line each starts on (shell form, exec form or heredoc)."""
    value = ins.value
    # RUN --mount=... --network=... flags come before the command
    flags = re.match(r"^(\s*--[A-Za-z-]+(?:=(?:\"[^\"]*\"|\S+))?)*\s*", value)
    offset = flags.end() if flags else 0
    body = value[offset:]
    if body.startswith("["):
        try:
            argv = json.loads(body)
        except (ValueError, RecursionError):  # not an exec form after all: read as a shell line
            argv = None
        if isinstance(argv, list) and all(isinstance(a, str) for a in argv):
            if len(argv) >= 3 and _is_shell(argv[0]) and "-c" in argv[1:-1]:
                # ["bash", "-c", "script"]: the script is what runs
                return [(command, ins.line) for command in split_commands(argv[-1], lookup, {})]
            command = Command(words=tuple(argv), argv=tuple(argv), assigns=(), offset=offset, text=body)
            return [(command, ins.line)]
    out: list[tuple[Command, int]] = []
    local: dict[str, str] = {}
    for heredoc in ins.heredocs:
        # `<<EOF` alone, or a shell reading the script from it: `bash -ex <<'EOF'`
        redirect = rf"<<-?[\"']?{re.escape(heredoc.name)}[\"']?\s*$"
        feeds_shell = re.match(rf"^(?:\S*/)?(?:ba)?sh(?:\s+-[A-Za-z]+)*\s*{redirect}", body.strip())
        if re.match(rf"^{redirect}", body.strip()) or feeds_shell:
            body_lines = heredoc.body.split("\n")
            starts = [0]
            for piece in body_lines[:-1]:
                starts.append(starts[-1] + len(piece) + 1)
            for command in split_commands(heredoc.body, lookup, local):
                index = bisect.bisect_right(starts, command.offset) - 1
                out.append((command, heredoc.line + index))
            return out
    for command in split_commands(body, lookup, local):
        out.append((command, ins.line_at(offset + command.offset)))
    return out


def _is_shell(program: str) -> bool:
    return program.rsplit("/", 1)[-1] in ("sh", "bash", "dash")


def _env_pairs(value: str, lookup) -> list[tuple[str, str, str]]:
    """(name, raw, expanded) for `ENV A=1 B="x y"` and the legacy `ENV A some value`."""
    stripped = value.strip()
    first = stripped.split(None, 1)[0] if stripped else ""
    if "=" not in first:
        name, _, rest = stripped.partition(" ")
        raw = rest.strip()
        return [(name, raw, _expand(raw, lookup))]
    pairs = []
    raw_words = split_words(stripped)
    expanded_words = split_words(stripped, lookup)
    for raw_word, word in zip(raw_words, expanded_words):
        name, sep, val = word.partition("=")
        if sep:
            pairs.append((name, raw_word.partition("=")[2], val))
    return pairs


def _expand(text: str, lookup) -> str:
    """Expand variables in one value, keeping it one string (quotes removed, spaces kept)."""
    words = split_words(text, lookup)
    return " ".join(words)
