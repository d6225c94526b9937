"""An engine image → an Enroot-compatible `.sqsh`, streamed without unpacking the rootfs.

    docker create + docker export ──tar──► tarfilter ──tar──► mksquashfs - OUT -tar

The result matches `enroot import dockerd://IMAGE` (what the filter does: see `tarfilter`; the
labels a build sets from outside the key are left out of /etc/rc), with
everything owned by root and Enroot's compression options (`-comp lzo -noD` unless BUILD.toml
says otherwise). Deterministic: the superblock and the root directory get the export's fixed time
too, so the same image gives a byte-identical `.sqsh`.

The digests take a second pass: mksquashfs seeks back to write its tables and superblock, so no
single pass over its output sees the final bytes in order. The file is hashed right after
mksquashfs exits, from the page cache, through one mmap: blake3 (what the store checks) and
sha256 (what in-toto and cosign verifiers match) in parallel threads (sha256 is the slower one,
about 1 s per GB here, against minutes of squashing for a training image). When the store has a
chunked S3 tier, the blake3 pass also cuts the file into its chunks (`chunking`): the index its
publish sends from, so the publish reads only the chunks S3 lacks.
"""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING

import attrs

from efabuild.chunks.cdc import ChunkIndex, chunk_file, chunk_spliced
from efabuild.engine import containers
from efabuild.engine.client import EngineTimeout, connect, last_line
from efabuild.engine.images import LIST_TIMEOUT_S, history_times, image_facts
from efabuild.errors import EfabuildError, NotFound
from efabuild.export.enroot import ImageConfig
from efabuild.export.mksquashfs import mksquashfs_options, start_mksquashfs  # noqa: F401 - mksquashfs_options: callers take it from here
from efabuild.export.tarfilter import RewritePlan, rewrite_tar, time_clamp
from efabuild.export.tarheader import TarFormatError
from efabuild.host import children
from efabuild.host.blake3tree import Tree, spliced_digest
from efabuild.host.digest import Sha256Pass, Splice, file_digest, file_digests, spliced_digests
from efabuild.host.fsutil import fsync_dir
from efabuild.host.stops import step_boundary
from efabuild.settings import BuilderSettings, ExportSettings

if TYPE_CHECKING:
    from efabuild.engine.client import Engine

# progress(bytes streamed so far, expected total or None)
Progress = Callable[[int, "int | None"], None]

_PIPE_SIZE = 1 << 20
_CANCEL_POLL_S = 0.1
# The Enroot release whose `enroot import` output an export reproduces; recorded with every
# artifact, since the same key gives the same bytes only within one format.
ENROOT_FORMAT = "4.1.2"


@attrs.frozen
class ExportResult:
    path: Path
    size: int
    digest: str  # "blake3:<64 hex>" of the .sqsh file
    options: tuple[str, ...]  # the mksquashfs options used, for the artifact's record
    seconds: float
    sha256: str | None = None  # hex sha256 of the .sqsh file, for in-toto/cosign verifiers
    time_clamp: int | None = None  # file times later than this were set to it; None: times kept
    index: ChunkIndex | None = None  # its chunks (with `chunking`), cut in the blake3 pass
    labels: tuple[tuple[str, str], ...] = ()  # the image config's, all of them: the manifest's `vcs` is read there
    # how it was made: {"ancestor", "ancestor_digest", "dead_bytes"}, or {"full": why not incremental}
    incremental: dict | None = None
    # sha256 over the image's diff IDs (RootFS.Layers): which build of the key the bytes came from
    image_layers: str | None = None
    # while the ancestor's descriptor is open (never recorded): the range reused from an ancestor
    # only this user can change, for a later sha256; or that sha256, begun beside the copy (waits,
    # then checks the ancestor unchanged)
    splice: Splice | None = None
    sha256_later: Callable[[], str] | None = None


class ExportCancelled(EfabuildError):
    """The export was cancelled (Ctrl-C, SIGTERM): its processes were killed, nothing was kept."""

    exit_code = 130


@attrs.frozen
class ExportJob:
    """One export's fixed inputs, handed from the engine side to the squashing side."""

    image: str
    out: Path
    opts: tuple[str, ...]
    plan: RewritePlan
    expected: int | None
    started: float
    chunking: tuple[int, int, int] | None = None  # cut the file into chunks in its blake3 pass
    labels: tuple[tuple[str, str], ...] = ()  # the image config's


def export_image(
    image: str,
    out: Path,
    *,
    options: ExportSettings,
    engine: Engine | None = None,
    progress: Progress | None = None,
    epoch: int = 0,
    sha256: bool = True,
    cancel: threading.Event | None = None,
    chunking: tuple[int, int, int] | None = None,
) -> ExportResult:
    """Export `image` from the engine (default: the local one) to the `.sqsh` file `out`
    (atomically replaced).

    `sha256=False` leaves the sha256 pass out (make runs it beside the manifest's probe);
    `chunking` (min, avg, max chunk bytes) also gives the result its chunk index. `epoch` is
    the time given to the superblock, the root directory, the written files and the
    entries the container's creation adds; with `options.clamp_times`, no other file is newer
    than the image's `time_clamp`. Raises NotFound for an unknown image, ExportCancelled when
    `cancel` is set meanwhile (docker export and mksquashfs are killed at once), EfabuildError
    with the failing tool's last message otherwise; each leaves no file and no container behind.
    """
    engine = engine or connect(BuilderSettings())
    started = time.monotonic()
    out = Path(out).absolute()
    cfg, expected, clamp = export_facts(engine, image, options.clamp_times)
    job = ExportJob(image, out, mksquashfs_options(options, epoch=epoch),
               RewritePlan.for_config(cfg, epoch=epoch, clamp=clamp), expected, started, chunking, cfg.labels)
    try:
        # the label names the export, so a leftover (the process was killed) can be found
        container = containers.create_for_export(engine, image, out)
    except EfabuildError as exc:
        raise EfabuildError(f"export {image}: {exc}") from None
    try:
        step_boundary("export")
        return _squash(functools.partial(containers.export_stream, engine, container), "docker export",
                       job, progress, sha256, cancel)
    finally:
        containers.remove(engine, container)


def export_facts(engine: Engine, image: str, clamp_times: bool) -> tuple[ImageConfig, int | None, int | None]:
    """The image's config, its size, and its time clamp (None unless `clamp_times`)."""
    try:
        facts = image_facts(engine, image)
    except NotFound:
        raise NotFound(f"export {image}: no such image in the engine") from None
    except EfabuildError as exc:
        raise EfabuildError(f"export {image}: {exc}") from None
    clamp = None
    if clamp_times:
        try:
            clamp = time_clamp([facts.created, *history_times(engine, image)])
        except EngineTimeout:
            raise EfabuildError(f"export {image}: the engine did not list its history within "
                                f"{LIST_TIMEOUT_S:g} s") from None
        except EfabuildError as exc:
            raise EfabuildError(f"export {image}: {exc}") from None
    return ImageConfig.from_docker(facts.config), facts.size, clamp


def export_tar_stream(
    source: list[str],
    out: Path,
    *,
    what: str,
    config: ImageConfig,
    created: list[str],
    options: ExportSettings,
    progress: Progress | None = None,
    epoch: int = 0,
    sha256: bool = True,
    cancel: threading.Event | None = None,
    chunking: tuple[int, int, int] | None = None,
    env: dict[str, str] | None = None,
) -> ExportResult:
    """Export the root filesystem the command `source` writes as a tar on its stdout (a build's
    `--output type=tar,dest=-`) to `out`, as `export_image` exports that image: `config` and
    `created` (its creation times) are the image's, read from wherever it is (a registry), and the
    entries a container's creation adds are added by the filter. `what` names it in messages;
    `env`: variables added to the source's environment."""
    clamp = time_clamp(created) if options.clamp_times else None
    job = ExportJob(what, Path(out).absolute(), mksquashfs_options(options, epoch=epoch),
               RewritePlan.for_config(config, epoch=epoch, clamp=clamp, init_layer=True), None, time.monotonic(),
               chunking, config.labels)

    def start(stderr: IO[bytes]) -> subprocess.Popen:
        return children.popen(source, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL,
                              env={**os.environ, **env} if env else None)

    return _squash(start, source[0], job, progress, sha256, cancel)


def _squash(start_source: Callable[[IO[bytes]], subprocess.Popen], source_name: str, job: ExportJob,
            progress: Progress | None, with_sha256: bool, cancel: threading.Event | None) -> ExportResult:
    """Stream the tar that `start_source(stderr)` writes through the filter into mksquashfs."""
    try:
        job.out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EfabuildError(f"export {job.image}: cannot create {job.out.parent}: {exc.strerror}") from None
    # keeps out's name as its prefix: when out is a store temp name, gc can tell its owner
    tmp = job.out.parent / f"{job.out.name}.{uuid.uuid4().hex[:8]}.tmp"
    procs: list[subprocess.Popen] = []
    finished = threading.Event()
    with tempfile.TemporaryFile() as export_err, tempfile.TemporaryFile() as squash_log:
        try:
            exporter = start_source(export_err)
            procs.append(exporter)
            squasher = start_mksquashfs(tmp, job.opts, squash_log)
            procs.append(squasher)
            if cancel is not None:  # the filter blocks in read/splice: killing both ends frees it
                threading.Thread(target=_kill_on_cancel, args=(procs, cancel, finished),
                                 daemon=True).start()
            streamed, problem = _stream(exporter, squasher, job, progress)
            if cancel is not None and cancel.is_set():
                raise ExportCancelled(f"export {job.image}: interrupted; nothing was written")
            _check_exits(job.image, source_name, exporter, squasher, problem, export_err, squash_log)
            if progress:
                progress(streamed, job.expected)
            return keep_export(tmp, job, with_sha256)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            tmp.unlink(missing_ok=True)
            finished.set()


def _stream(exporter: subprocess.Popen, squasher: subprocess.Popen, job: ExportJob,
            progress: Progress | None) -> tuple[int, str | None]:
    """Run the tar filter from docker export into mksquashfs until both exit; returns the bytes
    streamed and what broke the stream, if anything (both sides are then stopped)."""
    assert exporter.stdout is not None and squasher.stdin is not None
    _grow_pipe(exporter.stdout.fileno())
    _grow_pipe(squasher.stdin.fileno())
    report = (lambda n: progress(n, job.expected)) if progress else None
    streamed, problem = 0, None
    try:
        streamed = rewrite_tar(exporter.stdout.fileno(), squasher.stdin.fileno(), job.plan, report)
    except BrokenPipeError:
        problem = "mksquashfs stopped reading"
    except TarFormatError as exc:
        problem = str(exc)
    if problem:  # stop the side that still runs; its exit status then means nothing
        for proc in (exporter, squasher):
            if proc.poll() is None:
                proc.kill()
    squasher.stdin.close()
    exporter.wait()
    squasher.wait()
    return streamed, problem


def _check_exits(image: str, source_name: str, exporter: subprocess.Popen, squasher: subprocess.Popen,
                 problem: str | None, export_err: IO[bytes], squash_log: IO[bytes]) -> None:
    """One line naming the tool that failed and its reason, else what broke the stream."""
    export_rc, squash_rc = exporter.returncode, squasher.returncode
    if export_rc > 0:
        raise EfabuildError(f"export {image}: {source_name} failed: {_tail(export_err) or export_rc}")
    if squash_rc > 0:
        raise EfabuildError(f"export {image}: mksquashfs failed: {_squash_error(squash_log) or squash_rc}")
    if problem or export_rc or squash_rc:
        raise EfabuildError(f"export {image}: {problem or 'interrupted'}")


class Unkept(EfabuildError):
    """A finished export that `keep_export` did not move to its name: `still_valid` said why."""


def keep_export(tmp: Path, job: ExportJob, with_sha256: bool, *, splice: Splice | None = None,
                seed: ChunkIndex | None = None, seed_checked: bool = False, tree: Tree | None = None,
                still_valid: Callable[[], str | None] | None = None,
                sha256_pass: Sha256Pass | None = None) -> ExportResult:
    """Make the finished temp file durable, hash it, and move it to its name. `splice`: a range
    copied from another file, hashed from there (from `tree`, that file's chaining values, where
    given; `seed`, its chunk index, lends its chunks, re-hashed unless `seed_checked`; the sha256
    `sha256_pass` is taking); `still_valid()`, asked after hashing, may refuse it (Unkept)."""
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    digest, sha256, index = _digests(tmp, with_sha256, job.chunking, splice, seed, tree, seed_checked, sha256_pass)
    problem = still_valid() if still_valid is not None else None
    if problem:
        raise Unkept(problem)
    size = tmp.stat().st_size
    try:
        os.replace(tmp, job.out)
    except OSError as exc:
        raise EfabuildError(f"export {job.image}: cannot write {job.out}: {exc.strerror}") from None
    fsync_dir(job.out.parent)
    return ExportResult(job.out, size, digest, job.opts, time.monotonic() - job.started, sha256,
                        time_clamp=job.plan.clamp, index=index, labels=job.labels, splice=splice)


def _digests(path: Path, with_sha256: bool, chunking: tuple[int, int, int] | None, splice: Splice | None = None,
             seed: ChunkIndex | None = None, tree: Tree | None = None, seed_checked: bool = False,
             sha256_pass: Sha256Pass | None = None) -> tuple[str, str | None, ChunkIndex | None]:
    """blake3, sha256 (or None; `sha256_pass`'s where one runs) and the chunk index (or None) of a
    fresh file, in one read of it (of its own bytes outside `splice`, with `tree`)."""
    if splice is None:
        if chunking is None:
            digest, sha256 = file_digests(path) if with_sha256 else (file_digest(path), None)
            return digest, sha256, None
        sha256_pass = Sha256Pass(path) if with_sha256 else None  # in a thread, over the same pages
        index = chunk_file(path, chunking=chunking)
        return index.digest, sha256_pass.result() if sha256_pass is not None else None, index
    if tree is not None and not tree.describes(splice.source):
        tree = None  # another file's values, or the source changed since: hashed from its pages
    if tree is None and chunking is None:  # one read for both, unless the sha256 is under way
        digest, sha256 = spliced_digests(path, splice, with_sha256 and sha256_pass is None)
        return digest, sha256_pass.result() if sha256_pass is not None else sha256, None
    if sha256_pass is None and with_sha256:
        sha256_pass = Sha256Pass(path, splice)
    digest = spliced_digest(path, splice.start, splice.end, tree) if tree is not None else None
    index = None
    if chunking is not None:
        index = chunk_spliced(path, splice, seed, chunking=chunking, digest=digest, seed_checked=seed_checked)
        digest = index.digest
    elif digest is None:
        digest = spliced_digests(path, splice, False)[0]
    return digest, sha256_pass.result() if sha256_pass is not None else None, index


def _kill_on_cancel(procs: list[subprocess.Popen], cancel: threading.Event, finished: threading.Event) -> None:
    while not finished.is_set():
        if cancel.wait(_CANCEL_POLL_S):
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
            return


def _tail(f: IO[bytes]) -> str:
    f.seek(0)
    return last_line(f.read().decode(errors="replace"))


def _squash_error(f: IO[bytes]) -> str:
    """mksquashfs' reason: its FATAL ERROR line, else its first `mksquashfs:` line (usage
    errors are followed by the whole help text), else its last line."""
    f.seek(0)
    lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    for line in reversed(lines):
        if "ERROR" in line:
            return line
    for line in lines:
        if line.startswith("mksquashfs:"):
            return line
    return lines[-1] if lines else ""


def _grow_pipe(fd: int) -> None:
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
    except (OSError, AttributeError, ImportError):
        pass  # a bigger pipe is only faster, never required
