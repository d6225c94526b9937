"""The plan: every selected layer's key, whether it is available, and why it must be (re)built.

Pure: decisions from facts passed in. `efabuild.make.prepare` gathers them (context digests,
base digests, the images the engine has, the artifacts the store holds, the last build of each
layer); keys come from `LayerInputs`. Like a Nix dry run, the
plan separates what will be built from what will be fetched (pulled from the layer-cache registry)
or only exported or copied between store tiers, and a layer nobody needs is left alone even when
its image is gone. A key is provisional while its base's digest is not known for sure (offline, or
unresolved): it may change once the digest is known.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import NamedTuple, TYPE_CHECKING

from efabuild.keys import ContextEntry, LayerInputs
from efabuild.refs import layer_of, short
from efabuild.model import Layer
from efabuild.redact import shown_args, shown_dockerfile

if TYPE_CHECKING:
    from efabuild.dag import LayerGraph

BUILD, PULL, EXPORT, COPY, NOTHING = "build", "pull", "export", "copy", "none"
EMULATED = "emulated (QEMU, many times slower)"
# base sources whose digest may not be the one a make will find: keys over them may change
UNSURE_BASES = ("recorded", "unresolved")


class BaseResolution(NamedTuple):
    ref: str
    digest: str | None
    source: str  # "pinned", "registry", "image-id", "recorded" (offline) or "unresolved"
    # in a several-platform workspace: the platform this resolution is for, and (a multi-platform
    # base) the index's digest; `digest` is then that platform's manifest in it
    platform: str | None = None
    index_digest: str | None = None

    def to_json(self) -> dict:
        return {name: value for name, value in self._asdict().items()
                if value is not None or name not in ("platform", "index_digest")}


class Availability(NamedTuple):
    images: frozenset[str] = frozenset()  # keys whose image the engine has
    registry: frozenset[str] = frozenset()  # keys the layer-cache registry has
    artifacts: frozenset[str] = frozenset()  # keys whose .sqsh every store tier holds
    held: frozenset[str] = frozenset()  # keys whose .sqsh a filesystem tier holds: copied, not exported
    engine_checked: bool = True  # False: `images` comes from build records, not the engine


class LayerPlan(NamedTuple):
    qualname: str
    key: str
    inputs: LayerInputs
    artifact: bool
    action: str  # build / pull / export / copy / none
    reasons: tuple[str, ...] = ()
    image: bool = False  # the engine has the image
    stored: bool = False  # every store tier has the .sqsh
    parent: str | None = None
    provisional: bool = False  # the key may change once its base's digest is known
    platform: str = ""  # what it is built for (also in `inputs`); `qualname` carries it as @os/arch
    emulated: bool = False  # built under QEMU: no builder of its platform

    @property
    def layer(self) -> str:
        """The layer's own graph:layer, without the platform: its name in the store."""
        return layer_of(self.qualname)

    @property
    def short_key(self) -> str:
        return short(self.key)

    @property
    def state(self) -> str:
        return "available" if self.action == NOTHING else "to " + self.action

    @property
    def why(self) -> tuple[str, ...]:
        """Its reasons, with emulation said first: the user should know before a long build."""
        return ((EMULATED,) if self.emulated and self.action == BUILD else ()) + self.reasons


class Plan(NamedTuple):
    layers: tuple[LayerPlan, ...]
    bases: tuple[BaseResolution, ...]
    engine_checked: bool
    context_files_read: int = 0

    def by_name(self) -> dict[str, LayerPlan]:
        return {lp.qualname: lp for lp in self.layers}

    def chain(self, qualname: str) -> list[LayerPlan]:
        """The layer and its ancestors, root first: what a manifest describes."""
        plans = self.by_name()
        chain = [plans[qualname]]
        while chain[-1].parent is not None:
            chain.append(plans[chain[-1].parent])
        return chain[::-1]

    def of(self, action: str) -> list[LayerPlan]:
        return [lp for lp in self.layers if lp.action == action]

    def to_json(self) -> dict:
        return {
            "engine_checked": self.engine_checked,
            "context_files_read": self.context_files_read,
            "bases": [b.to_json() for b in self.bases],
            "layers": [
                {"name": lp.qualname, "layer": lp.layer, "platform": lp.platform, "key": lp.key,
                 "state": lp.state, "action": lp.action,
                 "artifact": lp.artifact, "image": lp.image, "stored": lp.stored,
                 "provisional": lp.provisional, "emulated": lp.emulated,
                 "reasons": list(lp.why), "inputs": lp.inputs.to_shown_dict()}
                for lp in self.layers
            ],
        }


def layer_inputs(
    platform: str, graph: LayerGraph, order: list[str], bases: Mapping[str, BaseResolution],
    contexts: Mapping[str, tuple[ContextEntry, ...]],
) -> dict[str, LayerInputs]:
    """Inputs (and so keys) of the nodes in `order`, which lists parents before children;
    `contexts` holds each layer's hashed context entries, by graph:layer. A node of a
    several-platform graph (dag.on_platforms) says its platform and parent node; `bases` then
    holds a resolution per (ref, platform). Otherwise every node is on `platform`."""
    inputs: dict[str, LayerInputs] = {}
    for name in order:
        node = graph.nodes[name]
        layer: Layer = node["layer"]
        on = node.get("platform") or platform
        common = dict(dockerfile=layer.dockerfile, platform=on, args=layer.args, secrets=layer.secrets,
                      context=contexts.get(layer.qualname, ()), exclude=layer.exclude)
        if layer.parent:
            inputs[name] = LayerInputs(parent_key=inputs[node.get("parent") or layer.parent].key(), **common)
        else:
            base = bases.get((layer.base.ref, on)) or bases[layer.base.ref]
            inputs[name] = LayerInputs(base_ref=base.ref, base_digest=base.digest, **common)
    return inputs


def make_plan(
    graph: LayerGraph, order: list[str], inputs: Mapping[str, LayerInputs], availability: Availability,
    previous: Callable[[str], LayerInputs | None], bases: tuple[BaseResolution, ...] = (),
    context_files_read: int = 0, emulated: frozenset[str] = frozenset(),
) -> Plan:
    """Decide each layer's action; `previous(name)` gives the inputs of its last recorded build;
    a layer on a platform in `emulated` is built under QEMU, and its reasons say so."""
    keys = {name: inputs[name].key() for name in order}
    selected = set(order)
    actions: dict[str, str] = {}
    for name in reversed(order):  # children before parents: a parent is needed if a child builds
        layer: Layer = graph.nodes[name]["layer"]
        key = keys[name]
        needs_artifact = layer.artifact and key not in availability.artifacts
        children = [c for c in graph.successors(name) if c in selected]
        child_builds = any(actions.get(c) == BUILD for c in children)
        # the goal of a make: every artifact as a .sqsh, and every top image that is no artifact
        wanted_image = not children and not layer.artifact
        actions[name] = _action(key, availability, needs_artifact, needs_image=child_builds or wanted_image)
    # by (ref, platform): one platform's unresolved digest leaves the other's keys sure
    unsure = {(base.ref, base.platform) for base in bases if base.source in UNSURE_BASES}
    provisional: dict[str, bool] = {}
    layers = []
    for name in order:
        layer = graph.nodes[name]["layer"]
        key = keys[name]
        reasons: tuple[str, ...] = ()
        if actions[name] == BUILD:
            reasons = explain(previous(name), inputs[name], layer.parent, keys)
        elif actions[name] == EXPORT:
            reasons = ("the .sqsh is not in every store tier yet",)
        elif actions[name] == COPY:
            reasons = ("the .sqsh is in another store tier",)
        elif actions[name] == PULL:
            reasons = ("image in the layer-cache registry",)
        parent = graph.nodes[name].get("parent") or layer.parent
        provisional[name] = provisional[parent] if parent else bool(
            {(inputs[name].base_ref, None), (inputs[name].base_ref, inputs[name].platform)} & unsure)
        layers.append(LayerPlan(
            qualname=name, key=key, inputs=inputs[name], artifact=layer.artifact, action=actions[name],
            reasons=reasons, image=key in availability.images, stored=key in availability.artifacts,
            parent=parent, provisional=provisional[name], platform=inputs[name].platform,
            emulated=inputs[name].platform in emulated,
        ))
    return Plan(layers=tuple(layers), bases=bases, engine_checked=availability.engine_checked,
                context_files_read=context_files_read)


def _action(key: str, availability: Availability, needs_artifact: bool, needs_image: bool) -> str:
    """What a layer needs done: its image when a child builds on it or it is a top image layer,
    its .sqsh in every tier when it is an artifact layer: copied from a tier that has it, else
    exported from the image."""
    if not (needs_artifact or needs_image):
        return NOTHING
    if key not in availability.images and (needs_image or key not in availability.held):
        return PULL if key in availability.registry else BUILD
    if needs_artifact:
        return COPY if key in availability.held else EXPORT
    return NOTHING


def explain(old: LayerInputs | None, new: LayerInputs, parent: str | None, keys: Mapping[str, str]) -> tuple[str, ...]:
    """Why a layer must build: what differs from the inputs of its last recorded build."""
    if old is None:
        return ("new layer (no earlier build recorded)",)
    reasons: list[str] = []
    if old.parent_key != new.parent_key:
        reasons.append(f"parent {parent.split(':', 1)[1] if parent else '?'} changed")
    if old.base_ref != new.base_ref:
        reasons.append(f"base {old.base_ref} → {new.base_ref}")
    elif old.base_digest != new.base_digest:
        reasons.append(f"base digest {_short_digest(old.base_digest)} → {_short_digest(new.base_digest)}")
    if old.platform != new.platform:
        reasons.append(f"platform {old.platform} → {new.platform}")
    old_args, new_args = shown_args(dict(old.args)), shown_args(dict(new.args))
    for name in sorted(old_args.keys() | new_args.keys()):
        before, after = old_args.get(name), new_args.get(name)
        if before == after:
            continue
        if before is None:
            reasons.append(f"{name} added: {after}")
        elif after is None:
            reasons.append(f"{name} removed (was {before})")
        else:
            reasons.append(f"{name} {before} → {after}")
    for name in sorted(set(old.secrets) ^ set(new.secrets)):
        reasons.append(f"secret {name} {'added' if name in new.secrets else 'removed'}")
    if old.exclude != new.exclude:
        reasons.append(f"exclude {list(old.exclude)} → {list(new.exclude)}")
    # records keep the text as shown (secret defaults as digests): compare it the same way
    old_text, new_text = shown_dockerfile(old.dockerfile), shown_dockerfile(new.dockerfile)
    if old_text != new_text:
        added = removed = 0
        for line in difflib.ndiff(old_text.splitlines(), new_text.splitlines()):
            added += line.startswith("+ ")
            removed += line.startswith("- ")
        reasons.append(f"Dockerfile: +{added} −{removed} lines")
    reasons += _context_changes(old, new)
    if not reasons:
        reasons.append("image missing from the engine (same inputs as the last build)")
    return tuple(reasons)


def _context_changes(old: LayerInputs, new: LayerInputs, limit: int = 5) -> list[str]:
    before = {e.path: e for e in old.context}
    after = {e.path: e for e in new.context}
    changes = []
    for path in sorted(before.keys() | after.keys()):
        if path not in before:
            changes.append(f"context {path} added")
        elif path not in after:
            changes.append(f"context {path} removed")
        elif before[path].digest != after[path].digest:
            changes.append(f"context {path} changed")
        elif before[path].mode != after[path].mode:
            changes.append(f"context {path} mode {before[path].mode} → {after[path].mode}")
    if len(changes) > limit:
        return changes[:limit] + [f"… and {len(changes) - limit} more context changes"]
    return changes


def _short_digest(digest: str | None) -> str:
    return digest.split(":", 1)[-1][:12] if digest else "unresolved"
