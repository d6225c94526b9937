"""One artifact layer's way into the store: export its image to .sqsh, describe what is inside it,
publish both under the layer key.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from efabuild.model import Layer, Workspace
from efabuild.plan import LayerPlan, Plan
from efabuild.make.prepare import Prepared
from efabuild.make.reporter import Reporter
from efabuild.errors import EfabuildError
from efabuild.host.fsutil import temp_name
from efabuild.refs import KEY_LABEL, short


def export_progress(qualname: str, expected: int | None):  # noqa: ANN201 - a Progress
    """The export's progress line: its total is the image's size, an estimate the tar outgrows."""
    from efabuild.store.progress import Progress

    return Progress(f"export {qualname}", expected, estimate=True)


def export_and_publish(*, ws: Workspace, store, engine, layer: Layer, plan: LayerPlan, prepared: Prepared,
                       tag: str, reporter: Reporter, epoch: int, builder_versions: dict, signer=None,
                       cancel=None, exporter=None) -> Path:
    """`exporter(out, progress=, sha256=, cancel=, chunking=)` exports from elsewhere than `engine` (a
    farm). The export cuts the .sqsh into the S3 tier's chunks in its digest pass (see _chunking).
    The manifest's `vcs` is the git revision and source of the image's labels: where the image
    was built from, on this machine or the one it was pulled from (never in the .sqsh)."""
    from efabuild.signing.attest import signed
    from efabuild.host.digest import Sha256Pass
    from efabuild.store.progress import Progress
    from efabuild.provenance.stored import describe_sqsh
    from efabuild.export.squash import ExportCancelled
    from efabuild.make.gitstate import vcs_of
    from efabuild.host.stops import step_boundary
    from efabuild.store.record import ArtifactRecord

    if exporter is None:
        exporter = _engine_exporter(ws, engine, tag, plan.key, layer.qualname, epoch)
    started = _now()
    staging = store.staging_dir()
    staging.mkdir(parents=True, exist_ok=True)
    out = temp_name(staging, f"{plan.key}.export", ".sqsh")  # names its owner: gc can tell debris
    bar: list[Progress] = []

    def progress(streamed: int, expected: int | None) -> None:
        if not bar:  # the total is known once the export has started
            bar.append(export_progress(layer.qualname, expected))
        bar[0].update(streamed - bar[0].done)

    try:
        try:
            # blake3 right after mksquashfs; sha256 below, in a thread while the probe reads the image
            result = exporter(out, progress=progress, sha256=False, cancel=cancel, chunking=_chunking(store))
        finally:
            for shown in bar:
                shown.close()
        export_info = _export_info(ws, result, epoch)
        sha256 = Sha256Pass(result.path)
        manifest = describe_sqsh(
            result.path, key=plan.key, name=layer.qualname, sqsh_digest=result.digest, sqsh_sha256=sha256.result,
            export_options=export_info, base=_base(prepared.plan, plan.qualname),
            chain=_chain(prepared.plan, plan.qualname),
            builder=builder_versions, times={"started": started, "exported": _now()},
            vcs=vcs_of(dict(result.labels)), platform=plan.inputs.platform,
        )
        record = ArtifactRecord.for_file(plan.key, layer.qualname, result.path, result.digest, export=export_info,
                                         sha256=sha256.result(), platform=plan.inputs.platform)
        if cancel is not None and cancel.is_set():
            raise ExportCancelled(f"{layer.qualname}: interrupted before publishing; nothing was published")
        # signed here, before publishing: the statement is stored with the artifact on every tier
        envelope = signed(manifest, signer, f"manifest of {layer.qualname}") if signer is not None else None
        step_boundary("publish")
        outcome = store.publish(plan.key, result.path, record, manifest, envelope=envelope, index=result.index)
        reporter.line(layer.qualname, f"published: {', '.join(f'{t} {s}' for t, s in outcome.items())}")
    finally:
        out.unlink(missing_ok=True)  # published copies are links or copies of their own
    return store.lookup(plan.key, fetch=False)


def _export_info(ws: Workspace, result, epoch: int) -> dict:  # noqa: ANN001 - an ExportResult
    """The export options recorded with an artifact: what decides its bytes besides its key."""
    from efabuild.export.squash import ENROOT_FORMAT
    from efabuild.export.tarfilter import RC_LABELS

    return {"mksquashfs": list(result.options), "compression": ws.settings.export.compression,
            "compress_data": ws.settings.export.compress_data, "epoch": epoch,
            "enroot_format": ENROOT_FORMAT, "rc_labels": RC_LABELS,
            # absent in artifacts exported before times were clamped
            "time_clamp": result.time_clamp}


def _engine_exporter(ws: Workspace, engine, tag: str, key: str, name: str, epoch: int):  # noqa: ANN001, ANN202
    """The export of `tag` from `engine`, once it is known to be this key's image (built_for_key):
    only an image efabuild built for this key becomes the layer's artifact."""
    import functools

    from efabuild.engine.images import built_for_key
    from efabuild.export.squash import export_image

    if not built_for_key(engine, tag, key):
        raise EfabuildError(f"{name}: the engine's {tag} does not carry key {short(key)} in its {KEY_LABEL} "
                            "label (some other image was given this name): not exported; remove it and make again")
    return functools.partial(export_image, tag, options=ws.settings.export, engine=engine, epoch=epoch)


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
