"""Text from outside (a path, a planted name, a record's field) made safe for a one-line message
or a JSON document: control characters escaped, bytes that are not UTF-8 written `\\xNN`.

Pure: every package that names a file in an error shows it through these.
"""

from __future__ import annotations

import os


def shown(path: str | os.PathLike[str]) -> str:
    """A path for a one-line message: control characters (a newline in a planted name) escaped,
    and a byte that is not UTF-8 (read as a surrogate) shown as `\\xNN`, so the text can be printed."""
    text = os.fspath(path)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escaped(c) for c in text)


def as_utf8(text: str) -> str:
    """`text` with each byte that is not UTF-8 (a surrogate, as os and tarfile read such a name)
    written `\\xNN`: a string every UTF-8 encoder and JSON parser accepts."""
    if text.isascii():
        return text
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _escaped(char: str) -> str:
    return f"\\x{ord(char) - 0xDC00:02x}" if 0xDC80 <= ord(char) <= 0xDCFF else repr(char)[1:-1]
