"""The order of a make: each layer starts once what it waits for is done, `jobs` at a time.

A layer waits for its parent, and for the first layer with the same key (identical inputs in two
graphs share a key: the first one does the work, the others only take its result). A failed or
skipped layer skips everything that waits for it, while other branches go on. No engine here:
the work of one layer is a function the make passes in.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from efabuild.errors import EfabuildError
from efabuild.plan import NOTHING, LayerPlan

if TYPE_CHECKING:
    from concurrent.futures import Future

BUILT, PULLED, EXPORTED, REUSED, FAILED, SKIPPED = "built", "pulled", "exported", "reused", "failed", "skipped"
STATUSES = (BUILT, PULLED, EXPORTED, REUSED, FAILED, SKIPPED)


class Outcome(NamedTuple):
    qualname: str
    key: str
    status: str
    seconds: float = 0.0
    steps: tuple[str, ...] = ()  # what ran for this layer: pull, build, push, export
    log: str = ""  # the build log kept under the store
    artifact: str = ""  # the .sqsh path in the store
    error: str = ""  # why it failed or was skipped


class _Queue:
    def __init__(self, order: list[str], plans: Mapping[str, LayerPlan]) -> None:
        self.plans = plans
        self.pending = list(order)
        self.outcomes: dict[str, Outcome] = {}
        self.first: dict[str, str] = {}  # key -> the first layer with it, which does the work
        for name in order:
            self.first.setdefault(plans[name].key, name)

    def shares_work(self, name: str) -> bool:
        """Another layer with this key does all of this one's work. Not when only this one is an
        artifact: the artifact flag is no input of the key, and the .sqsh is this layer's to make."""
        first = self.first[self.plans[name].key]
        return first != name and (self.plans[first].artifact or not self.plans[name].artifact)

    def waits_for(self, name: str) -> list[str]:
        first = self.first[self.plans[name].key]
        return [n for n in (self.plans[name].parent, first if first != name else None) if n and n in self.plans]

    def blocked_by(self, name: str) -> str | None:
        return next((other for other in self.waits_for(name)
                     if other in self.outcomes and self.outcomes[other].status in (FAILED, SKIPPED)), None)

    def ready(self, name: str) -> bool:
        return all(other in self.outcomes for other in self.waits_for(name))


def run_in_order(
    order: list[str], plans: Mapping[str, LayerPlan], jobs: int, *,
    work: Callable[[LayerPlan], Outcome], settle: Callable[[LayerPlan, bool], Outcome],
    finished: Callable[[Outcome], None], redact: Callable[[str], str] = str,
    interrupted: Callable[[], None] = lambda: None,
) -> dict[str, Outcome]:
    """Every layer of `order` (parents first): `work(plan)` in a worker thread for a layer with
    something to do; `settle(plan, shares_work)` for one with nothing to do or whose key an earlier
    layer made. `finished(outcome)` hears how each layer that had work ended; `interrupted()` is called on
    Ctrl-C before the running work is abandoned."""
    queue = _Queue(order, plans)
    running: dict[Future, tuple[str, float]] = {}  # -> (layer, when its work started)
    with contextlib.ExitStack() as stack:
        pool = None  # started with the first layer that has work: a no-op make starts no thread
        try:
            while queue.pending or running:
                for name in list(queue.pending):
                    if not queue.blocked_by(name) and not (queue.ready(name) and len(running) < jobs):
                        continue
                    queue.pending.remove(name)
                    outcome = _start(queue, name, settle, finished)
                    if outcome is None:
                        pool = pool or stack.enter_context(_pool(jobs))
                        running[pool.submit(work, plans[name])] = name, time.monotonic()
                    else:
                        queue.outcomes[name] = outcome
                if running:
                    from concurrent.futures import FIRST_COMPLETED, wait

                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in done:
                        name, started = running.pop(future)
                        queue.outcomes[name] = _result(future, plans[name], started, finished, redact)
        except KeyboardInterrupt:
            interrupted()
            for future in running:
                future.cancel()
            raise
    return queue.outcomes


def _pool(jobs: int):
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=max(1, jobs))


def _start(queue: _Queue, name: str, settle, finished) -> Outcome | None:
    """The outcome of a layer that needs no worker; None when it does."""
    lp = queue.plans[name]
    failed = queue.blocked_by(name)
    if failed:
        outcome = Outcome(name, lp.key, SKIPPED, error=f"parent {failed} did not finish")
        finished(outcome)
        return outcome
    if queue.shares_work(name) or lp.action == NOTHING:
        return settle(lp, queue.shares_work(name))
    return None


def _result(future: Future, lp: LayerPlan, started: float, finished, redact) -> Outcome:
    try:
        outcome = future.result()
    except Exception as exc:  # one layer's failure must not stop the other branches
        message = redact(str(exc) if isinstance(exc, EfabuildError) else f"{type(exc).__name__}: {exc}")
        # the time it ran until it failed: what the user waited for
        outcome = Outcome(lp.qualname, lp.key, FAILED, time.monotonic() - started, error=message)
    finished(outcome)
    return outcome

