"""What makes that were killed (kill -9, OOM, a node reboot) left in the engine.

Every export creates a container labelled with the `.sqsh` it writes and its owner (host, pid,
start time; see efabuild.host.owner); the export removes it when it ends, however it ends, unless the
process dies first. `make --check` tags its rebuilt image with its owner in the tag (a label would
be in the exported image, and so in the comparison) and removes it after the export. Both are
found here and removed once their owner is gone — never a live make's, nor one of another host's.
A check image of an efabuild from before that naming goes once it was tagged over a day ago.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

from efabuild.engine import containers
from efabuild.engine.api import ApiError
from efabuild.engine.client import Engine, EngineError
from efabuild.engine.containers import EXPORT_LABEL, OWNER_LABEL
from efabuild.engine.images import existing_tags, untag_image
from efabuild.host.fsutil import parse_temp_owner
from efabuild.host.owner import Owner
from efabuild.store.gc.leftovers import STALE_TEMP_SECONDS

LIST_TIMEOUT_S = 30.0
CHECK_REPO = "efabuild-check"
# a check image tagged by an efabuild that did not name the owner: judged by age, as an unowned
# make --check directory is (efabuild.store.gc.leftovers)
_UNOWNED_CHECK_TAG = re.compile(rf"{CHECK_REPO}/[^:]+:[0-9a-f]{{64}}")
# a tag is [A-Za-z0-9_.-]; a host name with anything else is written with `_` (never judged gone then)
_NOT_IN_TAG = re.compile(r"[^\w.-]", re.ASCII)


class EngineLeftovers(NamedTuple):
    containers: tuple[str, ...] = ()  # export containers, by name
    images: tuple[str, ...] = ()  # make --check's rebuilt images, by tag

    def described(self) -> list[str]:
        return [f"container {name}" for name in self.containers] + [f"image {tag}" for tag in self.images]


def find(engine: Engine, stores: list[Path]) -> EngineLeftovers:
    """What killed makes of this host left in the engine: export containers into `stores` and
    make --check's images."""
    return EngineLeftovers(tuple(dead_export_containers(engine, stores)), tuple(dead_check_images(engine)))


def remove(engine: Engine, leftovers: EngineLeftovers) -> None:
    # the containers first: a check killed while exporting has its image in use by one
    containers.remove(engine, *leftovers.containers)
    remove_images(engine, leftovers.images)


def check_image_tag(layer: str, key: str) -> str:
    """`efabuild-check/<layer>:<key12>-<host.pid.start>`: the tag of make --check's rebuild, named
    by the process that removes it after the export, or, killed first, by whom to ask."""
    return f"{CHECK_REPO}/{layer}:{key[:12]}-{_NOT_IN_TAG.sub('_', Owner.current().token)}"


def check_image_owner(tag: str) -> Owner | None:
    """The owner named in a check_image_tag(); None for any other tag."""
    repository, _, name = tag.rpartition(":")
    if not repository.startswith(CHECK_REPO + "/"):
        return None
    _, dash, token = name.partition("-")
    return Owner.parse(token) if dash else None


def dead_check_images(engine: Engine, now: float | None = None) -> list[str]:
    """Tags of make --check rebuilds whose process is gone from this host, and of rebuilds by an
    efabuild that did not name the owner (`efabuild-check/<layer>:<key>`) tagged over a day ago;
    sorted. (The engine itself refuses to untag the last name of an image a container uses.)"""
    now = time.time() if now is None else now
    dead = []
    for tag in _check_tags(engine):
        owner = check_image_owner(tag)
        if owner is not None and owner.gone():
            dead.append(tag)
        elif (owner is None and _UNOWNED_CHECK_TAG.fullmatch(tag)
              and now - _tagged_at(engine, tag) > STALE_TEMP_SECONDS):
            dead.append(tag)
    return sorted(dead)


def _check_tags(engine: Engine) -> list[str]:
    """Every efabuild-check/ tag in the engine; none when it won't say."""
    if engine.api is not None:
        try:  # filtered by the engine: a make asks this every time
            return engine.api.repo_tags(reference=f"{CHECK_REPO}/*")
        except ApiError:
            return []

    try:
        return sorted(existing_tags(engine, CHECK_REPO + "/"))
    except EngineError:
        return []


def _tagged_at(engine: Engine, tag: str) -> float:
    """When the engine last set a tag on the image (its Metadata.LastTagTime); now when unknown."""
    if engine.api is not None:
        try:
            when = str(((engine.api.inspect(tag) or {}).get("Metadata") or {}).get("LastTagTime") or "")
        except ApiError:
            when = ""
    else:
        found = engine.run("image", "inspect", "--format", "{{json .Metadata.LastTagTime}}", tag,
                           timeout=LIST_TIMEOUT_S)
        when = found.stdout.strip().strip('"') if found.returncode == 0 else ""

    try:  # RFC 3339 with nanoseconds: the seconds are enough
        tagged = datetime.strptime(when[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return time.time()
    return tagged if tagged > 0 else time.time()  # 0001-01-01: never tagged, as far as it knows


def remove_images(engine: Engine, tags: tuple[str, ...] | list[str]) -> None:
    for tag in tags:
        try:
            untag_image(engine, tag)
        except EngineError:
            pass  # still in use (a container of another process): the next sweep asks again


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
        try:
            return [(name, labels.get(OWNER_LABEL, ""), labels.get(EXPORT_LABEL, ""))
                    for name, labels in engine.api.labelled_containers(EXPORT_LABEL)]
        except ApiError:
            return None
    # one JSON array a container: a label may hold a line break or a tab, and whoever can create a
    # container on a shared engine could otherwise forge a row naming another's container
    found = engine.run("container", "ls", "--all", "--filter", f"label={EXPORT_LABEL}", "--format",
                       f'[{{{{json .Names}}}}, {{{{json (.Label "{OWNER_LABEL}")}}}}, '
                       f'{{{{json (.Label "{EXPORT_LABEL}")}}}}]', timeout=LIST_TIMEOUT_S)
    if found.returncode != 0:
        return None

    listed = []
    for line in found.stdout.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, list) and len(row) == 3 and all(isinstance(field, str) for field in row):
            listed.append(tuple(row))
    return listed


def _inside(target: str, stores: list[Path]) -> bool:
    path = Path(target)
    return path.is_absolute() and any(path.is_relative_to(store) for store in stores)


def _owner_from_target(target: str) -> Owner | None:
    """Containers made before the owner label: the store temp name of their .sqsh names the pid."""
    return parse_temp_owner(Path(target).name) if target else None
