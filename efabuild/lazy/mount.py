"""`efabuild mount REF DIR`: an artifact's `.sqsh` served from its chunks through FUSE.

What is trusted: the artifact's record and the chunk index it names (`ArtifactRecord.chunks`, the
index's identity, written by the publish that cut it; with a trust policy, the signed statement
must name it too). Every chunk is checked against its id before it is served, so a bound index
serves exactly the bytes a whole file checked against the record would. A record made before
records named their index leaves the index to agree with the record's size and digest, and binds
its ids to the digest only once the whole file has been read: the prefetch reads every chunk in
the background and then hashes them in order; a mismatch stops the mount (every read is then an
I/O error) and drops what was cached. `bound_only` (job starts) refuses such an index.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import blake3

from efabuild.errors import EfabuildError, NotFound
from efabuild.lazy.chunksource import ChunkSource
from efabuild.lazy import startahead
from efabuild.lazy.nodecache import NodeCache
from efabuild.settings import StoreConfig
from efabuild.signing.trust import TrustPolicy
from efabuild.signing.verify import VerificationFailed, refusal, signed_index_vet, signed_problems
from efabuild.storesettings import LOCAL_TIER
from efabuild.store.chunked import seeds
from efabuild.store.chunked.fschunks import FsChunks
from efabuild.chunks.cdc import ChunkIndex, is_chunk_id
from efabuild.store.tiered import Store

DEFAULT_CACHE_BYTES = 20 << 30


@attrs.frozen
class Artifact:
    key: str
    name: str
    size: int
    digest: str
    index: ChunkIndex


class Unbound(EfabuildError):
    """A chunk index its record does not name: served only with the whole-file check, never to a job."""


def index_problem(index: ChunkIndex, size: int, digest: str) -> str | None:
    """Why a chunk index does not describe the recorded artifact (None when it does)."""
    if (index.size, index.digest) != (size, digest):
        return f"it is for {index.size} bytes ({index.digest}), the record says {size} ({digest})"
    if sum(length for _, length in index.chunks) != size:
        return "its chunks do not add up to the artifact's size"
    if any(length <= 0 or not is_chunk_id(cid) for cid, length in index.chunks):
        return "it names a chunk that is not 64 hex of positive length"
    return None


def find(table: StoreConfig, ref: str, platform: str | None = None, *, bound_only: bool = False,
         policy: TrustPolicy | None = None) -> tuple[Store, Artifact]:
    """The artifact `ref` names and its chunk index: the one its record names where the record
    names one (kept beside a filesystem copy, else S3's), else the first found. `bound_only`
    refuses an index the record does not name (Unbound); `policy` asks for a statement signed by
    one of its keys that names the index too (VerificationFailed), and vets a name's platform index."""
    store = Store.from_config(table)
    key = store.resolve(ref, platform=platform, vet_index=None if policy is None else signed_index_vet(policy, ref))
    record = store.record(key)
    if record is None:
        raise NotFound(f"no record for artifact {key[:12]} ({ref})")
    index, where = _index_for(store, key, record.chunks)
    if index is None:
        raise NotFound(f"artifact {key[:12]} ({ref}) has no chunk index in {store.describe()}: it was stored "
                       f"whole; `efabuild lookup {ref}` gives its file")
    problem = index_problem(index, record.size, record.digest)
    if problem:
        raise EfabuildError(f"refusing the chunk index of {key[:12]} ({where}): {problem}")
    identity = index.identity()
    if record.chunks is not None and identity != record.chunks:
        raise EfabuildError(f"refusing the chunk index of {key[:12]} ({where}): its record names {record.chunks}, "
                            f"this one is {identity}")
    if bound_only and record.chunks is None:
        raise Unbound(f"the record of {key[:12]} ({ref}) names no chunk index (published before lazy mounts "
                      "could trust one): its chunks are checked only once the whole file is read")
    if policy is not None:
        problems = signed_problems(store.envelope(key), key, record, policy, record.digest, None,
                                   sqsh=f"{key}.sqsh", where=f"the signed statement of {key[:12]}",
                                   chunk_index=identity)
        if problems:
            raise refusal(VerificationFailed(problems), ref)
    return store, Artifact(key, record.name, record.size, record.digest, index)


def _index_for(store: Store, key: str, named: str | None) -> tuple[ChunkIndex | None, str]:
    """(the chunk index of `key` the record names, where it is): the first kept beside a
    filesystem tier's copy, else S3's; with no name, the first found."""
    def found() -> Iterator[tuple[ChunkIndex, str]]:  # S3's read only when no kept one is the record's
        for tier in store.fs_tiers:
            if (index := seeds.kept_index(tier, key)) is not None:
                yield index, f"{tier.name} tier"
        if store.s3_settings is not None and (index := store.s3.chunk_index(key)) is not None:
            yield index, store.s3.describe(key)

    first = None
    for index, where in found():
        if named in (None, index.identity()):
            return index, where
        first = first or (index, where)
    return first or (None, "")


@contextlib.contextmanager
def whole_copies(store: Store, artifact: Artifact) -> Iterator[list[int]]:
    """Descriptors of the filesystem tiers' copies of the artifact (of its recorded size, regular
    files, never through a link): chunks are read from them at their offsets, each checked."""
    fds = []
    try:
        for tier in store.fs_tiers:
            path = tier.layout.sqsh_path(artifact.key)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode) and info.st_size == artifact.size:
                fds.append(fd)
            else:
                os.close(fd)
        yield fds
    finally:
        for fd in fds:
            os.close(fd)


class WholeCheck:
    """Reads every chunk in file order (the node ends with a full local copy in its cache), then
    hashes them in order against the record's digest; on a mismatch, the source is stopped."""

    def __init__(self, source: ChunkSource, artifact: Artifact, log) -> None:  # noqa: ANN001
        self.source, self.artifact, self.log = source, artifact, log
        self.result: str | None = None  # "ok", or what was wrong
        self.done = threading.Event()

    def run(self) -> None:
        whole = blake3.blake3()
        try:
            for cid, offset, length in self.artifact.index.spans():
                whole.update(self.source.chunk(cid, length, offset))
        except EfabuildError as exc:  # unavailable, or the node cache failing: nothing is served from it
            self.result = f"not every chunk could be read: {exc}"
        else:
            if f"blake3:{whole.hexdigest()}" == self.artifact.digest:
                self.result = "ok"
            else:
                self.result = (f"its chunks make blake3:{whole.hexdigest()}, not the recorded {self.artifact.digest}: "
                               "the chunk index is not this artifact's; the mount stops serving it")
                self.source.stop(self.result)
        self.log(f"whole-file check of {self.artifact.key[:12]}: {self.result} "
                 f"({self.source.fetched_bytes} bytes fetched from S3)")
        self.done.set()


PREFETCH_ALL, PREFETCH_START, PREFETCH_NONE = "all", "start", "none"  # what a mount reads ahead


def serve(table: StoreConfig, ref: str, mountpoint: Path, *, cache_dir: Path, cache_bytes: int = DEFAULT_CACHE_BYTES,
          platform: str | None = None, prefetch: str = PREFETCH_ALL, bound_only: bool = False,
          policy: TrustPolicy | None = None, log=None) -> None:  # noqa: ANN001
    """Mount `ref` at `mountpoint` as `<key>.sqsh` and serve it until unmounted (blocks). Read
    ahead: the start list the shared tier keeps for it (`start`), then every chunk with the
    whole-file check (`all`), or nothing (`none`); with no start list there, what this start reads
    is left there as one."""
    import mfusepy  # the binding, at mount time only

    from efabuild.lazy.fusefile import SqshFile

    log = log or (lambda line: print(f"efabuild mount: {line}", file=sys.stderr, flush=True))
    store, artifact = find(table, ref, platform, bound_only=bound_only, policy=policy)
    cache = NodeCache(cache_dir, cache_bytes)
    fetch = None
    if store.s3_settings is not None:
        chunks = store.s3.chunks

        def fetch(cid: str, length: int) -> bytes:
            return chunks.fetch(cid, length)[0]

    shared = [FsChunks(tier, log) for tier in store.fs_tiers if tier.name != LOCAL_TIER]
    listed = startahead.read_list(shared[0] if shared else None, artifact.key, artifact.index, log)
    with whole_copies(store, artifact) as copies:
        source = ChunkSource(artifact.index, cache, copies, fetch, log=log, shared=shared)
        keeper = None
        if shared and not listed:
            keeper = startahead.ListKeeper(source, shared[0], artifact.key, artifact.index, log)
            threading.Thread(target=keeper.watch, name="start-list", daemon=True).start()
        if prefetch != PREFETCH_NONE:
            threading.Thread(target=_read_ahead, args=(source, artifact, listed, prefetch, log), name="prefetch",
                             daemon=True).start()
        try:
            # kernel_cache: the file is content-addressed, never changes: the page cache may keep it
            mfusepy.FUSE(SqshFile(f"{artifact.key}.sqsh", source), str(mountpoint), foreground=True, ro=True,
                         kernel_cache=True, nothreads=False, fsname=f"efabuild:{artifact.key[:12]}")
        finally:
            if keeper is not None:
                keeper.unmounted.set()
                keeper.keep()
            for chunks in shared:
                chunks.release_all()
            cache.close()


QUIET = 3.0  # seconds without a read of a new chunk: the start is over, the rest may be fetched


def _read_ahead(source: ChunkSource, artifact: Artifact, listed: list[str], prefetch: str, log) -> None:  # noqa: ANN001
    """The start list first; then, once the start's reads have gone quiet (the rest competes with
    them for S3 otherwise), every chunk and the whole-file check."""
    if listed:
        startahead.fetch_ahead(source, listed, artifact.key, log)
    if prefetch == PREFETCH_ALL:
        while not source.started.settled(QUIET):
            time.sleep(0.2)
        WholeCheck(source, artifact, log).run()


def start_in_background(argv: list[str], mountpoint: Path, log: Path, *, timeout: float = 60,
                        env: dict[str, str] | None = None) -> Path:
    """Run `efabuild mount` with `argv` (REF DIR and options) in a process of its own, in a
    session of its own, so it outlives the caller; its output goes to `log`. The served file's
    path once it is there; EfabuildError with the mount's last line when it stopped first, or when
    nothing was served within `timeout` seconds (it is then killed)."""
    try:  # never through a link planted at the log's name
        out_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise EfabuildError(f"{log}: {exc.strerror or exc}") from None
    with open(out_fd, "ab") as out:
        child = subprocess.Popen([sys.executable, "-m", "efabuild", "mount", *argv], stdin=subprocess.DEVNULL,
                                 stdout=out, stderr=out, start_new_session=True, env=env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.ismount(mountpoint):
            served = next(iter(os.listdir(mountpoint)), None)
            if served is not None:
                return mountpoint / served
        if child.poll() is not None:
            lines = log.read_text(errors="replace").strip().splitlines()
            raise EfabuildError(lines[-1].removeprefix("efabuild: ") if lines else "the mount stopped")
        time.sleep(0.05)
    child.kill()
    child.wait()
    raise EfabuildError(f"{mountpoint}: not mounted within {timeout:g} s (see {log})")
