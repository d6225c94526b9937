"""`efabuild make`: lint, then run a plan. Pull or build each layer in dependency order, then
export, describe and publish every artifact layer.

Independent layers run in parallel (`jobs`, see schedule.py); a failed layer skips its
descendants while other branches finish. Every build's full log is kept under the local store.
The engine is reached through `EngineSteps`; the store through the one `Store` the plan asked.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from efabuild import dag, notices
from efabuild.errors import EfabuildError, InputError
from efabuild.model import Layer, Workspace
from efabuild.plan import BUILD, NOTHING, PULL, LayerPlan
from efabuild.redact import Redactor, dockerfile_secret_values, is_secret_arg
from efabuild.refs import GRAPH_LABEL, KEY_LABEL, LAYER_LABEL, TITLE_LABEL, image_tag, short
from efabuild.make.context import SOURCE_DATE_EPOCH, context_dir
from efabuild.make.leftovers import LeftoverSearch, sweep
from efabuild.make.prepare import Prepared, prepare
from efabuild.make.reporter import Reporter
from efabuild.make.schedule import (BUILT, EXPORTED, FAILED, PULLED, REUSED, SKIPPED, STATUSES, Outcome,
                                     run_in_order)
from efabuild.host.stops import step_boundary
from efabuild.store.tiers.fs import REUSED as TIER_REUSED

if TYPE_CHECKING:  # the builder's side is loaded where a layer has work: a no-op make never needs it
    from efabuild.make.engine_steps import EngineSteps

__all__ = ["BUILT", "EXPORTED", "FAILED", "PULLED", "REUSED", "SKIPPED", "STATUSES", "SOURCE_DATE_EPOCH",
           "LeftoverSearch", "LintFailed", "MakeResult", "Outcome", "prepare_make", "run"]


class MakeResult(NamedTuple):
    outcomes: tuple[Outcome, ...]
    skipped_tiers: dict[str, str]  # store tier -> why nothing went there

    @property
    def failed(self) -> bool:
        return any(o.status == FAILED for o in self.outcomes)

    def counts(self) -> dict[str, int]:
        """How many layers ended in each status, in STATUSES order, zeros left out."""
        counts = {s: sum(o.status == s for o in self.outcomes) for s in STATUSES}
        return {s: n for s, n in counts.items() if n}


class LintFailed(InputError):
    """Lint found errors in what a make would build. `findings` are the errors to show."""

    def __init__(self, findings: list) -> None:
        self.findings = findings
        super().__init__(f"lint found {len(findings)} error(s): fix them, or build anyway with --no-lint")


def prepare_make(ws: Workspace, targets: Iterable[str] = (), *, lint: bool = True,
                 require_engine: bool = True) -> Prepared:
    """The plan of a make, linted first: the guide's pitfalls stop it before a 25 GB build (unless
    `lint` is False), with no engine needed to be stopped."""
    targets = list(targets)
    if lint:
        from efabuild.lint import errors_only, lint_workspace

        # every graph a selected layer comes from, ancestors in other graphs included
        graphs = sorted({name.split(":", 1)[0] for name in dag.select(ws, dag.layer_graph(ws), targets)})
        errors = errors_only(lint_workspace(ws, graphs if targets else None))
        if errors:
            raise LintFailed(errors)
    return prepare(ws, targets, require_engine=require_engine)


class _Runner:
    def __init__(self, prepared: Prepared, reporter: Reporter, engine_steps=None) -> None:  # noqa: ANN001
        self.p = prepared
        self.cancel = threading.Event()  # set on interrupt: running builds stop, nothing is tagged
        self.ws: Workspace = prepared.ws
        self.engine = prepared.engine
        self._steps = engine_steps
        self.reporter = reporter
        self.store_root = self.ws.settings.store.local
        self.plans = prepared.plan.by_name()
        # key -> a tag that has it, as the plan saw the engine; grows as layers are built or pulled
        self.tags: dict[str, str] = dict(prepared.image_tags)
        self.store = prepared.store
        # every secret of this make is hidden in every build's output, whichever layer it belongs to
        self.redact = output_redactor(prepared)
        self.farm = None  # efabuild.make.farm.Farm: builders that cannot see this engine's images
        self._node_versions: dict[int, dict] = {}  # id(farm node) -> its tool versions
        self._pulled: set[str] = set()  # keys whose image this make pulled: built by another machine
        self._versions_lock = threading.Lock()

    @functools.cached_property
    def steps(self) -> EngineSteps:
        if self._steps is not None:
            return self._steps
        from efabuild.make.engine_steps import EngineSteps

        return EngineSteps(self.engine)

    # --- one layer ---------------------------------------------------------------------------

    def run_layer(self, lp: LayerPlan) -> Outcome:
        """Build or pull, export and publish one layer, holding its key's build lock: concurrent
        makes of one key on this host build it once, the others wait and then reuse it."""
        from efabuild.engine.build import BuildInterrupted

        layer: Layer = self.p.graph.nodes[lp.qualname]["layer"]
        started = time.monotonic()
        waited: list[bool] = []

        def on_wait(_: str) -> None:
            waited.append(True)
            self.reporter.started(lp.qualname, "wait", "another make has this key")

        lock = self.store.local_tier.build_lock(lp.key, on_wait=on_wait)
        if not lock.acquire_unless(self.cancel):
            raise BuildInterrupted(f"{lp.qualname}: interrupted while waiting for another make of this key")
        try:
            return self._run_layer_locked(layer, lp, started, contended=bool(waited))
        finally:
            lock.release()

    def _run_layer_locked(self, layer: Layer, lp: LayerPlan, started: float, contended: bool) -> Outcome:
        steps: list[str] = []
        log = artifact = ""
        status = REUSED
        action = lp.action
        if action in (PULL, BUILD) and self._made_meanwhile(layer, lp):
            action, contended = NOTHING, True  # another make built it while this one planned or waited
        if action == PULL and self.farm is not None:
            self.farm.ref(self.engine, layer.name, lp.key)  # builders and exports take it from there
        elif action == PULL:
            self.reporter.started(lp.qualname, "pull", short(lp.key))
            self._pull(layer, lp)
            steps.append("pull")
            status = PULLED
        elif action == BUILD:
            self.reporter.started(lp.qualname, "build", "; ".join(lp.reasons))
            log = self._build(layer, lp)
            steps.append("build")
            status = BUILT
            if self.ws.settings.registry is not None and self.farm is None:  # a farm's builds push
                self.steps.push(image_tag(layer.name, lp.key), self.ws.settings.registry)
                steps.append("push")
        if self.farm is None:
            self._ensure_own_tag(layer, lp)
        if layer.artifact:
            artifact, step = self._store_artifact(layer, lp, contended, quiet=bool(steps))
            steps += [step] if step else []
            status = EXPORTED if step == "export" and status == REUSED else status
        return Outcome(lp.qualname, lp.key, status, time.monotonic() - started, tuple(steps), log, artifact)

    def _store_artifact(self, layer: Layer, lp: LayerPlan, contended: bool, quiet: bool) -> tuple[str, str | None]:
        """Every tier gets the layer's .sqsh: (its path, the step that did it). What the plan found
        in the store holds unless another make of this key ran meanwhile: only then is it asked again."""
        if lp.stored or (contended and self.store.has(lp.key)):
            self.store.name(lp.qualname, lp.key)  # no-op unless the artifact came from another name
            return "", None
        copied = self.store.complete(lp.key)
        if copied is not None:  # another tier had it: copied across, no export needed
            self.store.name(lp.qualname, lp.key)
            if set(copied.values()) == {TIER_REUSED}:
                return "", None  # another make published it between the plan and the lock
            return str(self.store.lookup(lp.key, fetch=False)), "copy between tiers"
        if self.farm is None and lp.key not in self.tags:  # planned as a copy, but no tier's copy was good
            raise EfabuildError(f"{lp.qualname}: no store tier holds a good copy of {short(lp.key)} and the "
                                f"engine lacks its image: make again to build it")
        if not quiet:
            self.reporter.started(lp.qualname, "export", short(lp.key))
        return self._export_and_publish(layer, lp), "export"

    def _made_meanwhile(self, layer: Layer, lp: LayerPlan) -> bool:
        tag = image_tag(layer.name, lp.key)
        if self.farm is not None or not self.steps.has_image(tag):
            return False
        self.tags[lp.key] = tag
        return True

    def settle(self, lp: LayerPlan, shares_work: bool) -> Outcome:
        """A layer with nothing to do, or whose key an earlier layer just made: it gets its own tag
        and store name."""
        layer: Layer = self.p.graph.nodes[lp.qualname]["layer"]
        if shares_work:
            if lp.key in self.tags and self.farm is None:
                self._ensure_own_tag(layer, lp)
            if layer.artifact and self.store.has(lp.key):
                self.store.name(lp.qualname, lp.key)
        elif lp.artifact:  # stored under another graph's name: add this one
            self.store.name(lp.qualname, lp.key)
        return Outcome(lp.qualname, lp.key, REUSED)

    def _pull(self, layer: Layer, lp: LayerPlan) -> None:
        tag = image_tag(layer.name, lp.key)
        if not self.steps.pull(tag, self.ws.settings.registry):
            raise EfabuildError(f"{lp.qualname}: {tag} vanished from the registry {self.ws.settings.registry.url}")
        self.tags[lp.key] = tag
        self._pulled.add(lp.key)

    def _ensure_own_tag(self, layer: Layer, lp: LayerPlan) -> None:
        """A layer whose image exists under another layer's name gets its own tag too."""
        own = image_tag(layer.name, lp.key)
        existing = self.tags.get(lp.key)
        if existing and existing != own:
            self.steps.tag(existing, own)
        if existing:
            self.tags.setdefault(lp.key, own)

    def from_line(self, layer: Layer, lp: LayerPlan) -> str:
        if layer.parent and self.farm is not None:  # by digest in the registry
            parent_key = self.plans[layer.parent].key
            parent = self.p.graph.nodes[layer.parent]["layer"]
            return f"FROM {self.farm.ref(self.engine, parent.name, parent_key, self.tags.get(parent_key))}"
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
        from efabuild.make.gitstate import GIT_LABELS
        from efabuild.engine.build import BuildRequest

        return BuildRequest(
            tag=tag,
            dockerfile=generated_dockerfile(self.from_line(layer, lp), layer.dockerfile),
            context_dir=context_dir,
            build_args=dict(layer.args),
            secrets=layer.secrets,
            # the layer's own title (not the base's) and where its sources are, when in git; empty
            # outside git, so that an image never shows its parent's commit as its own. None of
            # these but the key reaches the .sqsh (refs.UNKEYED_LABELS)
            labels={TITLE_LABEL: layer.qualname, **dict.fromkeys(GIT_LABELS, ""), **self.oci_labels,
                    KEY_LABEL: lp.key, GRAPH_LABEL: layer.graph, LAYER_LABEL: layer.name},
            platform=self.ws.settings.builder.platform,
            source_date_epoch=SOURCE_DATE_EPOCH,
            no_cache=no_cache,
        )

    def _build(self, layer: Layer, lp: LayerPlan) -> str:
        log_path = self.store_root / "logs" / layer.graph / layer.name / f"{lp.key}.log"
        with self._context_dir(layer, lp) as context_dir:
            request = self.build_request(layer, lp, context_dir, image_tag(layer.name, lp.key))
            step_boundary("build")
            how = dict(on_line=lambda text: self.reporter.line(lp.qualname, text), cancel=self.cancel,
                       redact=self.redact, log_root=self.store_root)
            if self.farm is not None:
                self.farm.build(layer.name, lp.key, request, log_path, **how)
            else:
                self.steps.build(request, log_path, **how)
                self.tags[lp.key] = request.tag
        self.p.records.record(lp.qualname, lp.key, lp.inputs)
        return str(log_path)

    def _context_dir(self, layer: Layer, lp: LayerPlan):
        """A build context holding exactly the files the key was computed from, as the key saw them."""
        return context_dir(self.ws.root, self.store_root / "tmp", layer.name, lp.inputs.context)

    # --- artifacts ---------------------------------------------------------------------------

    @functools.cached_property
    def oci_labels(self) -> dict[str, str]:
        """OCI source and revision labels from the workspace's git state, read once per make: on
        the images, whence each manifest's `vcs`."""
        from efabuild.make.gitstate import git_labels

        return git_labels(self.ws.root)

    @functools.cached_property
    def builder_versions(self) -> dict:
        """The engine's tool versions for manifests: asked once per make, not per artifact."""
        from efabuild.make.publish import engine_versions

        return engine_versions(self.engine)

    def built_by(self, key: str) -> dict:
        """The tool versions of the builder that built `key`, for its manifest: the engine's, or on
        a farm the node's that built it in this make (asked once per node, `node` naming its
        [builder] farm entry). A layer pulled from the registry, or one the farm did not build in
        this make, was built elsewhere or before, by a builder no record names: its manifest names
        none rather than the wrong one."""
        if key in self._pulled:
            return {}
        if self.farm is None:
            return self.builder_versions
        from efabuild.make.publish import engine_versions
        from efabuild.engine.build import builder_name

        node = self.farm.builder_of(key)
        if node is None:
            return {}
        with self._versions_lock:
            if id(node) not in self._node_versions:
                self._node_versions[id(node)] = {**engine_versions(node), "node": builder_name(node)}
            return self._node_versions[id(node)]

    @functools.cached_property
    def signer(self):  # noqa: ANN201 - a signing.Signer, or None without [sign]
        """The [sign] key, loaded once per make (KMS: one GetPublicKey)."""
        sign = self.ws.settings.sign
        if sign is None:
            return None
        from efabuild.signing.keys import signer_for

        return signer_for(sign.key, root=self.ws.root, region=sign.region, endpoint_url=sign.endpoint_url)

    def _export_and_publish(self, layer: Layer, lp: LayerPlan) -> str:
        from efabuild.make.publish import export_and_publish

        exporter = None if self.farm is None else self.farm.exporter(
            self.engine, layer.name, lp.key, self.tags.get(lp.key), options=self.ws.settings.export,
            epoch=SOURCE_DATE_EPOCH, platform=self.ws.settings.builder.platform)
        path = export_and_publish(
            ws=self.ws, store=self.store, engine=self.engine, layer=layer, plan=lp, prepared=self.p,
            tag=self.tags.get(lp.key, ""), reporter=self.reporter, epoch=SOURCE_DATE_EPOCH,
            builder_versions=self.built_by(lp.key), signer=self.signer, cancel=self.cancel, exporter=exporter,
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


def run(prepared: Prepared, reporter: Reporter | None = None, jobs: int = 1, *,
        engine_steps: EngineSteps | None = None, leftovers: LeftoverSearch | None = None) -> MakeResult:
    """Run every layer of the plan that has work, parents before children, `jobs` at a time.
    `engine_steps` is how the engine is reached (default: the engine prepare connected to);
    `leftovers`, started before the plan, has looked for what killed makes left (default: look now)."""
    check_secrets(prepared)
    runner = _Runner(prepared, reporter or Reporter(), engine_steps)
    if prepared.engine is not None and any(lp.action != NOTHING for lp in prepared.plan.layers):
        from efabuild.make.farm import farm_for_make  # builders matter only to a make with work

        runner.farm = farm_for_make(prepared, notices.warn)
        jobs = runner.farm.slots if runner.farm is not None else jobs  # [builder] jobs on each builder
    if any(lp.artifact and not lp.stored for lp in prepared.plan.layers):
        runner.signer  # noqa: B018 - a bad [sign] key stops the make before anything is built
    sweep(prepared.store, prepared.engine, lambda: runner.steps, leftovers)
    plans = prepared.plan.by_name()
    outcomes = run_in_order(prepared.order, plans, jobs, work=runner.run_layer, settle=runner.settle,
                            finished=runner.reporter.finished, redact=runner.redact,
                            interrupted=runner.cancel.set)
    for name, platforms in sorted(published_platforms(outcomes).items()):  # signed as make signs artifacts
        from efabuild.signing.attest import signed_index  # not for a no-op make: it loads attrs

        prepared.store.publish_index(name, platforms, sign=runner.signer and functools.partial(signed_index,
                                                                                              signer=runner.signer))
    # every layer now available is the baseline of its next plan, however it got here
    for name, outcome in outcomes.items():
        if outcome.status not in (FAILED, SKIPPED) and prepared.records.last_key(name) != outcome.key:
            prepared.records.record(name, outcome.key, plans[name].inputs)
    return MakeResult(tuple(outcomes[name] for name in prepared.order if name in outcomes),
                      dict(prepared.store.skipped))


def published_platforms(outcomes: dict[str, Outcome]) -> dict[str, dict[str, str]]:
    """{name: {platform: key}} of every artifact name this make has for several platforms: each
    gets its platform index. A one-platform workspace has none: its names keep plain entries."""
    return {}
