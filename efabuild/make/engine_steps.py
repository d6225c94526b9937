"""What a make asks of the engine, as one small interface: is an image there, build, tag, pull,
push, and clear what killed makes left in the engine.

`EngineSteps` does it through `efabuild.engine`; tests of the scheduling pass an object with the
same methods instead, so the order of a make can be checked without Docker.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from efabuild.engine import leftovers
from efabuild.engine.build import build_layer
from efabuild.engine.images import image_exists, tag_image
from efabuild.engine.registry import pull, push


class EngineSteps:
    def __init__(self, engine) -> None:  # noqa: ANN001 - efabuild.engine.client.Engine
        self.engine = engine

    def has_image(self, tag: str) -> bool:
        return image_exists(self.engine, tag)

    def tag(self, source: str, target: str) -> None:
        tag_image(self.engine, source, target)

    def build(self, request, log_path: Path, on_line: Callable[[str], None], cancel: threading.Event,
              redact: Callable[[str], str], log_root: Path | None = None) -> None:
        """Build `request` (an engine.build.BuildRequest), tagging it only once it has finished."""
        build_layer(self.engine, request, log_path, on_line=on_line, cancel=cancel, redact=redact,
                    log_root=log_root)

    def pull(self, tag: str, registry) -> bool:  # noqa: ANN001 - RegistrySettings
        return pull(self.engine, tag, registry)

    def push(self, tag: str, registry) -> None:  # noqa: ANN001 - RegistrySettings
        push(self.engine, tag, registry)

    def remove_dead_leftovers(self, stores: list[Path]) -> None:
        """Export containers into `stores` and make --check images of killed makes of this host."""
        leftovers.remove(self.engine, leftovers.find(self.engine, stores))
