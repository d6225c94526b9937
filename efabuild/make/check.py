"""`efabuild make --check`: is a stored artifact reproducible? (the spirit of `nix build --check`)

The layer is built again without BuildKit's cache, on its parent's image (parents are not
rebuilt), exported the way `make` exports, and compared with the stored `.sqsh`, whose bytes are
first checked against its record (a damaged copy fails the check, named), file by file.
In the engine, the rebuilt image gets a tag of its own, naming this process, and is removed after
the export (by the next make or gc when this one is killed first). On builders that cannot see
the engine's images (a farm), it is built FROM the parent by digest in [registry], pushed under
the layer's check tag and streamed into the export, as a farm make does. Either way the layer's
own image, registry tag and artifact stay as they were.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import attrs

from efabuild.engine.build import build_layer
from efabuild.engine.images import untag_image
from efabuild.engine.leftovers import check_image_tag
from efabuild.engine.registry import RegistryError
from efabuild.errors import EfabuildError, InputError
from efabuild.export.tarfilter import RC_LABELS
from efabuild.model import Layer
from efabuild.make.prepare import Prepared
from efabuild.export.artifact import export_artifact
from efabuild.make import run as make
from efabuild.make.builders import builders_for
from efabuild.make.farm import Farm, unpullable_base
from efabuild.export.sqshdiff import Difference, compare, read_sqsh, summary
from efabuild.refs import short
from efabuild.store.gc.leftovers import CHECK_PREFIX
from efabuild.host.owner import owned_name
from efabuild.make.ancestry import ancestor_copy
from efabuild.make.reporter import Reporter
from efabuild import notices
from efabuild.store.transfer import DamagedCopy, check_file

# export options that decide the bytes of a .sqsh, as recorded with an artifact
_PACKING = ("mksquashfs", "time_clamp", "rc_labels")
# what an option recorded as absent meant, for artifacts exported before it was recorded
_ABSENT = {"time_clamp": "absent (exported before times were clamped)",
           "rc_labels": "absent (exported with the layer's name and git commit in /etc/rc)"}


@attrs.frozen
class CheckResult:
    qualname: str
    key: str
    stored: Path
    stored_digest: str
    rebuilt_digest: str
    differences: tuple[Difference, ...]
    # recorded export options of the stored artifact that differ from this export's
    packing: tuple[tuple[str, object, object], ...] = ()
    log: str = ""
    damaged: str = ""  # what is wrong with the stored copy's bytes, when they are not its record's

    @property
    def identical(self) -> bool:
        return not self.damaged and self.stored_digest == self.rebuilt_digest


def check_layer(prepared: Prepared, qualname: str, reporter: Reporter) -> CheckResult:
    runner = make.LayerRunner(prepared, reporter)
    lp = prepared.plan.by_name()[qualname]
    layer: Layer = prepared.graph.nodes[qualname]["layer"]
    if not layer.artifact:
        raise InputError(f"{qualname} has no artifact to compare (artifact = false)", "make --check")
    record = runner.store.record(lp.key)
    if record is None or not runner.store.has(lp.key):
        raise EfabuildError(f"{qualname}: no stored artifact for key {short(lp.key)}: "
                            f"build it first (efabuild make {qualname})")
    stored = runner.store.lookup(lp.key, platform=lp.platform or None)  # a fetch from S3 verifies what it writes
    record, damaged = _verified_record(runner.store, lp.key, record)
    farm = _farm(runner, layer, qualname)
    runner.builders = builders_for(runner, farm)
    if farm is None and layer.parent and prepared.plan.by_name()[lp.parent].key not in runner.tags:
        raise EfabuildError(f"{qualname}: its parent {layer.parent} is not in the engine and --check does not "
                            f"rebuild parents: run `efabuild make {layer.parent}` first")
    log_path = runner.store_root / "logs" / layer.graph / layer.name / f"{lp.key}.check.log"
    # named by its owner: a killed check's directory is removed by the next make or gc
    work = _tmp(runner.store_root) / owned_name(CHECK_PREFIX, layer.name)
    work.mkdir(mode=0o700)
    try:
        reporter.started(qualname, "check", f"rebuilding {short(lp.key)} without the build cache")
        rebuild = _rebuild_here if farm is None else _rebuild_on_farm
        rebuilt = rebuild(runner, layer, lp, work / "rebuilt.sqsh", log_path)
        differences: tuple[Difference, ...] = ()
        if damaged or rebuilt.digest != record.digest:
            try:
                differences = tuple(compare(read_sqsh(stored), read_sqsh(rebuilt.path)))
            except EfabuildError:
                if not damaged:
                    raise
                # a damaged file may not even read as a squashfs: the damage is what the check reports
        now = {"mksquashfs": list(rebuilt.options), "time_clamp": rebuilt.time_clamp, "rc_labels": RC_LABELS}
        packing = tuple((name, record.export.get(name), now[name]) for name in _PACKING
                        if record.export.get(name) != now[name])
        return CheckResult(qualname, lp.key, stored, record.digest, rebuilt.digest, differences, packing,
                           str(log_path), damaged)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _verified_record(store, key: str, record):  # noqa: ANN001, ANN202 - a Store, an ArtifactRecord
    """(the record of the copy compared, '' or what is wrong with its bytes): the stored file is
    re-hashed against the record of its own tier, so a rebuild equal to the record is never called
    identical to a file that is no longer those bytes."""
    hit = store.local_hit(key)
    if hit is None:  # lookup just found or fetched it; gone meanwhile (gc, another user)
        raise EfabuildError(f"stored artifact {short(key)} vanished while being checked: check again")
    tier, path = hit
    record = tier.record(key) or record
    try:
        check_file(tier.name, path, record)
    except DamagedCopy as exc:
        return record, str(exc)
    return record, ""


def _farm(runner, layer: Layer, qualname: str):  # noqa: ANN001, ANN202 - a make.run.LayerRunner; a Farm or None
    """The builders a make of this workspace uses, when they cannot see the engine's images (None
    otherwise); checked as make checks them, and the parent (or, for a root, the base) must be
    where they can pull it: one line saying what to do when it is not."""
    ws = runner.ws
    farm = Farm.start(ws.settings.builder, runner.engine, ws.settings.registry, notices.warn)
    if farm is None:
        return None
    if not layer.parent:
        problem = unpullable_base(runner.p, [qualname])
        if problem:
            raise InputError(problem, "BUILD.toml [builder]")
        return farm
    parent = runner.p.graph.nodes[runner.plans[qualname].parent]["layer"]
    parent_key = runner.plans[runner.plans[qualname].parent].key
    try:
        farm.ref(runner.engine, parent.name, parent_key, runner.tags.get(parent_key))
    except RegistryError:
        raise EfabuildError(f"{qualname}: its parent {layer.parent} ({short(parent_key)}) is not in the registry "
                            f"{ws.settings.registry.url} nor in this engine, and --check does not rebuild parents: "
                            f"run `efabuild make {layer.parent}` first") from None
    return farm


def _how(runner, qualname: str) -> dict:  # noqa: ANN001 - a make.run.LayerRunner
    return dict(on_line=lambda text: runner.reporter.line(qualname, text), cancel=runner.cancel,
                redact=runner.redact, log_root=runner.store_root)


def _rebuild_here(runner, layer: Layer, lp, out: Path, log_path: Path):  # noqa: ANN001, ANN202
    """Rebuild in the engine, FROM the parent's image there; export it as make does. The image
    gets a tag naming this process (see leftovers), removed after the export."""
    tag = check_image_tag(layer.name, lp.key)
    with runner.layer_context(layer, lp) as context_dir:
        request = runner.build_request(layer, lp, context_dir, tag, no_cache=True)
        build_layer(runner.engine, request, log_path, **_how(runner, lp.qualname))
    try:
        return _export_as_stored(runner, layer, lp, out, tag)
    finally:
        untag_image(runner.engine, tag)


def _rebuild_on_farm(runner, layer: Layer, lp, out: Path, log_path: Path):  # noqa: ANN001, ANN202
    """Rebuild as a farm make builds, FROM the parent by digest in the registry, pushed by BuildKit
    under the layer's check tag; export it as a farm make does, streamed from a builder."""
    farm = runner.builders.farm
    with runner.layer_context(layer, lp) as context_dir:
        request = runner.build_request(layer, lp, context_dir, farm.check_name(layer.name, lp.key), no_cache=True)
        ref = farm.rebuild(layer.name, lp.key, request, log_path, **_how(runner, lp.qualname))
    try:
        return _export_as_stored(runner, layer, lp, out, ref)
    finally:
        farm.forget(ref)


def _export_as_stored(runner, layer: Layer, lp, out: Path, tag: str):  # noqa: ANN001, ANN202
    """Export the rebuild `tag` the way the stored artifact was made: written from the same
    ancestor when its record says it was (else whole), so the bytes compare like for like."""
    made = runner.store.record(lp.key).export.get("incremental") or {}
    if "ancestor" not in made:
        return export_artifact(runner.export_request(layer, lp, tag=tag), out, cancel=runner.cancel)
    with ancestor_copy(runner.p, lp.qualname, key=str(made["ancestor"]), digest=str(made.get("ancestor_digest")),
                       signer=runner.signer) as (ancestor, why_not):
        if ancestor is None:
            raise EfabuildError(f"{lp.qualname}: stored as written from ancestor {short(str(made['ancestor']))}, "
                                f"which cannot be used now ({why_not}): restore it and check again")
        request = runner.export_request(layer, lp, ancestor, tag=tag)
        result = export_artifact(request, out, cancel=runner.cancel)
    if "ancestor" not in (result.incremental or {}):
        raise EfabuildError(f"{lp.qualname}: stored as written from ancestor {short(str(made['ancestor']))}, but "
                            f"the rebuild could not be: {(result.incremental or {}).get('full', '?')}")
    return result


def _tmp(store_root: Path) -> Path:
    path = store_root / "tmp"
    path.mkdir(parents=True, exist_ok=True)
    return path


def to_json(result: CheckResult) -> dict:
    """One check in the JSON convention: name, key, path (the stored .sqsh)."""
    data = attrs.asdict(result, recurse=True)
    del data["qualname"], data["stored"]
    return data | {"name": result.qualname, "path": str(result.stored), "identical": result.identical}


def render(result: CheckResult, limit: int = 50) -> str:
    """What the user reads: identical, damaged, or which files differ and how, and the likely causes."""
    if result.identical:
        return (f"{result.qualname} ({short(result.key)}): rebuilt without the build cache, identical to "
                f"the stored artifact ({result.stored_digest})")
    if result.damaged:
        lines = [f"{result.qualname} ({short(result.key)}): the stored artifact is damaged: {result.damaged}"]
        if result.rebuilt_digest == result.stored_digest:
            lines.append(f"  the rebuild is identical to the bytes its record names ({result.stored_digest}): "
                         f"delete {result.stored} and run `efabuild make {result.qualname}` to restore it")
            lines.extend(_difference_lines(result.differences, limit))
            return "\n".join(lines)
        lines.append(f"  the rebuild differs from the bytes its record names ({result.stored_digest}) too")
    else:
        lines = [f"{result.qualname} ({short(result.key)}): the rebuild differs from the stored artifact "
                 f"{result.stored}"]
    listed = _difference_lines(result.differences, limit)
    if listed:
        lines.extend(listed)
    elif not result.damaged:
        lines.append("  every file is the same: the difference is in how the .sqsh was packed")
    for name, before, after in result.packing:
        shown = _ABSENT.get(name, "absent") if before is None else before
        lines.append(f"  stored with export option {name} = {shown}, rebuilt with {after}")
    lines.append("  usual cause: network fetches at build time (apt-get, pip, curl) get whatever the "
                 "server has that day: pin versions and digests (lint's EFA017 lists unpinned apt-get "
                 "installs); time-stamped output (date, timestamp-checked .pyc from a plain import) "
                 "differs at every build")
    lines.append(f"  log: {result.log}")
    return "\n".join(lines)


def _difference_lines(differences: tuple[Difference, ...], limit: int) -> list[str]:
    counts = summary(differences)
    if not counts:
        return []
    lines = ["  " + ", ".join(f"{n} {kind}" for kind, n in counts.items())]
    lines.extend("  " + d.render() for d in differences[:limit])
    if len(differences) > limit:
        lines.append(f"  … and {len(differences) - limit} more")
    return lines
