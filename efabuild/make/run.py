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
from typing import TYPE_CHECKING

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
from efabuild.make.result import MakeResult, published_platforms, unpublished_platforms
from efabuild.make.schedule import (BUILT, EXPORTED, FAILED, PULLED, REUSED, SKIPPED, STATUSES, Outcome,
                                     run_in_order)
from efabuild.host.stops import step_boundary
from efabuild.store.tiers.fs import REUSED as TIER_REUSED

# deferred: a layer's work (the builder's side, export, publish, signing, git state) is imported in the
# function doing it, so a no-op make loads none of it, nor lint with --no-lint (tests/engine/test_engine_api.py)
if TYPE_CHECKING:
    from efabuild.make.engine_steps import EngineSteps

__all__ = ["BUILT", "EXPORTED", "FAILED", "PULLED", "REUSED", "SKIPPED", "STATUSES", "SOURCE_DATE_EPOCH",
           "LayerRunner", "LeftoverSearch", "LintFailed", "MakeResult", "Outcome", "prepare_make", "published_platforms",
           "run"]


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
        graphs = sorted({name.split(":", 1)[0] for name in dag.select(ws, dag.layer_graph(ws), dag.split_targets(targets)[0])})
        errors = errors_only(lint_workspace(ws, graphs if targets else None))
        if errors:
            raise LintFailed(errors)
    return prepare(ws, targets, require_engine=require_engine)


class LayerRunner:
    """Runs one make's layers: builds or pulls each, exports and publishes its artifact, through
    the builders chosen for the make (`builders`: make/builders.py, set by `run` or, for one layer
    rebuilt without the cache, by `make --check`). `build_request`, `layer_context` and
    `export_request` are what --check uses to rebuild and export a layer exactly as make does."""

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
        self.builders = None  # make.builders' LocalBuilders or FarmBuilders, chosen by run()

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
        if action == PULL:
            step = self.builders.obtain(layer, lp)
            steps += [step] if step else []
            status = PULLED if step else status
        elif action == BUILD:
            self.reporter.started(lp.qualname, "build", "; ".join(lp.why))
            log, more = self._build(layer, lp)
            steps += ["build", *more]
            status = BUILT
        self.builders.own_tag(layer, lp)
        if layer.artifact:
            artifact, step = self._store_artifact(layer, lp, contended, quiet=bool(steps))
            steps += [step] if step else []
            status = EXPORTED if step == "export" and status == REUSED else status
        return Outcome(lp.qualname, lp.key, status, time.monotonic() - started, tuple(steps), log, artifact)

    def _store_artifact(self, layer: Layer, lp: LayerPlan, contended: bool, quiet: bool) -> tuple[str, str | None]:
        """Every tier gets the layer's .sqsh: (its path, the step that did it). What the plan found
        in the store holds unless another make of this key ran meanwhile: only then is it asked again."""
        if lp.stored or (contended and self.store.has(lp.key)):
            self.store.name(lp.layer, lp.key)  # no-op unless the artifact came from another name
            return "", None
        copied = self.store.complete(lp.key)
        if copied is not None:  # another tier had it: copied across, no export needed
            self.store.name(lp.layer, lp.key)
            if set(copied.values()) == {TIER_REUSED}:
                return "", None  # another make published it between the plan and the lock
            return str(self.store.lookup(lp.key, fetch=False, platform=lp.platform or None)), "copy between tiers"
        if not self.builders.has_image(lp.key):  # planned as a copy, but no tier's copy was good
            raise EfabuildError(f"{lp.qualname}: no store tier holds a good copy of {short(lp.key)} and the "
                                f"engine lacks its image: make again to build it")
        if not quiet:
            self.reporter.started(lp.qualname, "export", short(lp.key))
        return self._export_and_publish(layer, lp), "export"

    def _made_meanwhile(self, layer: Layer, lp: LayerPlan) -> bool:
        return self.builders.made_meanwhile(layer, lp)

    def settle(self, lp: LayerPlan, shares_work: bool) -> Outcome:
        """A layer with nothing to do, or whose key an earlier layer just made: it gets its own tag
        and store name."""
        layer: Layer = self.p.graph.nodes[lp.qualname]["layer"]
        if shares_work:
            if self.builders is not None:  # None: no layer of this make had work
                self.builders.own_tag(layer, lp)
            if layer.artifact and self.store.has(lp.key):
                self.store.name(lp.layer, lp.key)
        elif lp.artifact:  # stored under another graph's name: add this one
            self.store.name(lp.layer, lp.key)
        return Outcome(lp.qualname, lp.key, REUSED)

    def from_line(self, layer: Layer, lp: LayerPlan) -> str:
        if layer.parent:  # its tag in the engine, or by digest in the registry
            parent = self.p.graph.nodes[lp.parent]["layer"]
            return f"FROM {self.builders.parent_ref(lp, parent, self.plans[lp.parent].key)}"
        digest = lp.inputs.base_digest
        base = next(b for b in self.p.plan.bases if b.ref == layer.base.ref and b.platform in (None, lp.platform))
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
            platform=lp.platform,  # BuildKit sets TARGETPLATFORM and TARGETARCH from it
            source_date_epoch=SOURCE_DATE_EPOCH,
            no_cache=no_cache,
        )

    def _build(self, layer: Layer, lp: LayerPlan) -> tuple[str, list[str]]:
        """(its log, the steps after the build), the build recorded as the layer's baseline."""
        log_path = self.store_root / "logs" / layer.graph / layer.name / f"{lp.key}.log"
        with self.layer_context(layer, lp) as context_dir:
            request = self.build_request(layer, lp, context_dir, image_tag(layer.name, lp.key))
            step_boundary("build")
            how = dict(on_line=lambda text: self.reporter.line(lp.qualname, text), cancel=self.cancel,
                       redact=self.redact, log_root=self.store_root)
            more = self.builders.build(layer, lp, request, log_path, **how)
        self.p.records.record(lp.layer, lp.key, lp.inputs)
        return str(log_path), more

    def layer_context(self, layer: Layer, lp: LayerPlan):
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
        """The tool versions of the builder that built `key`, for its manifest: the engine's, or
        the builder node's that built it in this make. A layer pulled from the registry, or one no
        builder built in this make, was built elsewhere or before, by a builder no record names:
        its manifest names none rather than the wrong one."""
        return self.builders.versions(key)

    @functools.cached_property
    def signer(self):  # noqa: ANN201 - a signing.Signer, or None without [sign]
        """The [sign] key, loaded once per make (KMS: one GetPublicKey)."""
        sign = self.ws.settings.sign
        if sign is None:
            return None
        from efabuild.signing.keys import signer_for

        return signer_for(sign.key, root=self.ws.root, region=sign.region, endpoint_url=sign.endpoint_url)

    def _export_and_publish(self, layer: Layer, lp: LayerPlan) -> str:
        from efabuild.make.ancestry import export_ancestor
        from efabuild.make.publish import export_and_publish

        request = self.export_request(layer, lp)
        with export_ancestor(self.p, lp.qualname, remote=request.remote is not None,
                             signer=self.signer) as found:
            request = request.written_from(*found)
            path = export_and_publish(self.p, request, reporter=self.reporter, builder_versions=self.built_by(lp.key),
                                      signer=self.signer, cancel=self.cancel)
        return str(path)

    def export_request(self, layer: Layer, lp: LayerPlan, ancestor=None, no_ancestor: str = "",  # noqa: ANN001
                       tag: str | None = None):  # noqa: ANN201 - an export.artifact.ExportRequest
        """The export of `lp`'s image (or of `tag`, a check's rebuild): from this engine, or on a
        farm from the registry through one of its builders."""
        from efabuild.export.artifact import ExportRequest

        remote = self.builders.remote_image(layer, lp, tag)
        return ExportRequest(key=lp.key, name=lp.qualname, options=self.ws.settings.export, epoch=SOURCE_DATE_EPOCH,
                             engine=self.engine, tag=tag or self.tags.get(lp.key, ""), remote=remote,
                             ancestor=ancestor, no_ancestor=no_ancestor)


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
    runner = LayerRunner(prepared, reporter or Reporter(), engine_steps)
    if any(lp.action != NOTHING for lp in prepared.plan.layers):
        from efabuild.make.builders import builders_for, start_builders  # only a make with work needs them

        # a platform without a builder, or builders that cannot work, stop the make before any build
        runner.builders = builders_for(runner, None) if prepared.engine is None else \
            start_builders(runner, prepared, notices.warn)
        jobs = runner.builders.slots(jobs)
    if any(lp.artifact and not lp.stored for lp in prepared.plan.layers):
        runner.signer  # noqa: B018 - a bad [sign] key stops the make before anything is built
    sweep(prepared.store, prepared.engine, lambda: runner.steps, leftovers)
    plans = prepared.plan.by_name()
    outcomes = run_in_order(prepared.order, plans, jobs, work=runner.run_layer, settle=runner.settle,
                            finished=runner.reporter.finished, redact=runner.redact,
                            interrupted=runner.cancel.set)
    # every layer now available is the baseline of its next plan, however it got here
    for name, outcome in outcomes.items():
        lp = plans[name]
        if outcome.status not in (FAILED, SKIPPED) and prepared.records.last_key(lp.layer, lp.platform) != outcome.key:
            prepared.records.record(lp.layer, outcome.key, lp.inputs)
    result = MakeResult(tuple(outcomes[name] for name in prepared.order if name in outcomes),
                        dict(prepared.store.skipped), {name: (lp.layer, lp.platform) for name, lp in plans.items()},
                        frozenset(name for name, lp in plans.items() if lp.artifact))
    if prepared.ws.settings.builder.several:  # a one-platform workspace's names keep plain entries
        sign = None
        if runner.signer is not None:  # signed as make signs artifacts; not loaded by a no-op make (attrs)
            from efabuild.signing.attest import signed_index

            sign = functools.partial(signed_index, signer=runner.signer)
        built_for = {layer.qualname: layer.platforms for graph in prepared.ws.graphs for layer in graph.layers}
        for name, platforms in sorted(published_platforms(result, built_for).items()):
            prepared.store.publish_index(name, platforms, sign=sign)
        for name, lacking in unpublished_platforms(result, built_for).items():
            notices.warn(f"{name}: no new platform index: this make gave it no {', '.join(lacking)} "
                         f"artifact (jobs get what the name named before)")
    return result
