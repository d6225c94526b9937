"""An artifact layer's `.sqsh` written from its ancestor's: the nearest artifact layer below it on
its chain (a rule of the graph, not of what is stored). The ancestor's data blocks are reused as
they are; only the layers the child adds are read, from the engine's layer directories
(layerdiff). Each condition that fails names why, and the export is then a full one:

- the ancestor's copy is in the store and has its record's size and digest (checked, then read
  through the descriptor that was checked: never a child built on other bytes);
- its record's export options are the child's (PACKING, compared as recorded);
- the child's pinned paths (the WORKDIR and VOLUME mount points an export dates to its epoch)
  are the ancestor's, but for paths the ancestor lacks (a WORKDIR the child's own layer makes):
  a changed WORKDIR re-dates paths the ancestor has, whose entries are reused as they are;
- the child image's diff IDs start with exactly the ancestor image's;
- the engine is on this host, with the overlay2 driver; and the writer (export/squashfs) takes it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import blake3

from efabuild.engine.client import Engine
from efabuild.engine.images import built_for_key, layer_facts
from efabuild.errors import EfabuildError, NotFound
from efabuild.host import children, statstamp
from efabuild.host.blake3tree import Tree
from efabuild.host.digest import PREFIX, Splice, read_pieces
from efabuild.export.layerdiff import LayerSourceUnavailable, overlay_dirs, stream_layers
from efabuild.export.squashfs import write_incremental
from efabuild.export.squash import (ExportJob, ExportResult, Progress, Unkept, export_facts, keep_export,
                                    mksquashfs_options)
from efabuild.export.squashfs.superblock import SIZE as SUPERBLOCK_BYTES
from efabuild.export.tarfilter import RC_LABELS, RewritePlan
from efabuild.plan import LayerPlan, Plan
from efabuild.settings import ExportSettings
from efabuild.store.chunked.chunks import ChunkIndex

# a root artifact's reason: recorded, not shown (there is nothing to explain)
NO_ANCESTOR = "no artifact layer below it"
# why a make's export has no layer diffs to write from, whatever the ancestor
REMOTE_BUILDER = "a remote builder streams the whole image (no layer source)"
NOT_ON_THIS_HOST = "the engine is not reached through a local socket: its layer directories cannot be read here"
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


def export_incremental(engine: Engine, image: str, ancestor: Ancestor, out: Path, *, options: ExportSettings,
                       epoch: int, recorded: Mapping[str, Any], progress: Progress | None = None,
                       sha256: bool = True, chunking: tuple[int, int, int] | None = None) -> ExportResult | str:
    """`image`'s .sqsh written from `ancestor`'s at `out`, or why it cannot be (then nothing is
    written). `recorded`: the export options the child's record will hold, but time_clamp."""
    started = time.monotonic()
    cfg, _, clamp = export_facts(engine, image, options.clamp_times)
    opts = mksquashfs_options(options, epoch=epoch)
    difference = packing_difference(ancestor.export, {**recorded, "mksquashfs": list(opts), "time_clamp": clamp,
                                                      "rc_labels": RC_LABELS})
    if difference:
        return f"ancestor exported with other options: {difference}"
    plan = RewritePlan.for_config(cfg, epoch=epoch, clamp=clamp)
    try:
        if not built_for_key(engine, ancestor.tag, ancestor.key):
            return f"the engine's {ancestor.tag} is not the ancestor's image"
        ancestor_cfg, _, _ = export_facts(engine, ancestor.tag, False)
    except NotFound:
        return f"the engine has no ancestor image {ancestor.tag}"
    # as the ancestor was exported (its clamp is the child's, checked above with the options)
    ancestor_plan = RewritePlan.for_config(ancestor_cfg, epoch=epoch, clamp=clamp)
    try:
        redated = _present(ancestor.sqsh, ancestor_plan.pinned ^ plan.pinned)
    except (EfabuildError, subprocess.TimeoutExpired) as exc:
        return f"cannot list the ancestor's entries: {exc}"
    if redated:
        return f"WORKDIR or VOLUME re-date /{redated[0]}, which the ancestor has"
    try:
        dirs = _diff_dirs(engine, image, ancestor.tag, ancestor.export.get("image_layers"))
    except (LayerSourceUnavailable, NotFound) as exc:
        return str(exc)
    streams = stream_layers(dirs)
    tmp = out.parent / f"{out.name}.{os.urandom(4).hex()}.tmp"
    try:
        try:
            written = write_incremental(ancestor.sqsh, streams, tmp, plan=plan, ancestor_plan=ancestor_plan,
                                        progress=(lambda n: progress(n, None)) if progress else None)
        except EfabuildError as exc:  # a layer it refuses: a full export reads the image afresh
            written = exc
        problems = [p for s in streams for p in s.errors_seen]  # a cut stream is what the writer saw
        if problems:
            return f"a layer directory could not be read: {problems[0]}"
        if isinstance(written, EfabuildError):
            return f"the incremental writer refused it: {written}"
        if written.full_needed:
            return written.reason
        job = ExportJob(image, out, opts, plan, None, started, chunking, cfg.labels)
        try:
            result = keep_export(tmp, job, sha256, **reuse(ancestor, tmp, written.reused_bytes))
        except Unkept as exc:
            return str(exc)
    finally:
        for stream in streams:
            stream.close()
        tmp.unlink(missing_ok=True)
    made = {"ancestor": ancestor.key, "ancestor_digest": ancestor.digest, "dead_bytes": int(written.dead_bytes)}
    return attrs.evolve(result, incremental=made)


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
            "tree": ancestor.tree, "still_valid": functools.partial(_unchanged, ancestor)}


def _owned(path: Path) -> bool:
    """Whether only this user can change the file: theirs, writable by no one else. Another user
    who owns a file in a shared tier can change its bytes without moving its stamp (through a
    mapping they keep writable: a page written again before it goes back to disk moves no time)."""
    try:
        info = os.stat(path)
    except OSError:
        return False
    return not statstamp.others_may_write(info)


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


def _diff_dirs(engine: Engine, image: str, ancestor_tag: str, exported_from: object) -> list[str]:
    """The layer directories `image` adds over the ancestor's image, oldest first; that image
    must be the build of its key that the ancestor's copy was exported from (`exported_from`, its
    record's image_layers): another build of the same key (a RUN that fetched other bytes on
    another machine) would give a child of that build's files under this build's layers."""
    child, ancestor = layer_facts(engine, image), layer_facts(engine, ancestor_tag)
    if child is None or ancestor is None:
        raise LayerSourceUnavailable(NOT_ON_THIS_HOST)
    (driver, layers), (_, below) = child, ancestor
    if exported_from is None:
        raise LayerSourceUnavailable("the ancestor's record names no image layers (exported before they were "
                                     "recorded, or on a farm)")
    if exported_from != layers_digest(below):
        raise LayerSourceUnavailable(f"the engine's {ancestor_tag} is another build of its key than the one the "
                                     f"ancestor's copy was exported from")
    if layers[:len(below)] != below:
        raise LayerSourceUnavailable("the image's layers do not start with the ancestor image's")
    return overlay_dirs(driver, len(layers) - len(below))


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
