"""A test's guard against a hang on a FIFO that nothing will ever write to."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")


def without_blocking_on(fifo: Path, work: Callable[[], T], what: str | None = None) -> T:
    """`work()`'s result, or what it raised, raised here; run on a thread, so that when it is still
    blocked after 10 s the FIFO can be opened for writing to let it end, and the test fails."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append((work(), None))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append((None, exc))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():
        with open(fifo, "wb"):
            pass
        worker.join(5)
        pytest.fail(what or f"blocked on the FIFO {fifo.name}")
    result, failure = outcome[0]
    if failure is not None:
        raise failure
    return result
