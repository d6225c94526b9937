"""Where an artifact layer's `.sqsh` is made: one call, `export_artifact(request, out)`.

It exports the image of the layer's key from the engine on this host, or from a builder that
cannot see it (a farm node, streamed from the registry: export.remote), and it writes the file
from the ancestor's `.sqsh` when the request names a usable one (export.incremental: the layer
diffs from the engine's directories, or on a farm from the registry's blobs), else the whole
image. The result says which, and why not incremental, for the artifact's record, with the
image's layers (`image_layers`) that a child's export checks its ancestor by.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import attrs

from efabuild.engine.client import Engine
from efabuild.engine.images import built_for_key, layer_facts
from efabuild.errors import EfabuildError
from efabuild.engine.registry import remote_ref
from efabuild.export.incremental import REMOTE_BUILDER, Ancestor, EngineLayers, export_incremental, full, layers_digest
from efabuild.export.layerdiff import LayerSourceUnavailable
from efabuild.export.registryclient import Registry, split_ref
from efabuild.export.registrylayers import RegistryLayers, read_image
from efabuild.export.remote import export_remote
from efabuild.export.squash import ENROOT_FORMAT, ExportResult, Progress, export_image
from efabuild.export.tarfilter import RC_LABELS
from efabuild.refs import KEY_LABEL, short
from efabuild.settings import ExportSettings, RegistrySettings


@attrs.frozen
class RemoteImage:
    """A layer's image in the registry, and how to get a builder that can stream it."""

    ref: str
    platform: str
    # a builder, held while the export runs (the farm picks it: the one that built it when free)
    take: Callable[[threading.Event | None], AbstractContextManager[Engine]]
    registry: RegistrySettings | None = None  # where its layer blobs are, for an incremental export


@attrs.frozen
class ExportRequest:
    """What one artifact layer's export needs: which image, how it is packed, from what."""

    key: str
    name: str  # the layer's graph:layer, in messages
    options: ExportSettings
    epoch: int
    engine: Engine | None = None  # the engine holding `tag` (unless `remote`)
    tag: str = ""
    remote: RemoteImage | None = None
    ancestor: Ancestor | None = None  # the checked ancestor copy to write from
    no_ancestor: str = ""  # else why there is none: the record's reason for a full export

    def written_from(self, ancestor: Ancestor | None, no_ancestor: str = "") -> ExportRequest:
        """This export, from `ancestor` (or, None, not: `no_ancestor` says why)."""
        return attrs.evolve(self, ancestor=ancestor, no_ancestor=no_ancestor)


def export_artifact(request: ExportRequest, out: Path, *, progress: Progress | None = None, sha256: bool = True,
                    sha256_beside_copy: bool = False, cancel: threading.Event | None = None,
                    chunking: tuple[int, int, int] | None = None) -> ExportResult:
    """The layer's .sqsh at `out` (see ExportRequest); its `incremental` says how it was made.
    `sha256_beside_copy`: its sha256 too where an incremental export can compute it while it
    copies the ancestor's range (export_incremental), for a caller that would take it later."""
    how = dict(options=request.options, epoch=request.epoch, progress=progress, sha256=sha256, cancel=cancel,
               chunking=chunking)
    if request.remote is not None:
        return _export_from_registry(request, out, how, sha256_beside_copy)
    if not built_for_key(request.engine, request.tag, request.key):
        raise EfabuildError(f"{request.name}: the engine's {request.tag} does not carry key {short(request.key)} in its "
                            f"{KEY_LABEL} label (some other image was given this name): not exported; remove it and "
                            "make again")
    facts = layer_facts(request.engine, request.tag)  # recorded: a child's export checks its ancestor by them
    layers = layers_digest(facts[1]) if facts is not None else None
    reason = request.no_ancestor
    if request.ancestor is not None:
        made = export_incremental(EngineLayers(request.engine, request.tag), request.ancestor, out,
                                  options=request.options,
                                  epoch=request.epoch, recorded=recorded_options(request.options, request.epoch),
                                  progress=progress, sha256=sha256, sha256_beside_copy=sha256_beside_copy,
                                  chunking=chunking)
        if isinstance(made, ExportResult):
            return attrs.evolve(made, image_layers=layers)
        reason = made
    result = export_image(request.tag, out, engine=request.engine, **how)
    return attrs.evolve(result, incremental=full(reason) if reason else None, image_layers=layers)


def _export_from_registry(request: ExportRequest, out: Path, how: dict, sha256_beside_copy: bool) -> ExportResult:
    """A farm's export: incremental from the registry's blobs when the ancestor allows it, else
    streamed whole by a builder; its `image_layers` from the registry's config either way."""
    remote = request.remote
    assert remote is not None
    reason, registry = request.no_ancestor, None
    try:
        registry = Registry(split_ref(remote.ref)[0], insecure=remote.registry.insecure) if remote.registry else None
    except LayerSourceUnavailable as exc:  # a reference this client cannot address: the stream still can
        reason = reason or str(exc)
    if request.ancestor is not None and registry is None:
        reason = reason or REMOTE_BUILDER
    elif request.ancestor is not None:
        source = RegistryLayers(registry, remote.ref, remote.platform, request.key,
                                remote_ref(request.ancestor.tag, remote.registry))
        made = export_incremental(source, request.ancestor, out, options=request.options, epoch=request.epoch,
                                  recorded=recorded_options(request.options, request.epoch),
                                  progress=how["progress"], sha256=how["sha256"],
                                  sha256_beside_copy=sha256_beside_copy, chunking=how["chunking"])
        if isinstance(made, ExportResult):
            return attrs.evolve(made, image_layers=layers_digest(source.child().diff_ids))
        reason = made
    with remote.take(how["cancel"]) as node:
        result = export_remote(node, remote.ref, out, platform=remote.platform, **how)
    layers = None
    if registry is not None:
        try:  # recorded: a child's export checks its ancestor by them
            layers = layers_digest(read_image(registry, remote.ref, remote.platform).diff_ids)
        except LayerSourceUnavailable:
            layers = None  # a child of it is then a full export, saying the record names no layers
    return attrs.evolve(result, incremental=full(reason) if request.ancestor or request.no_ancestor else None,
                        image_layers=layers)


def recorded_options(options: ExportSettings, epoch: int) -> dict:
    """The export options an artifact's record holds besides those its export reports."""
    return {"compression": options.compression, "compress_data": options.compress_data, "epoch": epoch,
            "enroot_format": ENROOT_FORMAT, "rc_labels": RC_LABELS}


def export_record(result: ExportResult, options: ExportSettings, epoch: int) -> dict:
    """The export options recorded with an artifact: what decides its bytes besides its key, and
    how it was made (from which ancestor, or why whole)."""
    info = {"mksquashfs": list(result.options), **recorded_options(options, epoch),
            # absent in artifacts exported before times were clamped
            "time_clamp": result.time_clamp}
    if result.incremental is not None:
        info["incremental"] = result.incremental
    if result.image_layers is not None:
        info["image_layers"] = result.image_layers
    return info
