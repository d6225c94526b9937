"""Frozen value classes for a workspace: layers from graphs/*.toml (BUILD.toml's settings are
`settings.py`'s classes).

Pure data: reading and validating files is `workspace.py`'s and `settings.py`'s job, keys are
`keys.py`'s.

The classes every command loads at start-up (these, the plan's, the keys', lint's and the store's
records) are NamedTuples: attrs compiles each class's methods at import, about 0.4 ms a class,
and attrs itself takes about 15 ms to import; a NamedTuple costs a third of one class's share.
`_replace` gives a changed copy. Classes loaded only where their work is keep attrs.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from efabuild.settings import Settings  # stdlib-only: BUILD.toml's settings tables, parsed once

class BaseImage(NamedTuple):
    ref: str  # e.g. nvcr.io/nvidia/pytorch:26.08-py3
    digest: str | None = None  # sha256:..., pinned in the graph or resolved from the engine


class LintIgnore(NamedTuple):
    rule: str
    reason: str


class Layer(NamedTuple):
    """One layer: FROM its base or its parent's image, then `dockerfile` text, tagged by its key."""

    graph: str
    name: str
    source: Path  # the graph file that declares it (for messages)
    dockerfile: str  # text without FROM; efabuild writes the FROM line
    dockerfile_file: str | None = None  # workspace-relative path when read from a file
    base: BaseImage | None = None
    parent: str | None = None  # qualified "graph:layer"
    args: tuple[tuple[str, str], ...] = ()  # sorted build args
    secrets: tuple[str, ...] = ()  # env var names passed as BuildKit secrets (names only in the key)
    context: tuple[str, ...] = ()  # workspace-relative files or directories copied in
    exclude: tuple[str, ...] = ()  # Docker-syntax patterns (workspace-relative) the context leaves out
    artifact: bool = False  # export a .sqsh
    ignore: tuple[LintIgnore, ...] = ()
    line: int | None = None  # line of the [layers.NAME] table in `source`
    # line of the Dockerfile text's first line: in `dockerfile_file` when set, else in `source`
    dockerfile_line: int = 1
    # the platforms it is built for: its own `platforms`, else its graph's, else the workspace's,
    # narrowed to its parent's (load_workspace resolves it; empty only before that)
    platforms: tuple[str, ...] = ()

    @property
    def qualname(self) -> str:
        return f"{self.graph}:{self.name}"

    @property
    def args_dict(self) -> dict[str, str]:
        return dict(self.args)


class Graph(NamedTuple):
    name: str
    source: Path
    description: str = ""
    layers: tuple[Layer, ...] = ()
    platforms: tuple[str, ...] = ()  # the graph's top-level `platforms`, empty when not set


class Workspace(NamedTuple):
    root: Path  # absolute directory holding BUILD.toml
    settings: Settings
    graphs: tuple[Graph, ...] = ()

    @property
    def layers(self) -> dict[str, Layer]:
        """Every layer by qualified name, in declaration order."""
        return {layer.qualname: layer for graph in self.graphs for layer in graph.layers}

    def relpath(self, path: Path) -> str:
        try:
            return str(Path(path).relative_to(self.root))
        except ValueError:
            return str(path)
