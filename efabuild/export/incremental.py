"""An artifact layer's `.sqsh` written from its ancestor's: the nearest artifact layer below it on
its chain (a rule of the graph, not of what is stored). The ancestor's data blocks are reused as
they are; only the layers the child adds are read: from the engine's layer directories
(layerdiff, `EngineLayers`) when the engine on this host has the image, else from the registry's
layer blobs (registrylayers, `RegistryLayers`: a farm). The writer's output is a function of the
merged tree, so either source gives the same bytes. Each condition that fails names why, and the
export is then a full one:

- the ancestor's copy is in the store and has its record's size and digest (checked, then read
  through the descriptor that was checked: never a child built on other bytes);
- its record's export options are the child's (PACKING, compared as recorded);
- the child's pinned paths (the WORKDIR and VOLUME mount points an export dates to its epoch)
  are the ancestor's, but for paths the ancestor lacks (a WORKDIR the child's own layer makes):
  a changed WORKDIR re-dates paths the ancestor has, whose entries are reused as they are;
- the child image's diff IDs start with exactly the ancestor image's, and the ancestor's record
  (image_layers) names the very build whose layers these are;
- the source can give the layers: the engine is on this host, with the overlay2 driver; or the
  registry serves each blob, with the digests its manifest and config name (checked as it streams);
- and the writer (export/squashfs) takes it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import attrs
import blake3

from efabuild.engine.client import Engine
from efabuild.engine.images import built_for_key, layer_facts
from efabuild.errors import EfabuildError, NotFound
from efabuild.host import children, statstamp
from efabuild.host.blake3tree import Tree
from efabuild.host.digest import PREFIX, Sha256Pass, Splice, read_pieces
from efabuild.export.enroot import ImageConfig
from efabuild.export.layerdiff import LayerSourceUnavailable, overlay_dirs, stream_layers
from efabuild.export.registrylayers import RegistryLayers
from efabuild.export.squashfs import read_ahead, write_incremental
from efabuild.export.squash import (ExportJob, ExportResult, Progress, Unkept, export_facts, keep_export,
                                    mksquashfs_options)
from efabuild.export.squashfs.superblock import SIZE as SUPERBLOCK_BYTES
from efabuild.export.tarfilter import RC_LABELS, RewritePlan
from efabuild.plan import LayerPlan, Plan
from efabuild.settings import ExportSettings
from efabuild.signing import verifycache
from efabuild.chunks.cdc import ChunkIndex, lends_all

# a root artifact's reason: recorded, not shown (there is nothing to explain)
NO_ANCESTOR = "no artifact layer below it"
# why a make's export has no layer diffs to write from, whatever the ancestor
REMOTE_BUILDER = "a remote builder streams the whole image and no [registry] holds its layer blobs"
NOT_ON_THIS_HOST = "the engine is not reached through a local socket: its layer directories cannot be read here"
# a full export asked for: to compare with an incremental one, or to compact a child's dead bytes
FULL_ASKED = "a full export was asked for ([export] incremental = false, or make --full-export)"
# the recorded export options that decide a .sqsh's bytes: an ancestor's must be the child's
_LIST_TIMEOUT_S = 120.0
PACKING = ("mksquashfs", "compression", "compress_data", "epoch", "enroot_format", "rc_labels", "time_clamp")


@attrs.frozen
class Ancestor:
    """The ancestor's artifact as the store holds it, checked against its record."""

    key: str
    tag: str  # its image in the engine, by its key's tag
    sqsh: Path  # the checked copy, pinned to its open descriptor
    digest: str
    export: Mapping[str, Any]  # its record's export options
    # its stat stamp from before it was checked; None: the caller vouches for the bytes (a test's
    # own file), and the child is then hashed from its own pages
    stamp: tuple[int, ...] | None = None
    index: ChunkIndex | None = None  # its kept chunk index, unchecked: lends the child its chunks
    tree: Tree | None = None  # its units' chaining values, from its check: the child is hashed from them


def ancestor_layer(plan: Plan, qualname: str) -> LayerPlan | None:
    """The nearest artifact layer below `qualname` on its chain, or None."""
    below = plan.chain(qualname)[:-1]
    return next((lp for lp in reversed(below) if lp.artifact), None)


def packing_difference(ancestor: Mapping[str, Any], child: Mapping[str, Any]) -> str | None:
    """The first export option recorded differently for the ancestor than for the child."""
    return next((name for name in PACKING if ancestor.get(name) != child.get(name)), None)


def full(reason: str) -> dict:
    return {"full": reason}


class EngineLayers:
    """The layer diffs in this host's engine: its overlay2 directories (layerdiff)."""

    where = "engine's"

    def __init__(self, engine: Engine, image: str) -> None:
        self.engine, self.image = engine, image

    def facts(self, clamp_times: bool) -> tuple[ImageConfig, int | None]:
        cfg, _, clamp = export_facts(self.engine, self.image, clamp_times)
        return cfg, clamp

    def ancestor_config(self, ancestor: Ancestor) -> ImageConfig:
        try:
            if not built_for_key(self.engine, ancestor.tag, ancestor.key):
                raise LayerSourceUnavailable(f"the engine's {ancestor.tag} is not the ancestor's image")
            return export_facts(self.engine, ancestor.tag, False)[0]
        except NotFound:
            raise LayerSourceUnavailable(f"the engine has no ancestor image {ancestor.tag}") from None

    def diff_ids(self, ancestor: Ancestor) -> tuple[tuple[str, ...], tuple[str, ...]]:
        child, below = layer_facts(self.engine, self.image), layer_facts(self.engine, ancestor.tag)
        if child is None or below is None:
            raise LayerSourceUnavailable(NOT_ON_THIS_HOST)
        self._driver = child[0]
        return child[1], below[1]

    def open(self, first: int, count: int) -> list[BinaryIO]:
        return stream_layers(overlay_dirs(self._driver, count - first))

    def problems(self, streams: list[BinaryIO], verify: bool) -> list[str]:
        # a cut stream is what the writer saw
        return [f"a layer directory could not be read: {p}" for s in streams for p in s.errors_seen]


def export_incremental(source: EngineLayers | RegistryLayers, ancestor: Ancestor, out: Path, *,
                       options: ExportSettings, epoch: int, recorded: Mapping[str, Any],
                       progress: Progress | None = None, sha256: bool = True, sha256_beside_copy: bool = False,
                       chunking: tuple[int, int, int] | None = None) -> ExportResult | str:
    """`source.image`'s .sqsh written from `ancestor`'s at `out`, or why it cannot be (then nothing
    is written); `source`: EngineLayers or RegistryLayers; `recorded`: the export options the
    child's record will hold, but time_clamp. `sha256_beside_copy`: compute the sha256 too where
    it can run while the ancestor's range is copied (an ancestor only this user can change), for
    a caller who would otherwise compute it afterwards (make); `sha256`: compute it in any case."""
    started = time.monotonic()
    image = source.image
    opts = mksquashfs_options(options, epoch=epoch)
    # the ancestor's tables are parsed while the engine answers _plans' questions
    ancestor_read = read_ahead(ancestor.sqsh)
    planned = _plans(source, ancestor, options, epoch, {**recorded, "mksquashfs": list(opts)})
    if isinstance(planned, str):
        return planned
    cfg, plan, ancestor_plan = planned
    try:
        streams = _diff_streams(source, ancestor)
    except (LayerSourceUnavailable, NotFound) as exc:
        return str(exc)
    tmp = out.parent / f"{out.name}.{os.urandom(4).hex()}.tmp"
    beside_copy = (sha256 or sha256_beside_copy) and ancestor.stamp is not None and _owned(ancestor.sqsh)
    early = _Sha256BesideCopy(ancestor) if beside_copy else None
    try:
        try:
            written = write_incremental(ancestor.sqsh, streams, tmp, plan=plan, ancestor_plan=ancestor_plan,
                                        progress=(lambda n: progress(n, None)) if progress else None,
                                        before_copy=early.start if early else None, ancestor_read=ancestor_read)
        except EfabuildError as exc:  # a layer it refuses: a full export reads the image afresh
            written = exc
        # first: a writer that refused a cut or tampered stream says less than the stream; each blob's
        # digests are checked (its rest read) unless the writer declined it (Unsupported, dead bytes)
        problems = source.problems(streams, isinstance(written, EfabuildError) or not written.full_needed)
        if problems:
            return problems[0]
        if isinstance(written, EfabuildError):
            return f"the incremental writer refused it: {written}"
        if written.full_needed:
            return written.reason
        job = ExportJob(image, out, opts, plan, None, started, chunking, cfg.labels)
        terms = reuse(ancestor, tmp, written.reused_bytes)
        running = early.for_terms(terms) if early else None
        try:  # wanted now, it is waited for here; else it goes on while the caller describes the child
            result = keep_export(tmp, job, sha256, **terms, sha256_pass=running if sha256 else None)
        except Unkept as exc:
            return str(exc)
        if running is not None and not sha256:
            result = attrs.evolve(result, sha256_later=early.handed_on(terms["still_valid"]))
        if terms.get("seed") is not None and not terms.get("seed_checked") and result.index is not None:
            _remember_seed(ancestor, result.index, terms["splice"])
    finally:
        for stream in streams:
            stream.close()
        if early:
            early.close()
        tmp.unlink(missing_ok=True)
    made = {"ancestor": ancestor.key, "ancestor_digest": ancestor.digest, "dead_bytes": int(written.dead_bytes)}
    return attrs.evolve(result, incremental=made)


class _Sha256BesideCopy:
    """The child's sha256, begun by the writer just before it copies the ancestor's range (its
    `before_copy`): the child's own bytes, and the ancestor's pages for that range, as reuse() has
    keep_export read them (a sha256 is a chain from byte 0: it cannot start sooner)."""

    def __init__(self, ancestor: Ancestor) -> None:
        self.ancestor, self.running = ancestor, None

    def start(self, fd: int, reused: int) -> None:
        held = os.dup(fd)  # the writer's temp file, renamed meanwhile
        splice = Splice(str(self.ancestor.sqsh), SUPERBLOCK_BYTES, reused)
        self.running = Sha256Pass(f"/proc/self/fd/{held}", splice, holding=held)

    def for_terms(self, terms: Mapping[str, Any]) -> Sha256Pass | None:
        """The pass, if keep_export hashes the child over that same splice; else none (the copy
        is no longer this user's alone: the child is hashed from its own bytes)."""
        if self.running is not None and terms.get("splice") != self.running.splice:
            self.close()
        return self.running

    def handed_on(self, still_valid: Callable[[], str | None]) -> Callable[[], str]:
        """The sha256, for a caller to wait for after the child was kept: the ancestor's stamp is
        checked again once it is done (its pages were read after keep_export's check)."""
        running, self.running = self.running, None
        assert running is not None
        done: list[str] = []

        def result() -> str:
            if not done:
                value = running.result()
                problem = still_valid()
                if problem:
                    raise EfabuildError(f"{self.ancestor.sqsh}: {problem} (its sha256 was being taken); "
                                        "nothing was published: make again")
                done.append(value)
            return done[0]
        return result

    def close(self) -> None:
        """Stopped where unused (not handed on)."""
        if self.running is not None:
            self.running.abandon()
            self.running = None


def reuse(ancestor: Ancestor, child: Path, reused: int) -> dict[str, Any]:
    """keep_export()'s terms for a child whose bytes [superblock, reused) were copied from the
    ancestor: hashed (and chunked) from the ancestor's subtrees and pages where its stamp proves
    them the checked ones (a file only this user can change, _owned); else from the child's own
    bytes, whose prefix must then make the ancestor's checked digest."""
    if ancestor.stamp is None:  # the caller vouches for the bytes: hashed as a file of its own
        return {}
    if not _owned(ancestor.sqsh):
        return {"still_valid": functools.partial(_copied_as_checked, child, ancestor, reused)}
    return {"splice": Splice(str(ancestor.sqsh), SUPERBLOCK_BYTES, reused), "seed": ancestor.index,
            "seed_checked": _seed_checked(ancestor), "tree": ancestor.tree,
            "still_valid": functools.partial(_unchanged, ancestor)}


# The ancestor's kept chunk index is a store's claim, so each chunk it lends a child is hashed
# (0.3 s of a 1.4 GB child). That an index describes the bytes with a given digest is a fact of
# the two alone: once a child found every chunk it lent true, this user's verification cache
# remembers it, and the next child of the same ancestor (the edit loop's) lends them unhashed.
def _seed_fact(ancestor: Ancestor) -> tuple[str, str, str]:
    index = ancestor.index
    assert index is not None
    return f"chunk index of {ancestor.digest}", hashlib.sha256(index.to_json()).hexdigest(), ancestor.digest


def _seed_checked(ancestor: Ancestor) -> bool:
    return ancestor.index is not None and verifycache.content_verified(*_seed_fact(ancestor))


def _remember_seed(ancestor: Ancestor, index: ChunkIndex, splice: Splice) -> None:
    assert ancestor.index is not None
    if lends_all(ancestor.index, index, splice):
        verifycache.remember_content(*_seed_fact(ancestor))


def _owned(path: Path) -> bool:
    """Whether only this user can change the file: theirs, writable by no one else. Another user
    who owns a file in a shared tier can change its bytes without moving its stamp (through a
    mapping they keep writable: a page written again before it goes back to disk moves no time)."""
    try:
        info = os.stat(path)
    except OSError:
        return False
    return not statstamp.others_may_write(info)


def _plans(source: EngineLayers | RegistryLayers, ancestor: Ancestor, options: ExportSettings, epoch: int,
           recorded: Mapping[str, Any]) -> tuple[ImageConfig, RewritePlan, RewritePlan] | str:
    """(the child's config, its plan, the ancestor's plan), or why the ancestor was exported
    otherwise than the child would be (options, clamp, re-dated paths)."""
    try:
        cfg, clamp = source.facts(options.clamp_times)
    except LayerSourceUnavailable as exc:
        return str(exc)
    difference = packing_difference(ancestor.export, {**recorded, "time_clamp": clamp, "rc_labels": RC_LABELS})
    if difference:
        return f"ancestor exported with other options: {difference}"
    plan = RewritePlan.for_config(cfg, epoch=epoch, clamp=clamp)
    try:
        ancestor_cfg = source.ancestor_config(ancestor)
    except LayerSourceUnavailable as exc:
        return str(exc)
    # as the ancestor was exported (its clamp is the child's, checked above with the options)
    ancestor_plan = RewritePlan.for_config(ancestor_cfg, epoch=epoch, clamp=clamp)
    try:
        redated = _present(ancestor.sqsh, ancestor_plan.pinned ^ plan.pinned)
    except (EfabuildError, subprocess.TimeoutExpired) as exc:
        return f"cannot list the ancestor's entries: {exc}"
    if redated:
        return f"WORKDIR or VOLUME re-date /{redated[0]}, which the ancestor has"
    return cfg, plan, ancestor_plan


def _unchanged(ancestor: Ancestor) -> str | None:
    """Why the ancestor's bytes may not be the ones that were checked, now that the child has
    been written and hashed from them; None when its stamp says they are (a file of this user's,
    _owned)."""
    if ancestor.stamp is None:
        return None
    try:
        info = os.stat(ancestor.sqsh)
    except OSError as exc:
        return f"the ancestor's copy cannot be read again: {exc.strerror}"
    if statstamp.stamp(info) != tuple(ancestor.stamp):
        return "the ancestor's copy changed while the child was written from it"
    return None


def _copied_as_checked(child: Path, ancestor: Ancestor, reused: int) -> str | None:
    """Why the child's bytes [superblock, reused) may not be those of the ancestor that were
    checked: the ancestor's own superblock, then the child's prefix, then the rest of the ancestor
    must make its checked digest. Read, not mapped: another user's file truncated meanwhile ends a
    read, where a mapped page past the new end would kill this process (SIGBUS)."""
    problem = _unchanged(ancestor)
    if problem:
        return problem
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    try:
        with open(ancestor.sqsh, "rb", buffering=0) as theirs, open(child, "rb", buffering=0) as mine:
            size = os.fstat(theirs.fileno()).st_size
            for f, start, end in ((theirs, 0, SUPERBLOCK_BYTES), (mine, SUPERBLOCK_BYTES, reused),
                                  (theirs, reused, size)):
                for piece in read_pieces(f.fileno(), start, end):
                    hasher.update(piece)
                    start += len(piece)
                if start < end:  # truncated since
                    return "the ancestor's copy changed while the child was written from it"
    except OSError as exc:
        return f"the ancestor's copy cannot be read again: {exc.strerror}"
    if PREFIX + hasher.hexdigest() != ancestor.digest:
        return "the ancestor's copy changed while the child was written from it"
    return None


def layers_digest(layers: tuple[str, ...]) -> str:
    return hashlib.sha256("\n".join(layers).encode()).hexdigest()


def _diff_streams(source: EngineLayers | RegistryLayers, ancestor: Ancestor) -> list[BinaryIO]:
    """The layers the image adds over the ancestor's image, oldest first; that image must be the
    build of its key that the ancestor's copy was exported from (its record's image_layers):
    another build of the same key (a RUN that fetched other bytes on another machine) would give
    a child of that build's files under this build's layers."""
    layers, below = source.diff_ids(ancestor)
    exported_from = ancestor.export.get("image_layers")
    if exported_from is None:
        raise LayerSourceUnavailable("the ancestor's record names no image layers (exported before they were "
                                     "recorded)")
    if exported_from != layers_digest(below):
        raise LayerSourceUnavailable(f"the {source.where} {ancestor.tag} is another build of its key than the one "
                                     f"the ancestor's copy was exported from")
    if layers[:len(below)] != below:
        raise LayerSourceUnavailable("the image's layers do not start with the ancestor image's")
    return source.open(len(below), len(layers))


def _present(sqsh: Path, paths: set[str] | frozenset[str]) -> list[str]:
    """Those of the rootfs-relative `paths` that the .sqsh has (one listing per path, no deeper)."""
    found = []
    for path in sorted(paths):
        listed = children.run(["unsquashfs", "-lls", "-max-depth", str(path.count("/") + 1), "-d", "", str(sqsh),
                               path], capture_output=True, text=True, timeout=_LIST_TIMEOUT_S)
        if listed.returncode != 0:
            raise EfabuildError(f"cannot list the ancestor's {sqsh}: {listed.stderr.strip()[-200:]}")
        if any(line.endswith(f" /{path}") for line in listed.stdout.splitlines()):
            found.append(path)
    return found
