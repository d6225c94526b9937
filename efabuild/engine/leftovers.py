"""Export containers left behind by makes that were killed (kill -9, OOM, a node reboot).

Every export creates a container labelled with the `.sqsh` it writes and its owner (host, pid,
start time; see efabuild.store.owner); the export removes it when it ends, however it ends, unless the
process dies first. Those are found here by label and removed once their owner is gone — never a
live make's, nor one of another host's.
"""

from __future__ import annotations

from pathlib import Path

from efabuild.engine import containers
from efabuild.engine.client import Engine
from efabuild.engine.containers import EXPORT_LABEL, OWNER_LABEL
from efabuild.store.owner import Owner
from efabuild.store.fsutil import parse_temp_owner

LIST_TIMEOUT_S = 30.0


def dead_export_containers(engine: Engine, stores: list[Path]) -> list[str]:
    """Names of export containers writing into one of the `stores` whose owner is gone.

    A timed docker CLI call (Engine.run), as the plan's other inventory reads: every make asks
    this first, and python-on-whales can neither bound its wait nor list labels without
    inspecting each container."""
    found = engine.run("container", "ls", "--all", "--filter", f"label={EXPORT_LABEL}", "--format",
                       f'{{{{.Names}}}}\t{{{{.Label "{OWNER_LABEL}"}}}}\t{{{{.Label "{EXPORT_LABEL}"}}}}',
                       timeout=LIST_TIMEOUT_S)
    if found.returncode != 0:
        return []
    dead = []
    for line in found.stdout.splitlines():
        name, _, rest = line.partition("\t")
        token, _, target = rest.partition("\t")
        owner = Owner.parse(token) or _owner_from_target(target)
        if name and owner is not None and _inside(target, stores) and owner.gone():
            dead.append(name)
    return dead


def remove_containers(engine: Engine, names: list[str]) -> None:
    containers.remove(engine, *names)


def _inside(target: str, stores: list[Path]) -> bool:
    path = Path(target)
    return path.is_absolute() and any(path.is_relative_to(store) for store in stores)


def _owner_from_target(target: str) -> Owner | None:
    """Containers made before the owner label: the store temp name of their .sqsh names the pid."""
    parsed = parse_temp_owner(Path(target).name) if target else None
    return Owner(parsed[0], parsed[1], 0) if parsed else None
