"""The entry point: a child `.sqsh` from its ancestor's and the layer diffs between them.

    layers ──apply──► tree (+ a spool of the layers' file bodies)
           ──► new blocks at A… in the tree's path order, then every table, then the superblock at 0
    ancestor.sqsh [96, A) ──clone/copy──► out [96, A)    (A: where its inode table began)

The reused range is copied last, so that everything else of the child is known before it: a
caller's sha256 (which cannot start anywhere but at byte 0) reads the ancestor's pages for that
range while the copy runs, rather than after it (`before_copy`).

Atomic: everything goes to a temp file beside `out`, fsynced, then renamed; any failure or kill
leaves `out` as it was. When the child would carry too many blocks no inode uses, or an input
is one this writer does not handle, nothing is written and the result says `full_needed`.
"""

from __future__ import annotations

import functools
import os
import struct
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

import attrs

from efabuild.errors import EfabuildError
from efabuild.export.squashfs.aliases import read_file, stale_alias
from efabuild.export.squashfs.apply import Applier
from efabuild.export.squashfs.data import DataWriter
from efabuild.export.squashfs.layertar import LayerReader
from efabuild.export.squashfs.reader import SIZE_MASK, Ancestor, read_ancestor
from efabuild.export.squashfs.superblock import SIZE as SUPERBLOCK_BYTES
from efabuild.export.squashfs.tree import FILE, NO_FRAGMENT, Node, Unsupported, walk
from efabuild.export.squashfs.writer import write_tables
from efabuild.export.tarfilter import RewritePlan
from efabuild.host.fsutil import fsync_dir
from efabuild.host.rangecopy import RangeCopier

# Above a quarter of dead bytes, a full export pays off: every node that starts a job from the
# child copies and caches those bytes again, while a full export costs one pass over the tree
# (minutes, once). A chain of small changes stays far below it; replacing a big framework in a
# top layer crosses it, and the next child starts from a compact full export again.
DEFAULT_MAX_DEAD_SHARE = 0.25


@attrs.frozen
class IncrementalResult:
    path: Path
    size: int = 0
    reused_bytes: int = 0  # the ancestor's prefix, copied or cloned
    new_bytes: int = 0  # everything else: new blocks, the tables, the padding
    dead_bytes: int = 0  # bytes of the ancestor's blocks no inode of the child references
    files_written: int = 0  # regular files whose data was written (from the layers or the config)
    full_needed: bool = False
    reason: str = ""


def write_incremental(ancestor: Path, layers: Sequence[BinaryIO], out: Path, *, plan: RewritePlan,
                      max_dead_share: float = DEFAULT_MAX_DEAD_SHARE,
                      progress: Callable[[int], None] | None = None,
                      ancestor_plan: RewritePlan | None = None,
                      before_copy: Callable[[int, int], None] | None = None,
                      ancestor_read: Callable[[], Ancestor] | None = None) -> IncrementalResult:
    """Write `out` from `ancestor` (a `.sqsh` the export wrote, in full or by this function) and
    the uncompressed layer tar streams `layers` (oldest first) as a full export of the child with
    `plan` would, reusing the ancestor's blocks; `progress(layer bytes read)` now and then.
    `ancestor_plan`, the plan the ancestor was exported with, lets it check that the ancestor's
    unchanged entries got the times the child's would (the same clamp, no path pinned that the
    child does not pin); without it they are taken as the same. `before_copy(fd, A)` is called
    once every byte of the child but the reused range [96, A) is written, through `fd` (the temp
    file, open for reading: dup it to keep it), just before that range is copied. `ancestor_read`
    gives `ancestor` as read_ancestor reads it, when the caller began that earlier (read_ahead).

    Returns `full_needed` (and writes nothing) for inputs this writer does not handle and when the
    dead share would pass `max_dead_share`; raises InputError for a corrupt ancestor or layer."""
    out = Path(out).absolute()
    try:
        parent = ancestor_read() if ancestor_read is not None else read_ancestor(Path(ancestor))
    except Unsupported as exc:
        return IncrementalResult(out, full_needed=True, reason=f"the ancestor {ancestor}: {exc}")
    problem = _other_times(parent.sb.mkfs_time, plan, ancestor_plan)
    if problem:
        return IncrementalResult(out, full_needed=True, reason=problem)
    tmp = out.parent / f"{out.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        # 0644 whatever the umask (a shared store's is 002): a descriptor opened for writing while
        # it was the group's would outlive the 0444 it is published with
        with os.fdopen(os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644), "w+b") as f:
            result = _write(parent, layers, f, out, plan, progress, before_copy)
            if result.full_needed or result.dead_bytes > max_dead_share * result.size:
                return attrs.evolve(result, full_needed=True, reason=result.reason or (
                    f"{result.dead_bytes} of its {result.size} bytes would be dead blocks "
                    f"(more than {max_dead_share:.0%})"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
        fsync_dir(out.parent)
        return result
    except OSError as exc:  # the disk, not the input: no space, a read-only or missing directory
        raise EfabuildError(f"{out}: cannot write it: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)


def _other_times(mkfs_time: int, plan: RewritePlan, ancestor_plan: RewritePlan | None) -> str:
    """Why the ancestor's entries may carry other times than the child's export gives them."""
    if mkfs_time != plan.epoch:
        return f"the ancestor was exported with epoch {mkfs_time}, the child's is {plan.epoch}"
    if ancestor_plan is None:
        return ""
    if ancestor_plan.clamp != plan.clamp:
        return f"the ancestor's times were clamped to {ancestor_plan.clamp}, the child's are to {plan.clamp}"
    unpinned = sorted(ancestor_plan.pinned - plan.pinned)
    if unpinned:
        return f"the ancestor pinned the time of {unpinned[0]!r}, the child does not (another working directory?)"
    return ""


def _write(parent: Ancestor, layers: Sequence[BinaryIO], f: BinaryIO, out: Path, plan: RewritePlan,
           progress: Callable[[int], None] | None,
           before_copy: Callable[[int, int], None] | None) -> IncrementalResult:
    prefix = parent.data_end
    fragments = list(parent.fragments)
    data = DataWriter(f, prefix, parent.sb, parent.codec, fragments)
    # unnamed (O_TMPFILE), beside the child: gone with the process, whatever stops it
    with tempfile.TemporaryFile(dir=out.parent) as spool:
        applier = Applier(parent.root, plan, data, spool, functools.partial(read_file, parent))
        consumed = 0
        try:
            for number, layer in enumerate(layers, 1):
                # a stream may name itself (a registry's blob): the writer's one line then says which
                reader = LayerReader(layer, getattr(layer, "where", f"layer {number}"), progress, consumed)
                applier.layer(reader)
                consumed = reader.consumed
            applier.finish()
        except Unsupported as exc:
            return IncrementalResult(out, full_needed=True, reason=str(exc))
    alias = stale_alias(parent, parent.root, applier.before, applier.written)
    if alias:
        return IncrementalResult(out, full_needed=True, reason=alias)
    write_tables(f, data.pos, parent.root, parent.sb, parent.codec, fragments)
    size = f.seek(0, os.SEEK_END)
    f.flush()
    if before_copy is not None:
        before_copy(f.fileno(), prefix)
    # the superblock is the child's (written above): the ancestor's bytes after it, up to A
    with open(parent.path, "rb") as src:
        RangeCopier(f.fileno()).copy(src.fileno(), SUPERBLOCK_BYTES, SUPERBLOCK_BYTES, prefix - SUPERBLOCK_BYTES)
    return IncrementalResult(out, size=size, reused_bytes=prefix, new_bytes=size - prefix,
                             dead_bytes=dead_bytes(parent, parent.root), files_written=data.files)


def dead_bytes(parent: Ancestor, root: Node) -> int:
    """Bytes of the ancestor's data region that no file of the tree `root` uses any more."""
    spans: list[tuple[int, int]] = []
    live_fragments: set[int] = set()
    seen: set[int] = set()
    for _path, node in walk(root):
        if node.kind != FILE or id(node) in seen:
            continue
        seen.add(id(node))
        if node.blocks and node.blocks_start < parent.data_end:
            stored = sum(size & SIZE_MASK for (size,) in struct.iter_unpack("<I", node.blocks))
            spans.append((node.blocks_start, node.blocks_start + stored))
        if node.fragment != NO_FRAGMENT and node.fragment < len(parent.fragments):
            live_fragments.add(node.fragment)
    for index in live_fragments:
        start, size = parent.fragments[index]
        spans.append((start, start + (size & SIZE_MASK)))
    live = reach = 0
    for start, end in sorted(spans):
        start = max(start, reach)
        if end > start:
            live += end - start
            reach = end
    return parent.data_end - parent.data_start - live
