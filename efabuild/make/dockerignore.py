"""Which files a layer's context leaves out: a `.dockerignore` in each context root and the layer's
`exclude` key, both in Docker's pattern syntax.

Docker reads a pattern as Go's filepath.Match plus `**`, anchored at the context root, a match of a
directory covering everything under it, `!` re-including, the last matching pattern deciding.
pathspec's gitignore patterns do the same once each pattern is cleaned and anchored with a
leading `/` (Docker's patterns never match at any depth, as bare gitignore names do).
"""

from __future__ import annotations

import posixpath
import re
import warnings
from collections.abc import Iterable

IGNORE_FILE = ".dockerignore"


def docker_patterns(lines: Iterable[str]) -> tuple[str, ...]:
    """Patterns as Docker reads a .dockerignore: `#` comments and blank lines dropped, each pattern
    trimmed and path-cleaned, a leading `/` dropped, `!` kept."""
    patterns = []
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = posixpath.normpath(line[1:].strip() if negated else line).lstrip("/")
        if pattern and pattern != ".":
            patterns.append(("!" if negated else "") + pattern)
    return tuple(patterns)


class BadPattern(ValueError):
    """A pattern Docker would refuse (Go's filepath.Match: ErrBadPattern)."""


class Exclusions:
    """Docker-syntax patterns relative to `root` (a workspace-relative directory, "" for the
    workspace root), asked about workspace-relative paths."""

    def __init__(self, patterns: Iterable[str], root: str = "") -> None:
        self.patterns = docker_patterns(patterns)
        self.prefix = f"{root}/" if root and root != "." else ""
        anchored = [f"!/{p[1:]}" if p.startswith("!") else f"/{p}" for p in self.patterns]
        try:
            # RE2: linear time, as BuildKit's Go regexps are; Python's re backtracks exponentially
            # on a pattern like `*a*a*a*a*a*a*b` against a long name (a plan hung on one file)
            self._spec = _compiled(anchored)
        except _PATTERN_ERRORS() as exc:
            bad = next((p for p in self.patterns if not _compiles(p)), "")
            raise BadPattern(f"bad pattern {bad!r}: {exc}") from None
        # with an exception, something under an excluded directory may come back: walk into it
        self._prunes = not any(p.startswith("!") for p in self.patterns)

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def excludes(self, path: str) -> bool:
        """True when the file at workspace-relative `path` is left out."""
        if not path.startswith(self.prefix):
            return False
        if not path.isascii():  # RE2 takes UTF-8: a byte that is not (a surrogate) matches as U+FFFD
            path = path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        return self._spec.match_file(path[len(self.prefix):])

    def prunes(self, directory: str) -> bool:
        """True when nothing under `directory` can be in the context (its walk can stop)."""
        return self._prunes and self.excludes(directory)


def leaves_out(rules: Iterable[Exclusions], path: str, *, directory: bool = False) -> bool:
    return any(r.prunes(path) if directory else r.excludes(path) for r in rules)


def _compiles(pattern: str) -> bool:
    try:
        _compiled(["/" + pattern.removeprefix("!")])
    except _PATTERN_ERRORS():
        return False
    return True


def _compiled(anchored: list[str]):  # noqa: ANN202 - a pathspec.PathSpec
    import pathspec  # deferred, as re2: only a .dockerignore or an exclude loads them

    with warnings.catch_warnings():  # re's FutureWarning on `[[`: a bad pattern is one line, not three
        warnings.simplefilter("ignore", FutureWarning)
        return pathspec.PathSpec.from_lines("gitignore", anchored, backend="re2")


def _PATTERN_ERRORS() -> tuple[type[Exception], ...]:  # noqa: N802 - names a tuple of exceptions
    """What compiling a bad pattern raises: pathspec's own (ValueErrors), Python's re (it parses
    each pattern first) and RE2 (`[[:alpha:]]` passes re, not RE2)."""
    import re2

    return (ValueError, re.error, re2.error)

