"""The builders of a make, as one interface that make/run.py calls: `LocalBuilders` (the engine
efabuild inspects builds and holds every image) and `FarmBuilders` (builders that cannot see it,
reached through [registry]). Each has slots, obtain (a layer the registry has), build, own_tag,
made_meanwhile, has_image, parent_ref (what a child's FROM names), versions (for the manifest) and
remote_image (where an export streams from); run.py chooses one (start_builders) and never asks which it has.

Which builder builds which platform: what each builder runs natively, and the check, before any
build, that every platform to build has one (or may be emulated).

A builder's native platforms are what it declares (`[builder] farm` entries `NAME@linux/arm64`)
or, undeclared, its engine's own os/arch. BuildKit's platform list is no answer: once QEMU is
registered in binfmt_misc it lists every emulated platform too, and an emulated build of a CUDA
stack is many times slower; only `[builder] emulate` lets a platform fall back to QEMU.
"""

from __future__ import annotations

import threading

from efabuild.engine.build import builder_name
from efabuild.errors import EfabuildError, InputError
from efabuild.make.farm import farm_for_make, native_platforms
from efabuild.make.publish import engine_versions
from efabuild.plan import BUILD
from efabuild.refs import image_tag, short


def check_local_bases(prepared) -> None:  # noqa: ANN001 - a Prepared
    """One line, before any build, for a base that is a local image of one platform while a layer
    to build needs it for another: Docker's image store keeps one platform per tag, so BuildKit
    would look for the other platform's image on docker.io and fail mid-make."""
    bases = prepared.plan.bases
    for lp in prepared.plan.layers:
        base = next((b for b in bases if b.ref == lp.inputs.base_ref and b.platform == lp.platform), None)
        if lp.action != BUILD or lp.parent is not None or base is None or base.source != "unresolved":
            continue
        local = [b.platform for b in bases if b.ref == base.ref and b.source == "image-id"]
        if local:
            raise InputError(
                f"{lp.qualname}: base {base.ref} is a local image of {', '.join(local)} only, and no registry "
                f"has it for {lp.platform} (Docker's image store keeps one platform per tag): name a "
                "multi-platform image in a registry (build-fixtures --registry makes one of the demo's base)",
                f"{prepared.ws.relpath(prepared.graph.nodes[lp.qualname]['layer'].source)}: "
                f"layers.{prepared.graph.nodes[lp.qualname]['layer'].name}.base")


def check_platforms(prepared, native: set[str]) -> None:  # noqa: ANN001 - a Prepared
    """One line, before any build, when a layer to build is for a platform no builder runs
    natively and [builder] emulate does not allow QEMU for it."""
    allowed = set(prepared.ws.settings.builder.emulate)
    for lp in prepared.plan.layers:
        if lp.action == BUILD and lp.platform not in native and lp.platform not in allowed:
            shown = ", ".join(sorted(native)) or "none"
            raise InputError(
                f"{lp.qualname}: no builder runs {lp.platform} (native: {shown}); add a builder of it to "
                f"[builder] farm (e.g. \"buildx:NAME@{lp.platform}\"), or allow QEMU emulation, many times "
                f"slower: emulate = [\"{lp.platform}\"]", "BUILD.toml: builder")


class LocalBuilders:
    """The engine efabuild inspects builds every layer, and holds its image: a parent is `FROM`
    its tag there, a pulled layer is pulled into it, an export reads from it, and a build is
    pushed to [registry] (when set) for other machines."""

    def __init__(self, runner) -> None:  # noqa: ANN001 - a make.run.LayerRunner
        self.r = runner
        self._pulled: set[str] = set()  # keys whose image this make pulled: built by another machine

    def slots(self, jobs: int) -> int:
        return jobs

    def obtain(self, layer, lp) -> str | None:  # noqa: ANN001
        """Make a layer the registry has available to builds and exports: pulled here; its step."""
        self.r.reporter.started(lp.qualname, "pull", short(lp.key))
        tag = image_tag(layer.name, lp.key)
        registry = self.r.ws.settings.registry
        if not self.r.steps.pull(tag, registry):
            raise EfabuildError(f"{lp.qualname}: {tag} vanished from the registry {registry.url}")
        self.r.tags[lp.key] = tag
        self._pulled.add(lp.key)
        return "pull"

    def build(self, layer, lp, request, log_path, **how) -> list[str]:  # noqa: ANN001
        """Build `request` in the engine; the steps beyond the build (a push to [registry])."""
        self.r.steps.build(request, log_path, **how)
        self.r.tags[lp.key] = request.tag
        if self.r.ws.settings.registry is None:
            return []
        self.r.steps.push(image_tag(layer.name, lp.key), self.r.ws.settings.registry)
        return ["push"]

    def own_tag(self, layer, lp) -> None:  # noqa: ANN001
        """A layer whose image exists under another layer's name gets its own tag too."""
        own = image_tag(layer.name, lp.key)
        existing = self.r.tags.get(lp.key)
        if existing and existing != own:
            self.r.steps.tag(existing, own)
        if existing:
            self.r.tags.setdefault(lp.key, own)

    def made_meanwhile(self, layer, lp) -> bool:  # noqa: ANN001
        """Whether another make built this key while this one planned or waited for its lock."""
        tag = image_tag(layer.name, lp.key)
        if not self.r.steps.has_image(tag):
            return False
        self.r.tags[lp.key] = tag
        return True

    def has_image(self, key: str) -> bool:
        return key in self.r.tags

    def parent_ref(self, lp, parent, parent_key: str) -> str:  # noqa: ANN001
        tag = self.r.tags.get(parent_key)
        if tag is None:
            raise EfabuildError(f"{lp.qualname}: parent image {short(parent_key)} is not in the engine")
        return tag

    def versions(self, key: str) -> dict:
        """The engine's tool versions for `key`'s manifest; none for a layer pulled from the
        registry: another machine built it, and no record names which."""
        return {} if key in self._pulled else self.r.builder_versions

    def remote_image(self, layer, lp, tag: str | None = None):  # noqa: ANN001, ANN201
        return None  # the export reads the image from the engine itself


class FarmBuilders:
    """Builders that cannot see the engine's images (a farm, or a buildx builder of another
    driver): layers reach each other through [registry] by digest, builds push there, exports
    stream from a builder, and each layer goes to a builder of its platform (Farm.take)."""

    def __init__(self, runner, farm) -> None:  # noqa: ANN001 - a make.run.LayerRunner, a make.farm.Farm
        self.r = runner
        self.farm = farm
        self._node_versions: dict[int, dict] = {}  # id(farm node) -> its tool versions
        self._lock = threading.Lock()

    def slots(self, jobs: int) -> int:
        return self.farm.slots  # [builder] jobs on each builder

    def obtain(self, layer, lp) -> str | None:  # noqa: ANN001
        self.farm.ref(self.r.engine, layer.name, lp.key)  # builders and exports take it from there
        return None

    def build(self, layer, lp, request, log_path, **how) -> list[str]:  # noqa: ANN001
        self.farm.build(layer.name, lp.key, request, log_path, **how)
        return []  # BuildKit pushed it

    def own_tag(self, layer, lp) -> None:  # noqa: ANN001
        pass  # no engine image to name

    def made_meanwhile(self, layer, lp) -> bool:  # noqa: ANN001
        return False

    def has_image(self, key: str) -> bool:
        return True  # in the registry, or the export says it is not

    def parent_ref(self, lp, parent, parent_key: str) -> str:  # noqa: ANN001
        return self.farm.ref(self.r.engine, parent.name, parent_key, self.r.tags.get(parent_key))

    def versions(self, key: str) -> dict:
        """The tool versions of the node that built `key` in this make (asked once per node,
        `node` naming its [builder] farm entry); none for a layer it did not build in this make."""
        node = self.farm.builder_of(key)
        if node is None:
            return {}
        with self._lock:
            if id(node) not in self._node_versions:
                self._node_versions[id(node)] = {**engine_versions(node), "node": builder_name(node)}
            return self._node_versions[id(node)]

    def remote_image(self, layer, lp, tag: str | None = None):  # noqa: ANN001, ANN201 - an export.artifact.RemoteImage
        """The layer's image in the registry (or `tag`, a check's rebuild there), streamed by a
        builder of its platform."""
        ref = tag or self.farm.ref(self.r.engine, layer.name, lp.key, self.r.tags.get(lp.key))
        return self.farm.remote_image(ref, lp.platform)


def builders_for(runner, farm) -> LocalBuilders | FarmBuilders:  # noqa: ANN001
    """The builders of a make: a farm's (make.farm.Farm) when one is set up, else the engine."""
    return LocalBuilders(runner) if farm is None else FarmBuilders(runner, farm)


def start_builders(runner, prepared, say) -> LocalBuilders | FarmBuilders:  # noqa: ANN001
    """The builders of a make with work, checked before any build: the farm's builders answer and
    can pull every base; every platform to build has a builder, or may be emulated."""
    farm = farm_for_make(prepared, say)
    if any(lp.action == BUILD for lp in prepared.plan.layers):
        check_local_bases(prepared)
        check_platforms(prepared, native_platforms(prepared.ws.settings.builder, prepared.engine,
                                                   farm.nodes if farm is not None else None))
    return builders_for(runner, farm)
