"""Builders that cannot see the local engine's images: a `remote`, `docker-container` or
`kubernetes` buildx builder, another host's engine, or several of them (`[builder] farm`).

Their layers reach each other through `[registry]`: each build is pushed by BuildKit itself
(`--output type=image,push=true`), a child's FROM names its parent there by digest, and an
artifact's root filesystem streams from the builder (`--output type=tar`) into the export, with
the image config read from the registry. `buildx build` cannot pick a node of one builder, so a
farm is one builder per node, and layers are spread over them, `[builder] jobs` at a time each.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs

from efabuild.engine.api import ApiError
from efabuild.engine.client import CHECK_TIMEOUT_S, Engine, EngineTimeout, EngineUnavailable, builder_nodes, connect
from efabuild.engine.build import build_layer, builder_name
from efabuild.engine.images import REMOTE_TIMEOUT_S, remote_digest, untag_image
from efabuild.engine.registry import RegistryError, push, remote_ref
from efabuild.errors import EfabuildError, InputError
from efabuild.export.artifact import RemoteImage
from efabuild.grammar import split_farm_entry
from efabuild.plan import BUILD
from efabuild.settings import BuilderSettings, RegistrySettings
from efabuild.refs import image_tag

# drivers whose builds land in the engine that `docker image ls` shows
_LOCAL_DRIVERS = ("docker",)
_WAIT_POLL_S = 0.25
VERSION_TIMEOUT_S = 30.0


def node_settings(entry: str, base: BuilderSettings) -> BuilderSettings:
    """One `[builder] farm` entry as the settings of its own builder (as --builder reads it); a
    declared `@os/arch` is the farm's business, not the builder's address."""
    entry = split_farm_entry(entry)[0]
    one = base._replace(context=None, host=None, buildx_builder=None, farm=())
    if "://" in entry:
        return one._replace(host=entry)
    if entry.startswith("buildx:"):
        return one._replace(buildx_builder=entry.removeprefix("buildx:"))
    return one._replace(context=entry)


def engine_platform(engine) -> str | None:  # noqa: ANN001 - an engine.client.Engine
    """os/arch of the machine an engine runs on (`docker version`; on a local socket its HTTP API,
    starting no docker process), None when it does not say."""
    if engine.api is not None:
        try:
            return engine.api.server_platform()
        except ApiError:
            return None
    try:
        found = engine.run("version", "--format", "{{.Server.Os}}/{{.Server.Arch}}", timeout=VERSION_TIMEOUT_S)
    except EngineTimeout:
        return None
    text = found.stdout.strip()
    return text if found.returncode == 0 and "/" in text and "<" not in text else None


def node_platforms(node) -> tuple[str, ...]:  # noqa: ANN001 - an Engine
    """What one builder builds natively: its farm entry's declaration, else its engine's own."""
    declared = split_farm_entry(node.farm_entry)[1] if node.farm_entry else ()
    if declared:
        return declared
    cached = getattr(node, "_efabuild_platform", None)
    if cached is None:
        cached = engine_platform(node) or ""
        node._efabuild_platform = cached
    return (cached,) if cached else ()


def native_platforms(settings: BuilderSettings, engine, nodes=None) -> set[str]:  # noqa: ANN001
    """Every platform some builder of this make runs natively: each farm node's (declared, or
    its engine's when undeclared), else the one engine's. `nodes`: the farm's engines when
    already connected."""
    if settings.farm and nodes is None:
        nodes = [connect(node_settings(entry, settings), farm_entry=entry) for entry in settings.farm]
    if settings.farm:
        return {p for node in nodes for p in node_platforms(node)}
    return set(node_platforms(engine)) if engine is not None else set()


def sees_local_images(engine: Engine) -> bool:
    """Whether a build's FROM can name an image of the engine efabuild inspects: true for the
    engine's own BuildKit, false for a buildx builder of another driver."""
    if not engine.buildx_builder:
        return True
    try:
        found = engine.run("buildx", "inspect", engine.buildx_builder, timeout=CHECK_TIMEOUT_S)
    except EngineTimeout:
        return True  # the builder check before any build says what is wrong with it
    driver, _ = builder_nodes(found.stdout)
    return found.returncode != 0 or driver in _LOCAL_DRIVERS


def builds_through_registry(settings: BuilderSettings, engine: Engine) -> bool:
    """Whether a make's builds take their parents from [registry] (and export from there): a
    farm, or a builder that cannot see the engine's images. Their images there are then what
    the builders have, with nothing to pull into the engine."""
    return bool(settings.farm) or not sees_local_images(engine)


@attrs.define(eq=False)
class Farm:
    """The builders that answered, and what the registry holds of this make's layers."""

    nodes: list[Engine]
    registry: RegistrySettings
    jobs: int
    # key -> REGISTRY/efabuild/<layer>:<key>@sha256:…, as this make built or found it
    refs: dict[str, str] = attrs.field(factory=dict)
    # registry reference -> the index of the builder that built it: its export runs there when it has a free
    # slot, where the image's layers already are (another builder pulls them all from the
    # registry before the first byte of the stream: 14 s for the bench's 1.4 GiB image)
    built_on: dict[str, int] = attrs.field(factory=dict)
    _busy: list[int] = attrs.field(factory=list)
    _turn: int = 0
    _cond: threading.Condition = attrs.field(factory=threading.Condition)

    @classmethod
    def start(cls, settings: BuilderSettings, engine: Engine | None, registry: RegistrySettings | None,
              say: Callable[[str], None]) -> Farm | None:
        """The farm the settings name, None when builds see the local engine's images.

        Raises InputError without [registry], EngineUnavailable when no builder answers; a
        builder that does not answer is reported through `say` and left out."""
        if settings.farm:
            nodes = [connect(node_settings(entry, settings), farm_entry=entry) for entry in settings.farm]
        elif engine is not None and not sees_local_images(engine):
            nodes = [engine]
        else:
            return None
        names = ", ".join(builder_name(node) for node in nodes)
        if registry is None:
            raise InputError(
                f"builder {names} cannot see this engine's images, so parents must reach children "
                "through a registry: add [registry] url = \"HOST[:PORT]\" (e.g. $(bash scripts/start-registry.sh))",
                "BUILD.toml [builder]",
            )
        live = []
        for node in nodes:
            try:
                if node is not engine:  # the engine itself was checked before planning
                    node.check()
            except EngineUnavailable as exc:
                say(f"builder {builder_name(node)} skipped: {exc}")
                continue
            live.append(node)
        if not live:
            raise EngineUnavailable(f"no builder of [builder] farm answers ({names}): start them or fix the list")
        return cls(nodes=live, registry=registry, jobs=max(1, settings.jobs), busy=[0] * len(live))

    @property
    def slots(self) -> int:
        return self.jobs * len(self.nodes)

    def able(self, platform: str | None) -> list[int]:
        """The builders that build `platform` natively; every builder when none does (the plan
        said the platform is emulated, see builders.check_platforms) or no platform is asked."""
        if platform is None:
            return list(range(len(self.nodes)))
        native = [i for i, node in enumerate(self.nodes) if platform in node_platforms(node)]
        return native or list(range(len(self.nodes)))

    @contextlib.contextmanager
    def take(self, cancel: threading.Event | None = None, prefer: int | None = None,
             platform: str | None = None) -> Iterator[Engine]:
        """The builder `prefer` (an index) when it has a free slot, else the least busy one with a
        free slot (in turn among equals) of those that build `platform`, held while in use."""
        able = self.able(platform)
        with self._cond:
            while True:
                order = sorted(able, key=lambda i: (self._busy[i], (i - self._turn) % len(self.nodes)))
                if prefer is not None and self._busy[prefer] < self.jobs:
                    order.insert(0, prefer)
                chosen = order[0]
                if self._busy[chosen] < self.jobs:
                    break
                if cancel is not None and cancel.is_set():
                    raise EfabuildError("interrupted while waiting for a free builder")
                self._cond.wait(_WAIT_POLL_S)
            self._busy[chosen] += 1
            self._turn = chosen + 1
        try:
            yield self.nodes[chosen]
        finally:
            with self._cond:
                self._busy[chosen] -= 1
                self._cond.notify_all()

    def push_name(self, layer_name: str, key: str) -> str:
        """Where BuildKit pushes a layer: REGISTRY/efabuild/<layer>:<key>."""
        return remote_ref(image_tag(layer_name, key), self.registry)

    def built(self, layer_name: str, key: str, digest: str) -> str:
        ref = f"{self.push_name(layer_name, key)}@{digest}"
        self.refs[key] = ref
        return ref

    def ref(self, local: Engine | None, layer_name: str, key: str, local_tag: str | None = None) -> str:
        """The registry reference of a layer this make did not build: found in the registry, or
        pushed there from the local engine (an image built before the farm was set up)."""
        if key in self.refs:
            return self.refs[key]
        name = self.push_name(layer_name, key)
        digest = remote_digest(local or self.nodes[0], name, timeout=REMOTE_TIMEOUT_S,
                               insecure=self.registry.insecure)
        if digest is None and local is not None and local_tag:
            pushed = push(local, local_tag, self.registry)
            digest = pushed.rsplit("@", 1)[1] if "@" in pushed else None
        if digest is None:
            raise RegistryError(f"{name} is not in the registry {self.registry.url} and not in this engine")
        return self.built(layer_name, key, digest)

    def build(self, layer_name: str, key: str, request, log_path: Path, **how) -> str:
        """Build `request` (an engine.build.BuildRequest) on the least busy builder, pushed by
        BuildKit to the registry; returns its reference there, by digest. `how`: build_layer's
        on_line, cancel and redact."""
        ref = self._build_pushed(self.push_name(layer_name, key), request, log_path, how)
        self.refs[key] = ref
        return ref

    def builder_of(self, key: str) -> Engine | None:
        """The builder that built `key` in this make; None for a layer found in the registry."""
        index = self.built_on.get(self.refs.get(key, ""))
        return self.nodes[index] if index is not None else None

    def check_name(self, layer_name: str, key: str) -> str:
        """Where make --check pushes its rebuild of a layer: REGISTRY/efabuild/<layer>:check-<key12>,
        a tag of the layer's own repository (which exists, as ECR wants), never the layer's tag;
        one per key, so checks again overwrite it rather than pile up."""
        return remote_ref(f"{image_tag(layer_name, key).rsplit(':', 1)[0]}:check-{key[:12]}", self.registry)

    def rebuild(self, layer_name: str, key: str, request, log_path: Path, **how) -> str:
        """make --check's build of `request`, pushed under the layer's check tag; its reference by
        digest (what a check of the same key meanwhile pushes there does not change it)."""
        return self._build_pushed(self.check_name(layer_name, key), request, log_path, how)

    def _build_pushed(self, name: str, request, log_path: Path, how: dict) -> str:
        request = attrs.evolve(request, push=name, insecure=self.registry.insecure)
        with self.take(how.get("cancel"), platform=request.platform) as node:
            result = build_layer(node, request, log_path, **how)
        ref = f"{name}@{result.image_id}"
        self.built_on[ref] = self.nodes.index(node)
        return ref

    def forget(self, ref: str) -> None:
        """Remove a check's rebuild from the builder that made it, when that is a Docker engine
        (its BuildKit keeps what it pushes in its image store too); the registry keeps the tag."""
        index = self.built_on.pop(ref, None)
        if index is not None and not self.nodes[index].buildx_builder:
            with contextlib.suppress(EfabuildError):  # housekeeping: never hides the check's result
                untag_image(self.nodes[index], ref.split("@", 1)[0])

    def remote_image(self, ref: str, platform: str) -> RemoteImage:
        """`ref` as an export takes it: streamed by the builder that built it when that one has a
        free slot, else by the least busy."""
        return RemoteImage(ref, platform, functools.partial(self.take, prefer=self.built_on.get(ref), platform=platform),
                           self.registry)


def farm_for_make(prepared, say: Callable[[str], None]) -> Farm | None:
    """The builders of a make when they cannot see the engine's images, checked before any
    build: [registry] set, a builder answers, every base to build on is a registry's."""
    ws = prepared.ws
    farm = Farm.start(ws.settings.builder, prepared.engine, ws.settings.registry, say)
    if farm is not None:
        problem = unpullable_base(prepared, [lp.qualname for lp in prepared.plan.layers if lp.action == BUILD])
        if problem:
            raise InputError(problem, "BUILD.toml [builder]")
    return farm


def unpullable_base(prepared, to_build) -> str | None:
    """Why a builder that cannot see this engine's images cannot pull a base of `to_build`
    (None when every base is a registry's, by digest)."""
    for base in prepared.plan.bases:
        users = [name for name in to_build if (layer := prepared.graph.nodes[name]["layer"]).base
                 and layer.base.ref == base.ref]
        if not users:
            continue
        if base.source == "image-id":
            return (f"base {base.ref} is only in this engine (image {base.digest[:19]}…), which the builders "
                    "cannot see: push it to a registry they reach and name it there")
        if not base.digest:
            return f"base {base.ref} has no registry digest: the builders cannot pull it; push it to a registry"
    return None
