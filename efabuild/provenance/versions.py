"""Version strings: parsing, comparing and matching specs like ">=2.19" (pure)."""

from __future__ import annotations

import re

_LEADING = re.compile(r"^\s*v?(\d+(?:\.\d+)*)")
_SPEC = re.compile(r"^\s*(>=|<=|==|!=|>|<|=)?\s*(\S+)\s*$")
_OPS = {
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
    "==": lambda a, b: a == b,
    "=": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}


def numeric(version: str | None) -> tuple[int, ...] | None:
    """The leading dotted numbers of a version: "2.6.0amzn1.0" -> (2, 6, 0); None when there are none."""
    if not version:
        return None
    match = _LEADING.match(version)
    return tuple(int(p) for p in match.group(1).split(".")) if match else None


def upstream(debian_version: str) -> str | None:
    """"1:2.6.0amzn1.0-1" -> "2.6.0": the upstream release inside a Debian package version."""
    without_epoch = debian_version.split(":", 1)[-1]
    match = _LEADING.match(without_epoch)
    return match.group(1) if match else None


def _padded(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)), b + (0,) * (width - len(b))


def compare(a: str, b: str) -> int | None:
    """-1, 0 or 1 comparing the numeric parts ("2.19" == "2.19.0"); None if either has none."""
    na, nb = numeric(a), numeric(b)
    if na is None or nb is None:
        return None
    na, nb = _padded(na, nb)
    return (na > nb) - (na < nb)


def valid_spec(spec: str) -> bool:
    """True for specs like ">=2.19", "<1.29", "==1.21.1", "2.4" or several joined by commas."""
    for clause in spec.split(","):
        match = _SPEC.match(clause)
        if match is None or numeric(match.group(2)) is None:
            return False
    return True


def satisfies(version: str | None, spec: str) -> bool | None:
    """Whether `version` meets every comma-separated clause of `spec`; None when unknowable."""
    parsed = numeric(version)
    if parsed is None or not valid_spec(spec):
        return None
    for clause in spec.split(","):
        op, wanted = _SPEC.match(clause).groups()
        a, b = _padded(parsed, numeric(wanted))
        if not _OPS[op or "=="](a, b):
            return False
    return True


def same_release(a: str | None, b: str | None) -> bool | None:
    """Whether two version strings name the same release: "1.21.1-aws" == "1.21.1"."""
    if a is None or b is None:
        return None
    result = compare(a, b)
    return (a.strip() == b.strip()) if result is None else result == 0


def consistent(declared: str, measured: str) -> bool | None:
    """Whether a declared version agrees with a measured one as far as both go:
    CUDNN_VERSION=9.14.0.64 agrees with 9.14.0 from the header. None if either has no numbers."""
    a, b = numeric(declared), numeric(measured)
    if a is None or b is None:
        return None
    width = min(len(a), len(b))
    return a[:width] == b[:width]
