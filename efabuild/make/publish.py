"""One artifact layer's way into the store: export its image to .sqsh, describe what is inside it,
publish both under the layer key.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from efabuild import notices
from efabuild.export.artifact import export_artifact, export_record
from efabuild.export.incremental import NO_ANCESTOR
from efabuild.export.squash import ExportCancelled
from efabuild.host.digest import Sha256Pass
from efabuild.host.fsutil import temp_name
from efabuild.host.stops import step_boundary
from efabuild.make.gitstate import vcs_of
from efabuild.make.prepare import Prepared
from efabuild.make.reporter import Reporter
from efabuild.plan import Plan
from efabuild.provenance.stored import describe_sqsh
from efabuild.refs import short
from efabuild.signing.attest import signed
from efabuild.store.progress import Progress
from efabuild.store.record import ArtifactRecord


def export_progress(qualname: str, expected: int | None):  # noqa: ANN201 - a Progress
    """The export's progress line: its total is the image's size, an estimate the tar outgrows."""
    return Progress(f"export {qualname}", expected, estimate=True)


def export_and_publish(prepared: Prepared, request, *, reporter: Reporter, builder_versions: dict,  # noqa: ANN001
                       signer=None, cancel=None) -> Path:  # noqa: ANN001
    """Export the artifact layer `request` names (an export.artifact.ExportRequest) and publish it
    under its key. The export cuts the .sqsh into the S3 tier's chunks in its digest pass (see
    _chunking). The manifest's `vcs` is the git revision and source of the image's labels: where
    the image was built from, on this machine or the one it was pulled from (never in the .sqsh)."""
    store, name, key = prepared.store, request.name, request.key  # name: the plan's, @os/arch with several platforms
    plan = prepared.plan.by_name()[name]
    started = _now()
    staging = store.staging_dir()
    staging.mkdir(parents=True, exist_ok=True)
    out = temp_name(staging, f"{key}.export", ".sqsh")  # names its owner: gc can tell debris
    bar: list[Progress] = []

    def progress(streamed: int, expected: int | None) -> None:
        if not bar:  # the total is known once the export has started
            bar.append(export_progress(name, expected))
        bar[0].update(streamed - bar[0].done)

    try:
        try:
            # blake3 right after mksquashfs; the sha256 while an incremental export copies its
            # ancestor's range, else below, in a thread while the probe reads the image
            result = export_artifact(request, out, progress=progress, sha256=False, sha256_beside_copy=True,
                                     cancel=cancel, chunking=_chunking(store))
        finally:
            for shown in bar:
                shown.close()
        # one line in make's output: which ancestor, or why whole when there was one to write from
        if result.incremental is not None and result.incremental.get("full") != NO_ANCESTOR:
            notices.note(f"{name}: {how_exported(result.incremental)}")
        if result.index is not None:  # the chunks S3 lacks are sent while the manifest is made and signed
            store.send_ahead(plan.layer, result.path, result.index)
        manifest, record = _described(prepared, request, result, builder_versions, started)
        if cancel is not None and cancel.is_set():
            raise ExportCancelled(f"{name}: interrupted before publishing; nothing was published")
        # signed here, before publishing: the statement is stored with the artifact on every tier
        envelope = signed(manifest, signer, f"manifest of {name}") if signer is not None else None
        step_boundary("publish")
        outcome = store.publish(key, result.path, record, manifest, envelope=envelope, index=result.index)
        reporter.line(name, f"published: {', '.join(f'{t} {s}' for t, s in outcome.items())}")
    finally:
        out.unlink(missing_ok=True)  # published copies are links or copies of their own
    # the platform it was made for: an arm64 artifact of a two-platform make is no surprise on amd64
    return store.lookup(key, fetch=False, platform=record.platform)


def _described(prepared: Prepared, request, result, builder_versions: dict,  # noqa: ANN001
               started: str) -> tuple[bytes, ArtifactRecord]:
    """The manifest of what the exported .sqsh holds, and its record."""
    name, key = request.name, request.key
    plan = prepared.plan.by_name()[name]
    export_info = export_record(result, request.options, request.epoch)
    # taken by the export (or still being taken: meanwhile the probe reads the image), else now
    chunks = result.index.identity() if result.index is not None else None  # signed with the rest
    sha256 = result.sha256_later or ((lambda: result.sha256) if result.sha256
                                     else Sha256Pass(result.path, result.splice).result)
    manifest = describe_sqsh(
        result.path, key=key, name=plan.layer, sqsh_digest=result.digest, sqsh_sha256=sha256,
        export_options=export_info, base=_base(prepared.plan, name), chain=_chain(prepared.plan, name),
        builder=builder_versions, times={"started": started, "exported": _now()},
        vcs=vcs_of(dict(result.labels)), platform=plan.inputs.platform, chunk_index=chunks,
    )
    record = ArtifactRecord.for_file(key, plan.layer, result.path, result.digest, export=export_info,
                                     sha256=sha256(), platform=plan.inputs.platform)._replace(chunks=chunks)
    return manifest, record


def how_exported(incremental: dict | None) -> str:
    """One line on how a .sqsh was made: from which ancestor, or whole and why."""
    if not incremental:
        return "export: full"
    if "full" in incremental:
        return f"export: full ({incremental['full']})"
    return (f"export: incremental from {short(str(incremental.get('ancestor')))} "
            f"({incremental.get('dead_bytes', 0)} dead bytes)")


def _chunking(store) -> tuple[int, int, int] | None:  # noqa: ANN001 - a Store
    """The chunk sizes of the store's S3 tier when it stores artifacts as chunks: its publish then
    sends from the export's index and reads only the chunks the bucket lacks."""
    s3 = store.s3  # None without an S3 tier (or with it skipped: no credentials)
    return s3.chunking if s3 is not None and s3.chunked else None


def _chain(plan: Plan, qualname: str) -> list[dict]:
    return [{"layer": lp.qualname, "key": lp.key, "inputs": lp.inputs.to_dict()} for lp in plan.chain(qualname)]


def _base(plan: Plan, qualname: str) -> dict:
    """The base under the chain, as its root layer's key saw it."""
    root = plan.chain(qualname)[0]
    base = next((b for b in plan.bases if b.ref == root.inputs.base_ref and b.platform == root.platform), None)
    index = {"index_digest": base.index_digest} if base is not None and base.index_digest else {}
    return {"ref": root.inputs.base_ref, "digest": root.inputs.base_digest, **index}


def engine_versions(engine) -> dict:
    try:
        return {k: v for k, v in engine.versions().items() if v is not None}
    except Exception:  # versions are informative; a failed query must not fail the artifact
        return {}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
