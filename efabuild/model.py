"""Frozen value classes for a workspace: settings from BUILD.toml and layers from graphs/*.toml.

Pure data: reading and validating files is `workspace.py`'s and `settings.py`'s job, keys are
`keys.py`'s. Also the vocabulary [audit] policies use: the measured components and the pins.

The classes every command loads at start-up (these, the plan's, the keys', lint's and the store's
records) are NamedTuples: attrs compiles each class's methods at import, about 0.4 ms a class,
and attrs itself takes about 15 ms to import; a NamedTuple costs a third of one class's share.
`_replace` gives a changed copy. Classes loaded only where their work is keep attrs.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from efabuild.settings import StoreConfig  # stdlib-only: the store's settings, parsed once

DEFAULT_PLATFORM = "linux/amd64"

# The components an image probe measures, in display order; [audit] policies name them.
COMPONENTS = (
    "ngc-release",
    "cuda",
    "nccl",
    "cudnn",
    "pytorch",
    "libfabric",
    "aws-ofi-nccl",
    "efa-installer",
    "deepep",
)
# What [audit] required_pins may name, besides "arg:NAME".
KNOWN_PINS = ("base-digest", "deepep-commit", "efa-installer")


class BuilderSettings(NamedTuple):
    """Which BuildKit builds: the local engine, a Docker context/host, or a buildx builder."""

    platform: str = DEFAULT_PLATFORM
    jobs: int = 2
    context: str | None = None  # docker context name
    host: str | None = None  # DOCKER_HOST-style URL, e.g. unix:///run/other.sock, ssh://builder
    buildx_builder: str | None = None  # a `docker buildx` builder name
    # several builders, as --builder names them (context, host URL, buildx:NAME): layers are
    # spread across them and reach each other through [registry]
    farm: tuple[str, ...] = ()


class RegistrySettings(NamedTuple):
    """Optional layer cache: built layer images are pushed to and pulled from here."""

    url: str  # host[:port][/path], e.g. 123.dkr.ecr.us-east-1.amazonaws.com or 127.0.0.1:5000
    insecure: bool = False


class ExportSettings(NamedTuple):
    """How an image becomes a .sqsh: mksquashfs options (Enroot's by default)."""

    compression: str = "lzo"
    compress_data: bool = False  # Enroot's -noD: data blocks uncompressed
    extra_options: tuple[str, ...] = ()
    # file times written by a build are clamped to the base's creation time (see export/squash.py)
    clamp_times: bool = True

    def mksquashfs_options(self) -> tuple[str, ...]:
        opts = ("-comp", self.compression)
        if not self.compress_data:
            opts += ("-noD",)
        return opts + self.extra_options


class AuditPolicy(NamedTuple):
    host_efa_installer: str | None = None  # the host AMI's EFA installer version
    min_versions: tuple[tuple[str, str], ...] = ()  # (component, minimum version)
    required_pins: tuple[str, ...] = ()  # e.g. "base-digest", "deepep-commit"
    # (component, version spec, component, version spec, why): a combination known to break
    known_bad: tuple[tuple[str, str, str, str, str], ...] = ()


class SignSettings(NamedTuple):
    """[sign]: the key make signs every exported artifact's statement with."""

    key: str  # a PEM private key file (relative to the workspace) or a KMS key ARN
    region: str | None = None  # KMS only; default: the ARN's region
    endpoint_url: str | None = None  # KMS-compatible endpoints only


class Settings(NamedTuple):
    graph_files: tuple[str, ...] = ("graphs/*.toml",)
    store: StoreConfig = StoreConfig(local=Path("cache"))
    builder: BuilderSettings = BuilderSettings()
    registry: RegistrySettings | None = None
    export: ExportSettings = ExportSettings()
    audit: AuditPolicy = AuditPolicy()
    sign: SignSettings | None = None
    trust_keys: tuple[str, ...] = ()  # [trust] keys: checked by settings.py, read by efabuild.signing.trust


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
