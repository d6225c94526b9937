"""Colour for plan states, outcomes and failures, only where a person reads them: on a terminal,
and not when NO_COLOR is set (no-color.org) or TERM=dumb. Plain SGR codes: every terminal that
draws the live view knows them, and no library has to load for them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TextIO

# the picture's colours (cli/picture.py), as near as eight terminal colours come
SGR = {
    "available": "32", "reused": "32",
    "to build": "33", "built": "33",
    "to pull": "34", "pulled": "34",
    "to export": "36", "exported": "36",
    "to copy": "35",
    "failed": "1;31",
    "skipped": "2",
}


def wanted(stream: TextIO, environ: Mapping[str, str] = os.environ) -> bool:
    """Colour for `stream`: a terminal, no NO_COLOR (any non-empty value) and TERM not dumb."""
    if environ.get("NO_COLOR") or environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class Palette:
    def __init__(self, on: bool) -> None:
        self.on = on

    def state(self, text: str) -> str:
        """`text` coloured by the state or outcome it starts with (`to build`, `failed`, ...);
        padding after it stays uncoloured, so aligned columns stay aligned."""
        if not self.on:
            return text
        word = text.rstrip()
        code = next((SGR[s] for s in SGR if word == s or word.startswith(s + " ")), None)
        if code is None:
            return text
        return f"\x1b[{code}m{word}\x1b[0m{text[len(word):]}"


def palette_for(stream: TextIO) -> Palette:
    return Palette(wanted(stream))
