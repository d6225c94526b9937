"""Gather what a plan needs from the outside world: base digests, images, stored artifacts, history.

The side-effect half of planning; `plan.py` decides from these facts alone. The engine is optional:
without one the plan still works offline, with unresolved base digests and availability taken from
the build records.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import NamedTuple

from efabuild import dag, notices
from efabuild.dag import LayerGraph
from efabuild.errors import EfabuildError, InputError, NoCredentials
from efabuild.model import Workspace
from efabuild.plan import BUILD, Availability, BaseResolution, Plan, layer_inputs, make_plan
from efabuild.refs import IMAGE_REPO, KEY_TAG, image_tag
from efabuild.make.context import ContextHasher, bulk_objects, hash_contexts, never_context
from efabuild.make.hashcache import HashState
from efabuild.make.records import BuildRecords
from efabuild.store.tiered import Store


class Prepared(NamedTuple):
    ws: Workspace
    graph: LayerGraph
    order: list[str]
    plan: Plan
    engine: object | None  # efabuild.engine.client.Engine when one was reachable
    engine_error: str | None
    records: BuildRecords
    image_tags: dict[str, str]  # key -> a tag the engine has it under (empty without an engine)
    store: Store  # the store the plan asked about artifacts; the make publishes through it


def prepare(ws: Workspace, targets: Iterable[str] = (), *, use_engine: bool = True,
            require_engine: bool = False) -> Prepared:
    """The plan and what a make needs of the outside world. The cyclic garbage collector pauses
    throughout: a plan makes tens of thousands of acyclic objects and the modules it loads, which
    live as long as the process; its passes over them were 4 % of a no-op plan."""
    with bulk_objects():
        return _prepare(ws, targets, use_engine, require_engine)


def _prepare(ws: Workspace, targets: Iterable[str], use_engine: bool, require_engine: bool) -> Prepared:
    layers = dag.layer_graph(ws)
    targets, only = dag.split_targets(targets)
    unknown = sorted(only - set(ws.settings.builder.platforms))
    if unknown:
        raise InputError(f"{unknown[0]} is not one of the workspace's [builder] platforms "
                         f"({', '.join(ws.settings.builder.platforms)})", "make/plan target")
    chosen = dag.select(ws, layers, targets)
    # one node per (layer, platform): each has its own key, image, artifact and build record
    graph, order = dag.on_platforms(ws, layers, chosen, only)
    records = BuildRecords(ws.settings.store.local, ws.settings.builder.platform)
    engine_side = _EngineFacts(ws, graph, order, records, use_engine)
    local = ws.settings.store.local
    hasher = ContextHasher(ws.root, HashState(local / "state" / "hashes", below=local), exclude=never_context(ws))
    try:
        contexts = hash_contexts(ws, layers, chosen, hasher)
    except EfabuildError:
        # an engine error still comes before a context error, as when the engine was asked first
        _required(*engine_side.result()[:2], require_engine)
        raise
    engine, engine_error, bases, image_tags = engine_side.result()
    _required(engine, engine_error, require_engine)
    inputs = layer_inputs(ws.settings.builder.platform, graph, order, bases, contexts)
    keys = {inputs[name].key() for name in order}
    images = (set(image_tags) if engine else records.built_keys(chosen)) & keys
    store = _store(ws)
    holders, s3_answered = _holders(store, graph, order, inputs, remote=use_engine)
    every = len(store.tier_names) if s3_answered else len(store.fs_tiers)
    stored = {key for key, where in holders.items() if len(where) == every}
    registry = _registry_keys(ws, engine, graph, [n for n in order if inputs[n].key() not in images], inputs)
    if registry and engine is not None:
        from efabuild.make.farm import builds_through_registry  # deferred: only with [registry] (a farm's engine code)

        if builds_through_registry(ws.settings.builder, engine):  # a farm takes them from there: no pull
            images, registry = images | registry, set()
    availability = Availability(
        images=frozenset(images),
        registry=frozenset(registry),
        artifacts=frozenset(stored),
        held=frozenset(_held_keys(store, holders, remote=s3_answered)),
        engine_checked=engine is not None,
    )

    def previous(name: str):
        last = records.last_key(graph.nodes[name]["layer"].qualname, graph.nodes[name]["platform"])
        return records.inputs(last) if last else None

    plan = make_plan(graph, order, inputs, availability, previous, bases=tuple(bases.values()),
                     context_files_read=hasher.files_read, emulated=_emulated(ws, engine, order, graph))
    if require_engine and any(lp.action == BUILD for lp in plan.layers):
        engine.check_buildx()  # only a build needs it: a no-op make starts no docker process
    return Prepared(ws=ws, graph=graph, order=order, plan=plan, engine=engine, engine_error=engine_error,
                    records=records, image_tags=image_tags, store=store)


class _EngineFacts:
    """What the engine says (it answers; the bases' digests; its efabuild tags), asked on a thread
    while the contexts are walked: on its local socket that is three requests whose waiting (13 ms
    on an idle machine, more on a busy one) hides under the walk. `result()` waits for them:
    (engine or None, why none, bases, image tags), or raises what asking raised."""

    def __init__(self, ws: Workspace, graph: LayerGraph, order: list[str], records: BuildRecords,
                 use_engine: bool) -> None:
        self._thread: threading.Thread | None = None
        if not use_engine:  # offline: the records answer, nothing to wait for
            self._outcome = (True, (None, "--offline", _resolve_bases(ws, graph, order, None, records), {}))
            return
        self._thread = threading.Thread(target=self._ask, args=(ws, graph, order, records),
                                        name="efabuild-engine-facts", daemon=True)
        self._thread.start()

    def _ask(self, ws: Workspace, graph: LayerGraph, order: list[str], records: BuildRecords) -> None:
        try:
            engine, engine_error = _connect(ws)
            bases = _resolve_bases(ws, graph, order, engine, records)
            self._outcome = (True, (engine, engine_error, bases, _engine_tags(engine) if engine else {}))
        except BaseException as exc:  # raised again in the thread that waits in result()
            self._outcome = (False, exc)

    def result(self) -> tuple:
        if self._thread is not None:
            self._thread.join()
        done, value = self._outcome
        if not done:
            raise value
        return value


def _required(engine, engine_error: str | None, require_engine: bool) -> None:
    if require_engine and engine is None:
        raise EfabuildError(engine_error or "no engine")


def _store(ws: Workspace) -> Store:
    return Store.from_config(ws.settings.store)


def _connect(ws: Workspace):
    try:  # deferred, as every engine import here: plan --offline asks no engine
        from efabuild.engine.client import EngineUnavailable, connect
    except ImportError as exc:  # the engine package is part of efabuild; this is a broken install
        return None, f"engine support missing: {exc}"
    try:
        engine = connect(ws.settings.builder)
        engine.check(need_buildx=False)
    except EngineUnavailable as exc:
        return None, str(exc)
    return engine, None


def _resolve_bases(ws: Workspace, graph: LayerGraph, order: list[str], engine,
                   records: BuildRecords) -> dict:
    """Each base's digest, by ref; in a several-platform workspace by (ref, platform), where a
    multi-platform base (an index) is resolved to each platform's own manifest."""
    several = ws.settings.builder.several
    bases: dict = {}
    asked: dict = {}  # ref -> the registry's answer: one question serves every platform
    for name in order:
        layer, platform = graph.nodes[name]["layer"], graph.nodes[name].get("platform")
        slot = (layer.base.ref, platform) if layer.base and several else layer.base.ref if layer.base else None
        if slot is None or slot in bases:
            continue
        ref = layer.base.ref
        on = platform if several else None
        if layer.base.digest:
            bases[slot] = BaseResolution(ref=ref, digest=layer.base.digest, source="pinned", platform=on)
            continue
        digest, source, index = None, "unresolved", None
        if engine is not None:
            from efabuild.engine.images import base_identity_for

            digest, source, index = base_identity_for(engine, ref, on, asked=asked)
        else:
            # offline: the digest this base had at its last build, so recorded keys still match
            roots = [(graph.nodes[n]["layer"].qualname, graph.nodes[n].get("platform")) for n in order
                     if graph.nodes[n]["layer"].base and graph.nodes[n].get("platform") == platform]
            digest = _recorded_digest(records, ref, roots)
            source = "recorded" if digest else "unresolved"
        bases[slot] = BaseResolution(ref=ref, digest=digest, source=source, platform=on, index_digest=index)
    return bases


def _emulated(ws: Workspace, engine, order: list[str], graph: LayerGraph) -> frozenset[str]:
    """The platforms of this plan that no builder runs natively and [builder] emulate allows."""
    allowed = set(ws.settings.builder.emulate)
    wanted = {graph.nodes[name]["platform"] for name in order} & allowed
    if not wanted or engine is None:
        return frozenset(wanted)
    from efabuild.make.farm import native_platforms  # deferred: only with [builder] emulate

    return frozenset(wanted - native_platforms(ws.settings.builder, engine))


def _recorded_digest(records: BuildRecords, ref: str, roots: list[tuple[str, str | None]]) -> str | None:
    for name, platform in roots:
        last = records.last_key(name, platform)
        inputs = records.inputs(last) if last else None
        if inputs is not None and inputs.base_ref == ref and inputs.base_digest:
            return inputs.base_digest
    return None


def _engine_tags(engine) -> dict[str, str]:
    """key -> one tag holding it: identical inputs in another graph share the image."""
    from efabuild.engine.images import existing_tags

    tags: dict[str, str] = {}
    for tag in sorted(existing_tags(engine, repo_prefix=f"{IMAGE_REPO}/")):
        candidate = tag.rsplit(":", 1)[-1]
        if KEY_TAG.match(candidate):
            tags.setdefault(candidate, tag)
    return tags


def _registry_keys(ws: Workspace, engine, graph, order, inputs) -> set[str]:
    registry = ws.settings.registry
    if registry is None or engine is None:
        return set()
    from efabuild.engine.registry import RegistryError, has  # deferred: only with [registry]

    found = set()
    for name in order:
        key = inputs[name].key()
        try:
            if has(engine, image_tag(graph.nodes[name]["layer"].name, key), registry):
                found.add(key)
        except RegistryError as exc:
            # an outage must not stop local work: layers missing locally are then built
            notices.warn(f"layer-cache registry not used: {exc}")
            return found
    return found


def _held_keys(store: Store, holders: dict[str, tuple[str, ...]], remote: bool) -> set[str]:
    """Keys whose .sqsh a filesystem tier holds, or (`remote`: S3 answered) S3 in chunks: the
    other tiers get a copy, no export. `holders`: the tiers already found holding each key."""
    if remote:
        try:
            with store.s3.asking_quickly():
                return {key for key, where in holders.items() if store.held(key, where)}
        except EfabuildError as exc:
            notices.warn(f"S3 tier not consulted: {exc}")
    on_fs = {tier.name for tier in store.fs_tiers}
    return {key for key, where in holders.items() if store.held(key, tuple(t for t in where if t in on_fs))}


def _holders(store: Store, graph, order, inputs, remote: bool) -> tuple[dict[str, tuple[str, ...]], bool]:
    """({artifact key: the tiers holding it}, whether S3 answered): every tier asked once; with
    `remote` False (offline) or S3 out of reach, the filesystem tiers alone."""
    artifact_keys = [inputs[n].key() for n in order if graph.nodes[n]["layer"].artifact]
    if remote and artifact_keys and store.s3_settings is not None:
        try:
            with store.s3.asking_quickly():
                return {key: store.where(key, checked=True) for key in artifact_keys}, True
        except NoCredentials as exc:  # a make still builds and publishes to the other tiers
            store.skip_s3(exc.reason)
        except EfabuildError as exc:
            notices.warn(f"S3 tier not consulted: {exc}")
    return {key: store.where(key, remote=False, checked=True) for key in artifact_keys}, False
