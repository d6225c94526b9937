"""`efabuild make`: run a plan. Pull or build each layer in dependency order, then export, describe
and publish every artifact layer.

Independent layers run in parallel (`jobs`); a failed layer skips its descendants while other
branches finish. Every build's full log is kept under the local store.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

import attrs

from efabuild import notices
from efabuild.errors import EfabuildError, InputError
from efabuild.model import Layer, Workspace
from efabuild.plan import BUILD, NOTHING, PULL, LayerPlan
from efabuild.redact import Redactor, dockerfile_secret_values, is_secret_arg
from efabuild.refs import image_tag, short
from efabuild.build.context import SOURCE_DATE_EPOCH, context_dir
from efabuild.build.prepare import Prepared
from efabuild.build.reporter import Reporter
from efabuild.build.stops import step_boundary

BUILT, PULLED, EXPORTED, REUSED, FAILED, SKIPPED = "built", "pulled", "exported", "reused", "failed", "skipped"


@attrs.frozen
class Outcome:
    qualname: str
    key: str
    status: str
    seconds: float = 0.0
    steps: tuple[str, ...] = ()  # what ran for this layer: pull, build, push, export
    log: str = ""  # the build log kept under the store
    artifact: str = ""  # the .sqsh path in the store
    error: str = ""  # why it failed or was skipped


@attrs.frozen
class MakeResult:
    outcomes: tuple[Outcome, ...]

    @property
    def failed(self) -> bool:
        return any(o.status == FAILED for o in self.outcomes)


class _Runner:
    def __init__(self, prepared: Prepared, reporter: Reporter) -> None:
        self.p = prepared
        self.cancel = threading.Event()  # set on interrupt: running builds stop, nothing is tagged
        self.ws: Workspace = prepared.ws
        self.engine = prepared.engine
        self.reporter = reporter
        self.store_root = self.ws.settings.store.local
        self.plans = prepared.plan.by_name()
        # key -> a tag that has it, as the plan saw the engine; grows as layers are built or pulled
        self.tags: dict[str, str] = dict(prepared.image_tags)
        self.store = prepared.store
        # every secret of this make is hidden in every build's output, whichever layer it belongs to
        self.redact = output_redactor(prepared)

    # --- one layer ---------------------------------------------------------------------------

    def run_layer(self, lp: LayerPlan) -> Outcome:
        """Build or pull, export and publish one layer, holding its key's build lock: concurrent
        makes of one key on this host build it once, the others wait and then reuse it."""
        from efabuild.engine.build import BuildInterrupted

        layer: Layer = self.p.graph.nodes[lp.qualname]["layer"]
        started = time.monotonic()
        lock = self.store.local_tier.build_lock(
            lp.key, on_wait=lambda _: self.reporter.started(lp.qualname, "wait", "another make has this key"))
        if not lock.acquire_unless(self.cancel):
            raise BuildInterrupted(f"{lp.qualname}: interrupted while waiting for another make of this key")
        try:
            return self._run_layer_locked(layer, lp, started)
        finally:
            lock.release()

    def _run_layer_locked(self, layer: Layer, lp: LayerPlan, started: float) -> Outcome:
        steps: list[str] = []
        log = artifact = ""
        status = REUSED
        action = lp.action
        if action in (PULL, BUILD) and self._made_meanwhile(layer, lp):
            action = NOTHING  # another make built it while this one planned or waited
        if action == PULL:
            self.reporter.started(lp.qualname, "pull", short(lp.key))
            self._pull(layer, lp)
            steps.append("pull")
            status = PULLED
        elif action == BUILD:
            self.reporter.started(lp.qualname, "build", "; ".join(lp.reasons))
            log = self._build(layer, lp)
            steps.append("build")
            status = BUILT
            if self.ws.settings.registry is not None:
                self._push(layer, lp)
                steps.append("push")
        self._ensure_own_tag(layer, lp)
        if layer.artifact and self.store.has(lp.key):
            self.store.name(lp.qualname, lp.key)  # no-op unless the artifact came from another name
        elif layer.artifact:
            if self.store.complete(lp.key) is not None:
                # another tier had it: copied across, no export needed
                self.store.name(lp.qualname, lp.key)
                artifact = str(self.store.lookup(lp.key, fetch=False))
                steps.append("copy between tiers")
            else:
                if not steps:
                    self.reporter.started(lp.qualname, "export", short(lp.key))
                artifact = self._export_and_publish(layer, lp)
                steps.append("export")
                status = EXPORTED if status == REUSED else status
        return Outcome(lp.qualname, lp.key, status, time.monotonic() - started, tuple(steps), log, artifact)

    def _made_meanwhile(self, layer: Layer, lp: LayerPlan) -> bool:
        from efabuild.engine.images import image_exists

        tag = image_tag(layer.name, lp.key)
        if not image_exists(self.engine, tag):
            return False
        self.tags[lp.key] = tag
        return True

    def sweep_leftovers(self) -> None:
        """Remove what makes killed on this host left behind: temp files and build contexts in
        the store tiers, export containers in the engine. A live make's are never touched."""
        from efabuild.engine.leftovers import dead_export_containers, remove_containers

        try:
            for tier in self.store.fs_tiers:
                for item in tier.debris():
                    tier.remove_debris(item)
            if self.engine is not None:
                stores = [tier.root for tier in self.store.fs_tiers]
                remove_containers(self.engine, dead_export_containers(self.engine, stores))
        except (OSError, EfabuildError) as exc:  # housekeeping: never a reason to fail the make
            notices.warn(f"leftovers of earlier makes not removed: {exc}")

    def alias(self, lp: LayerPlan) -> None:
        """A layer whose key another layer just made: give it its own tag and store name."""
        layer: Layer = self.p.graph.nodes[lp.qualname]["layer"]
        if lp.key in self.tags:
            self._ensure_own_tag(layer, lp)
        if layer.artifact and self.store.has(lp.key):
            self.store.name(lp.qualname, lp.key)

    def _pull(self, layer: Layer, lp: LayerPlan) -> None:
        from efabuild.engine.registry import pull

        tag = image_tag(layer.name, lp.key)
        if not pull(self.engine, tag, self.ws.settings.registry):
            raise EfabuildError(f"{lp.qualname}: {tag} vanished from the registry {self.ws.settings.registry.url}")
        self.tags[lp.key] = tag

    def _push(self, layer: Layer, lp: LayerPlan) -> None:
        from efabuild.engine.registry import push

        push(self.engine, image_tag(layer.name, lp.key), self.ws.settings.registry)

    def _ensure_own_tag(self, layer: Layer, lp: LayerPlan) -> None:
        """A layer whose image exists under another layer's name gets its own tag too."""
        from efabuild.engine.images import tag_image

        own = image_tag(layer.name, lp.key)
        existing = self.tags.get(lp.key)
        if existing and existing != own:
            tag_image(self.engine, existing, own)
        if existing:
            self.tags.setdefault(lp.key, own)

    def from_line(self, layer: Layer, lp: LayerPlan) -> str:
        if layer.parent:
            parent_key = self.plans[layer.parent].key
            tag = self.tags.get(parent_key)
            if tag is None:
                raise EfabuildError(f"{lp.qualname}: parent image {short(parent_key)} is not in the engine")
            return f"FROM {tag}"
        digest = lp.inputs.base_digest
        base = next(b for b in self.p.plan.bases if b.ref == layer.base.ref)
        # only a registry digest can be pinned in FROM; a local image ID is matched by the tag
        if digest and base.source in ("pinned", "registry"):
            return f"FROM {layer.base.ref}@{digest}"
        return f"FROM {layer.base.ref}"

    def build_request(self, layer: Layer, lp: LayerPlan, context_dir: Path, tag: str, *, no_cache: bool = False):
        from efabuild.engine.build import BuildRequest

        return BuildRequest(
            tag=tag,
            dockerfile=generated_dockerfile(self.from_line(layer, lp), layer.dockerfile),
            context_dir=context_dir,
            build_args=dict(layer.args),
            secrets=layer.secrets,
            labels={"org.efabuild.key": lp.key, "org.efabuild.graph": layer.graph,
                    "org.efabuild.layer": layer.name},
            platform=self.ws.settings.builder.platform,
            source_date_epoch=SOURCE_DATE_EPOCH,
            no_cache=no_cache,
        )

    def _build(self, layer: Layer, lp: LayerPlan) -> str:
        from efabuild.engine.build import build_layer

        log_path = self.store_root / "logs" / layer.graph / layer.name / f"{lp.key}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with self._context_dir(layer, lp) as context_dir:
            request = self.build_request(layer, lp, context_dir, image_tag(layer.name, lp.key))
            step_boundary("build")
            build_layer(self.engine, request, log_path,
                        on_line=lambda text: self.reporter.line(lp.qualname, text), cancel=self.cancel,
                        redact=self.redact)
        self.tags[lp.key] = request.tag
        self.p.records.record(lp.qualname, lp.key, lp.inputs)
        return str(log_path)

    def _context_dir(self, layer: Layer, lp: LayerPlan):
        """A build context holding exactly the files the key was computed from, as the key saw them."""
        return context_dir(self.ws.root, self.store_root / "tmp", layer.name, lp.inputs.context)

    # --- artifacts ---------------------------------------------------------------------------

    @functools.cached_property
    def builder_versions(self) -> dict:
        """The engine's tool versions for manifests: asked once per make, not per artifact."""
        from efabuild.build.publish import engine_versions

        return engine_versions(self.engine)

    @functools.cached_property
    def signer(self):  # noqa: ANN201 - a signing.Signer, or None without [sign]
        """The [sign] key, loaded once per make (KMS: one GetPublicKey)."""
        sign = self.ws.settings.sign
        if sign is None:
            return None
        from efabuild.signing.keys import signer_for

        return signer_for(sign.key, root=self.ws.root, region=sign.region, endpoint_url=sign.endpoint_url)

    def _export_and_publish(self, layer: Layer, lp: LayerPlan) -> str:
        from efabuild.build import publish as artifacts

        path = artifacts.export_and_publish(
            ws=self.ws, store=self.store, engine=self.engine, layer=layer, plan=lp, prepared=self.p,
            tag=self.tags[lp.key], reporter=self.reporter, epoch=SOURCE_DATE_EPOCH,
            builder_versions=self.builder_versions, signer=self.signer, cancel=self.cancel,
        )
        return str(path)


def generated_dockerfile(from_line: str, text: str) -> str:
    """The Dockerfile a layer is built from. A build arg reaches RUN steps only when declared:
    with SOURCE_DATE_EPOCH in their environment, pip and compileall write hash-checked .pyc files,
    which stay valid when the export clamps their sources' times."""
    return f"{from_line}\nARG SOURCE_DATE_EPOCH\n{text}"


def check_secrets(prepared: Prepared, environ=os.environ) -> None:
    """Every secret a layer to build reads is set: one line naming the layer's key, before any build."""
    for name, lp in prepared.plan.by_name().items():
        layer: Layer = prepared.graph.nodes[name]["layer"]
        missing = [secret for secret in layer.secrets if secret not in environ]
        if lp.action == BUILD and missing:
            raise InputError(f"{missing[0]} is not set: export it before make (the build reads it as a "
                             f"BuildKit secret, never stored)",
                             f"{prepared.ws.relpath(layer.source)}: layers.{layer.name}.secrets")


def output_redactor(prepared: Prepared, environ=os.environ) -> Redactor:
    """Hides the secret values of every layer in what make prints: messages, summary, --json."""
    values = []
    for name in prepared.order:
        layer: Layer = prepared.graph.nodes[name]["layer"]
        values += [v for k, v in layer.args if is_secret_arg(k, v)]
        values += dockerfile_secret_values(layer.dockerfile)
        values += [environ[secret] for secret in layer.secrets if environ.get(secret)]
    return Redactor(values)


def run(prepared: Prepared, reporter: Reporter, jobs: int) -> MakeResult:
    """Run every layer of the plan that has work, parents before children, `jobs` at a time."""
    check_secrets(prepared)
    runner = _Runner(prepared, reporter)
    redact = runner.redact
    if any(lp.artifact and not lp.stored for lp in prepared.plan.layers):
        runner.signer  # noqa: B018 - a bad [sign] key stops the make before anything is built
    runner.sweep_leftovers()
    graph = prepared.graph
    plans = prepared.plan.by_name()
    pending = list(prepared.order)
    outcomes: dict[str, Outcome] = {}
    running: dict[Future, str] = {}

    # identical inputs in two places share a key: the first layer with it does the work
    owner: dict[str, str] = {}
    for name in prepared.order:
        owner.setdefault(plans[name].key, name)

    def waits_for(name: str) -> list[str]:
        parent = graph.nodes[name]["layer"].parent
        first = owner[plans[name].key]
        return [n for n in (parent, first if first != name else None) if n and n in plans]

    def blocked_by_failure(name: str) -> str | None:
        for other in waits_for(name):
            if other in outcomes and outcomes[other].status in (FAILED, SKIPPED):
                return other
        return None

    def ready(name: str) -> bool:
        return all(other in outcomes for other in waits_for(name))

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        try:
            while pending or running:
                for name in list(pending):
                    failed_parent = blocked_by_failure(name)
                    if failed_parent:
                        pending.remove(name)
                        outcomes[name] = Outcome(name, plans[name].key, SKIPPED,
                                                 error=f"parent {failed_parent} did not finish")
                        reporter.finished(name, f"skipped: parent {failed_parent} did not finish")
                    elif ready(name) and len(running) < jobs:
                        pending.remove(name)
                        lp = plans[name]
                        if owner[lp.key] != name:
                            runner.alias(lp)
                            outcomes[name] = Outcome(name, lp.key, REUSED)
                            continue
                        if lp.action == NOTHING:
                            if lp.artifact:  # stored under another graph's name: add this one
                                runner.store.name(name, lp.key)
                            outcomes[name] = Outcome(name, lp.key, REUSED)
                            continue
                        running[pool.submit(runner.run_layer, lp)] = name
                if not running:
                    continue
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    name = running.pop(future)
                    try:
                        outcome = future.result()
                    except Exception as exc:  # one layer's failure must not stop the other branches
                        message = str(exc) if isinstance(exc, EfabuildError) else f"{type(exc).__name__}: {exc}"
                        message = redact(message)
                        outcome = Outcome(name, plans[name].key, FAILED, error=message)
                        reporter.finished(name, f"FAILED: {message}")
                    else:
                        reporter.finished(name, _describe(outcome))
                    outcomes[name] = outcome
        except KeyboardInterrupt:
            runner.cancel.set()
            for future in running:
                future.cancel()
            raise
    # every layer now available is the baseline of its next plan, however it got here
    for name, outcome in outcomes.items():
        if outcome.status not in (FAILED, SKIPPED) and prepared.records.last_key(name) != outcome.key:
            prepared.records.record(name, outcome.key, plans[name].inputs)
    return MakeResult(tuple(outcomes[name] for name in prepared.order if name in outcomes))


def _describe(outcome: Outcome) -> str:
    steps = " + ".join(outcome.steps) or "nothing to do"
    text = f"{outcome.status} ({steps}) in {outcome.seconds:.1f}s"
    if outcome.log:
        text += f"\n  log: {outcome.log}"
    if outcome.artifact:
        text += f"\n  artifact: {outcome.artifact}"
    return text


def summary(result: MakeResult) -> str:
    from efabuild.cli.output import table

    rows = [[o.qualname, short(o.key), o.status, f"{o.seconds:.1f}s",
             o.artifact or (o.error.splitlines()[0] if o.error else "")]
            for o in result.outcomes]
    counts = {s: sum(o.status == s for o in result.outcomes) for s in (BUILT, PULLED, EXPORTED, REUSED, FAILED, SKIPPED)}
    tail = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "nothing to do"
    return table(rows, ["LAYER", "KEY", "RESULT", "TIME", "ARTIFACT"]) + "\n" + tail
