"""Containers made only to read an image's filesystem: created (never started), exported as a
tar stream, removed.

Each is labelled with the `.sqsh` it is exported into and its owner (host, pid, start time; see
efabuild.host.owner), so one left behind by a process that was killed can be found and removed
(efabuild.engine.leftovers).
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, TYPE_CHECKING

from efabuild.engine.client import NO_DOCKER_CLI, Engine, EngineError, EngineUnavailable, last_line, output_text
from efabuild.host.owner import Owner

if TYPE_CHECKING:
    import subprocess

EXPORT_LABEL = "org.efabuild.export"  # on the temporary container: the .sqsh being written
OWNER_LABEL = "org.efabuild.host.owner"  # …and the process exporting


def create_for_export(engine: Engine, image: str, target: Path) -> str:
    """A stopped container of `image`, labelled with `target` and this process; returns its name."""
    import uuid

    from python_on_whales.exceptions import DockerException

    name = f"efabuild-export-{uuid.uuid4().hex[:12]}"
    try:
        # a command is given so images without CMD can be created; the container never starts
        engine.client.container.create(
            image, ["/bin/true"], name=name, pull="never",
            labels={EXPORT_LABEL: str(target), OWNER_LABEL: Owner.current().token},
        )
    except DockerException as exc:
        raise EngineError(last_line(output_text(exc.stderr)) or str(exc)) from None
    return name


def export_stream(engine: Engine, container: str, stderr: IO[bytes]) -> subprocess.Popen[bytes]:
    """`docker container export` running, its tar stream on the process's stdout.

    The one docker command run here rather than through python-on-whales: its `container.export`
    only writes to a file, and the export's point is never to hold the rootfs on disk. The
    command line carries the same --host/--context as the client."""
    import subprocess  # with the export: a no-op make's leftover listing needs none

    from efabuild.host import children  # ctypes with it: a no-op make exports nothing

    try:
        return children.popen(engine.command("container", "export", container),
                                stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise EngineUnavailable(NO_DOCKER_CLI) from None


def remove(engine: Engine, *names: str) -> None:
    """Remove containers (and their anonymous volumes) by name; ones already gone are no error."""
    if not names:  # the usual case, which must not load python-on-whales
        return
    from python_on_whales.exceptions import DockerException

    try:
        engine.client.container.remove(list(names), force=True, volumes=True)
    except DockerException:
        pass  # already gone; nothing else to clean
