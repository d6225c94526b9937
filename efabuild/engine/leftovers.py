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

    Read as the plan's other inventory is (the socket's API, else a timed docker CLI call): every
    make asks this first, and python-on-whales can neither bound its wait nor list labels without
    inspecting each container."""
    listed = _labelled(engine)
    if listed is None:
        return []
    dead = []
    for name, token, target in listed:
        owner = Owner.parse(token) or _owner_from_target(target)
        if name and owner is not None and _inside(target, stores) and owner.gone():
            dead.append(name)
    return dead


def _labelled(engine: Engine) -> list[tuple[str, str, str]] | None:
    """(name, owner label, export label) of every export container; None when the engine won't say."""
    if engine.api is not None:
        from efabuild.engine.api import ApiError

        try:
            return [(name, labels.get(OWNER_LABEL, ""), labels.get(EXPORT_LABEL, ""))
                    for name, labels in engine.api.labelled_containers(EXPORT_LABEL)]
        except ApiError:
            return None
    found = engine.run("container", "ls", "--all", "--filter", f"label={EXPORT_LABEL}", "--format",
                       f'{{{{.Names}}}}\t{{{{.Label "{OWNER_LABEL}"}}}}\t{{{{.Label "{EXPORT_LABEL}"}}}}',
                       timeout=LIST_TIMEOUT_S)
    if found.returncode != 0:
        return None
    listed = []
    for line in found.stdout.splitlines():
        name, _, rest = line.partition("\t")
        token, _, target = rest.partition("\t")
        listed.append((name, token, target))
    return listed


def remove_containers(engine: Engine, names: list[str]) -> None:
    containers.remove(engine, *names)


def _inside(target: str, stores: list[Path]) -> bool:
    path = Path(target)
    return path.is_absolute() and any(path.is_relative_to(store) for store in stores)


def _owner_from_target(target: str) -> Owner | None:
    """Containers made before the owner label: the store temp name of their .sqsh names the pid."""
    return parse_temp_owner(Path(target).name) if target else None
