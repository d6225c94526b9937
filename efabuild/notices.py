"""Warnings and notes from the library (a store entry skipped, a wait for a lock), for the CLI.

The library never prints. It calls `warn` and `note`; the CLI installs a printer with `use`.
Without one (efabuild used as a library), messages go to the `efabuild` logger. Imports nothing:
`efabuild lookup`'s fast path reads the store through modules that use it.
"""

from __future__ import annotations

from collections.abc import Callable

WARNING = "warning"
NOTE = "note"

_printer: Callable[[str, str], None] | None = None


def use(printer: Callable[[str, str], None] | None) -> None:
    """Send every later message to `printer(kind, message)` (None: back to logging)."""
    global _printer
    _printer = printer


def warn(message: str) -> None:
    _emit(WARNING, message)


def note(message: str) -> None:
    _emit(NOTE, message)


def _emit(kind: str, message: str) -> None:
    if _printer is not None:
        _printer(kind, message)
        return
    import logging

    logger = logging.getLogger("efabuild")
    (logger.warning if kind == WARNING else logger.info)(message)
