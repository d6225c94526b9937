"""Run Graphviz's `dot` on a picture's source."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from efabuild.host import children
from efabuild.errors import EfabuildError, InputError

FORMATS = ("svg", "png")
_TIMEOUT_S = 120


def require_dot() -> str:
    """The path of Graphviz's `dot`; one line saying how to install it when it is missing."""
    dot = shutil.which("dot")
    if dot is None:
        raise EfabuildError("Graphviz's `dot` is not installed: apt-get install graphviz "
                            "(or use efabuild graph --format dot and draw it elsewhere)")
    return dot


def render(source: str, fmt: str) -> bytes:
    """The picture as `fmt` (svg or png) bytes."""
    if fmt not in FORMATS:
        raise InputError(f"cannot draw {fmt!r}: choose one of {', '.join(FORMATS)}")
    dot = require_dot()
    try:
        done = children.run([dot, f"-T{fmt}"], input=source.encode(), capture_output=True, timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise EfabuildError(f"Graphviz's dot did not finish within {_TIMEOUT_S}s") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.decode(errors="replace").splitlines() if line.strip()]
        raise EfabuildError(f"Graphviz's dot failed: {lines[-1] if lines else f'exit {done.returncode}'}")
    return done.stdout


def format_of(path: Path) -> str:
    """svg or png from a file name's suffix."""
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise InputError("the picture's name must end in .svg or .png", str(path))
    return fmt
