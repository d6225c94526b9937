"""What makes killed on this host left behind, swept at the start of the next make's run.

Temp files and build contexts in the store tiers, scratch directories in the system's temp dir,
export containers and make --check images in the engine: a live make's are never touched. The
slow part is looking (two engine listings, each a wait on its socket, and the temp dir's listing),
so `LeftoverSearch` looks on a thread while the plan walks the contexts; what it found is removed
only when the make goes on to run, as when it looked then.
"""

from __future__ import annotations

import threading
from pathlib import Path

from efabuild import notices
from efabuild.engine import leftovers
from efabuild.engine.client import connect
from efabuild.errors import EfabuildError
from efabuild.model import Workspace
from efabuild.host import scratch
from efabuild.store.gc import leftovers as store_leftovers


class LeftoverSearch:
    """Scratch directories and engine leftovers of dead makes, looked for on a thread from now on."""

    def __init__(self, ws: Workspace) -> None:
        self._found: tuple = ([], None, None)
        self._thread = threading.Thread(target=self._look, args=(ws,), name="efabuild-leftovers", daemon=True)
        self._thread.start()

    def _look(self, ws: Workspace) -> None:
        directories = []
        try:
            directories = scratch.dead_scratch_dirs()
            # the engine the plan asks (a client of the same settings): it answers or says nothing
            stores = [Path(path).absolute() for _, path in ws.settings.store.roots()]
            self._found = (directories, leftovers.find(connect(ws.settings.builder), stores), None)
        except (OSError, EfabuildError) as exc:
            self._found = (directories, None, exc)

    def result(self) -> tuple:
        """(dead scratch directories, EngineLeftovers or None, what stopped the looking or None)."""
        self._thread.join()
        return self._found


def sweep(store, engine, steps, search: LeftoverSearch | None = None) -> None:  # noqa: ANN001
    """Remove what killed makes left: what `search` found, or (none started) looked for now.
    `steps()` is the make's EngineSteps, which looks in the engine when nothing was searched before."""
    try:
        for tier in store.fs_tiers:
            for path in store_leftovers.find(tier):
                store_leftovers.remove(tier, path)
        directories, found, error = search.result() if search else (scratch.dead_scratch_dirs(), None, None)
        for directory in directories:
            scratch.remove(directory)
        if error is not None:
            raise error
        if engine is not None and search is None:
            steps().remove_dead_leftovers([tier.root for tier in store.fs_tiers])
        elif engine is not None and found is not None and (found.containers or found.images):
            leftovers.remove(engine, found)
    except (OSError, EfabuildError) as exc:  # housekeeping: never a reason to fail the make
        notices.warn(f"leftovers of earlier makes not removed: {exc}")
