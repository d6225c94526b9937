"""Bounded fan-out over threads for S3 transfers (parts, ranges, chunks, HEADs): results in order,
and the first failure stops what has not started yet."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def run_parallel(function: Callable[[T], R], items: Iterable[T], workers: int) -> list[R]:
    """function(item) for every item on up to `workers` threads, results in order.

    On the first failure the tasks not yet started are cancelled, the running ones finish, and
    that failure is raised.
    """
    items = list(items)
    if not items:
        return []
    with ThreadPoolExecutor(min(workers, len(items))) as pool:
        futures = [pool.submit(function, item) for item in items]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in futures if f in done and f.exception() is not None), None)
        if failed is not None:
            for future in pending:
                future.cancel()
    if failed is not None:
        raise failed.exception()
    return [future.result() for future in futures]
