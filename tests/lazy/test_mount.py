"""`efabuild mount`: an artifact's .sqsh served from its chunks through FUSE on a node that holds
no copy of it, read through squashfuse as Pyxis's use_squashfuse=1 reads it, and the ways it fails
without a wrong byte or a hang (real FUSE, real squashfuse, moto's S3 server)."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from efabuild.settings import S3Config
from efabuild.store.config import locate, store_config_text
from efabuild.store.tiered import Store
from efabuild.store.tiers.fs import FilesystemTier
from tests.kits.storekit import CHUNKED, REPO, key_for, make_sqsh, record_for

pytestmark = [pytest.mark.skipif(not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
                                 reason="no /dev/fuse or fusermount3 here"), pytest.mark.timeout(180)]


def _run(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "efabuild", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _unmount(path: Path) -> None:
    subprocess.run(["fusermount3", "-uz", str(path)], capture_output=True, timeout=30)


@pytest.fixture
def published(tmp_path: Path, settings: S3Config) -> tuple[Path, str, Path]:
    """(a compute node's store directory, which knows only S3; the artifact's key; its .sqsh)."""
    key = key_for(f"lazy {tmp_path}")
    sqsh = make_sqsh(tmp_path, os.urandom(3 << 20))
    builder = Store([FilesystemTier(tmp_path / "builder", "local")], settings, show_progress=False,
                    s3_options=CHUNKED)
    builder.publish(key, sqsh, record_for(key, "demo:user", sqsh))
    node = FilesystemTier(tmp_path / "node", "store")
    node.root.mkdir()
    node.write_config(store_config_text(settings))
    return tmp_path / "node", key, sqsh


@pytest.fixture
def mounts(tmp_path: Path):
    made: list[Path] = []
    yield made
    for path in made:
        _unmount(path)


def _mount(node: Path, ref: str, where: Path, cache: Path, mounts: list, *extra: str) -> Path:
    where.mkdir()
    mounts.append(where)
    done = _run("mount", "--background", "--store", str(node), "--cache", str(cache), *extra, ref, str(where))
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


@pytest.mark.s3
def test_a_node_without_a_copy_reads_the_artifact_through_the_mount_and_squashfuse(published, tmp_path, mounts):
    node, key, sqsh = published
    served = _mount(node, "demo:user", tmp_path / "mnt", tmp_path / "cache", mounts)
    assert served == tmp_path / "mnt" / f"{key}.sqsh"
    assert served.stat().st_size == sqsh.stat().st_size
    assert served.read_bytes() == sqsh.read_bytes()
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    mounts.append(rootfs)
    subprocess.run(["squashfuse", str(served), str(rootfs)], check=True, timeout=30)
    original = tmp_path / "artifact-rootfs" / "payload.bin"
    assert (rootfs / "payload.bin").read_bytes() == original.read_bytes()
    _unmount(rootfs)
    # the background prefetch leaves every chunk in the node cache, checked whole against the record
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any((tmp_path / "cache").glob("mount-*.log")):
        time.sleep(0.1)
    index = Store.from_config(locate(str(node))).s3.chunk_index(key)
    while time.monotonic() < deadline and not all((tmp_path / "cache" / cid).exists() for cid, _ in index.chunks):
        time.sleep(0.1)
    assert all((tmp_path / "cache" / cid).exists() for cid, _ in index.chunks)
    assert _run("mount", "--unmount", str(tmp_path / "mnt")).returncode == 0
    assert not os.path.ismount(tmp_path / "mnt")


@pytest.mark.s3
def test_a_chunk_s3_serves_wrong_is_an_io_error_never_wrong_bytes(published, tmp_path, mounts, s3_client, settings):
    node, key, sqsh = published
    from efabuild.store.chunked.s3 import compress

    s3 = Store.from_config(locate(str(node))).s3
    victim, length = s3.chunk_index(key).chunks[1]  # one of this artifact's chunks (the bucket is shared)
    s3_client.put_object(Bucket=settings.bucket, Key=s3.chunks.object(victim), Body=compress(os.urandom(length)))
    served = _mount(node, key, tmp_path / "mnt", tmp_path / "cache", mounts, "--no-prefetch")
    data = sqsh.read_bytes()
    start = next(offset for cid, offset, _ in s3.chunk_index(key).spans() if cid == victim)
    page = 4096  # the kernel reads whole pages: a page that holds any of the chunk cannot be served
    failed, fd = [], os.open(served, os.O_RDONLY)
    try:
        for offset in range(0, len(data), page):
            try:
                piece = os.pread(fd, page, offset)
            except OSError as exc:
                assert exc.errno == errno.EIO
                failed.append(offset)
            else:
                assert piece == data[offset:offset + len(piece)]  # never a wrong byte
    finally:
        os.close(fd)
    assert failed == list(range(start // page * page, start + length, page))


@pytest.mark.s3
def test_a_killed_mount_fails_reads_at_once_and_a_new_mount_works(published, tmp_path, mounts):
    node, key, sqsh = published
    served = _mount(node, key, tmp_path / "mnt", tmp_path / "cache", mounts, "--no-prefetch")
    daemon = next(int(p) for p in os.listdir("/proc") if p.isdigit() and _is_mount_of(p, tmp_path / "mnt"))
    os.kill(daemon, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(OSError) as exc:
        served.read_bytes()
    # the kernel ends the connection: ENOTCONN, or ECONNABORTED while the file was open
    assert exc.value.errno in (errno.ENOTCONN, errno.ECONNABORTED) and time.monotonic() - started < 10
    _unmount(tmp_path / "mnt")
    (tmp_path / "mnt").rmdir()
    again = _mount(node, key, tmp_path / "mnt", tmp_path / "cache", mounts, "--no-prefetch")
    assert again.read_bytes() == sqsh.read_bytes()


def _is_mount_of(pid: str, where: Path) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"mount" in cmdline and str(where).encode() in cmdline and b"--background" not in cmdline


def test_a_cache_directory_of_another_user_or_a_link_is_refused(tmp_path):
    from efabuild.errors import EfabuildError
    from efabuild.lazy.nodecache import NodeCache

    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(theirs, 4321, 4321)
        with pytest.raises(EfabuildError, match="must be this user's directory"):
            NodeCache(theirs, 1 << 20)
    (tmp_path / "link").symlink_to(tmp_path / "mine")
    (tmp_path / "mine").mkdir(mode=0o700)
    with pytest.raises(EfabuildError, match="cannot use it as the chunk cache"):
        NodeCache(tmp_path / "link", 1 << 20)


def test_the_node_cache_drops_a_damaged_chunk_and_evicts_the_oldest(tmp_path):
    import blake3

    from efabuild.lazy.nodecache import NodeCache

    cache = NodeCache(tmp_path / "c", 3000)
    chunks = [os.urandom(1000) for _ in range(4)]
    ids = [blake3.blake3(c).hexdigest() for c in chunks]
    for cid, data in zip(ids[:3], chunks[:3]):
        cache.put(cid, data)
        time.sleep(0.01)
    (tmp_path / "c" / ids[1]).chmod(0o600)
    (tmp_path / "c" / ids[1]).write_bytes(b"x" * 1000)
    assert cache.get(ids[1], 1000) is None and not (tmp_path / "c" / ids[1]).exists()
    cache.put(ids[3], chunks[3])
    cache.put(ids[1], chunks[1])  # over the limit: the least recently used goes
    assert cache.get(ids[0], 1000) is None and cache.get(ids[3], 1000) == chunks[3]
    assert cache.used <= 3000


def test_an_index_that_does_not_describe_the_record_is_refused():
    from efabuild.lazy.mount import index_problem
    from efabuild.chunks.cdc import ChunkIndex

    digest = "blake3:" + "ab" * 32
    good = ChunkIndex(300, digest, (("cd" * 32, 100), ("ef" * 32, 200)))
    assert index_problem(good, 300, digest) is None
    assert "the record says 300" in index_problem(good._replace(size=301), 300, digest)
    assert "the record says" in index_problem(good, 300, "blake3:" + "00" * 32)
    assert "do not add up" in index_problem(good._replace(chunks=(("cd" * 32, 100),)), 300, digest)
    assert "not 64 hex" in index_problem(good._replace(chunks=(("../x", 100), ("ef" * 32, 200))), 300, digest)


def test_a_forged_index_whose_chunks_are_other_bytes_stops_the_mount_once_read_whole(tmp_path):
    """Its fields copied from the record, its ids true of a co-tenant's bytes: each chunk passes
    its id, so only the whole-file check can tell. It does, and every read after it fails."""
    import blake3

    from efabuild.lazy.chunksource import ChunkSource, ChunkUnavailable
    from efabuild.lazy.mount import Artifact, WholeCheck
    from efabuild.lazy.nodecache import NodeCache
    from efabuild.chunks.cdc import ChunkIndex

    real, theirs = os.urandom(5000), os.urandom(5000)
    record_digest = "blake3:" + blake3.blake3(real).hexdigest()
    pieces = [theirs[:3000], theirs[3000:]]
    forged = ChunkIndex(5000, record_digest, tuple((blake3.blake3(p).hexdigest(), len(p)) for p in pieces))
    served = dict(zip((cid for cid, _ in forged.chunks), pieces))
    said: list[str] = []
    cache = NodeCache(tmp_path / "cache", 1 << 20)
    source = ChunkSource(forged, cache, [], lambda cid, length: served[cid], log=said.append)
    assert source.read(0, 10) == theirs[:10]  # before the check: what the index names
    check = WholeCheck(source, Artifact("ab" * 32, "demo:user", 5000, record_digest, forged), said.append)
    check.run()
    assert check.result.startswith("its chunks make blake3:") and source.stopped
    with pytest.raises(ChunkUnavailable):
        source.read(0, 10)
    assert list((tmp_path / "cache").iterdir()) == []  # nothing of it is kept for the next mount


@pytest.mark.s3
def test_what_the_first_start_read_is_read_ahead_by_the_next_node(published, tmp_path, mounts):
    """The node store here is a shared tier (a store given by path): the first mount leaves the
    chunks its start read, in order, as the artifact's start list; the next node's mount fetches
    exactly those ahead, before anything reads them."""
    from efabuild.chunks import startlist
    from efabuild.chunks.cdc import is_chunk_id

    node, key, sqsh = published
    index = Store.from_config(locate(str(node))).s3.chunk_index(key)
    spans = list(index.spans())
    picks = [spans[40], spans[2], spans[70]]
    served = _mount(node, key, tmp_path / "a", tmp_path / "cache-a", mounts, "--no-prefetch")
    fd = os.open(served, os.O_RDONLY)
    try:
        for _, offset, length in picks:
            os.pread(fd, 1, offset + length // 2)
    finally:
        os.close(fd)
    assert _run("mount", "--unmount", str(tmp_path / "a")).returncode == 0
    kept = node / "chunks" / key[:2] / f"{key}.start"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not kept.exists():
        time.sleep(0.1)
    ids = startlist.decode(kept.read_bytes(), key, index)
    order = [ids.index(cid) for cid, _, _ in picks]  # the kernel's readahead may add neighbours
    assert order[0] == 0 and order == sorted(order)
    _mount(node, key, tmp_path / "b", tmp_path / "cache-b", mounts, "--prefetch", "start")

    def cached() -> set[str]:
        return {p.name for p in (tmp_path / "cache-b").iterdir() if is_chunk_id(p.name)}

    while time.monotonic() < deadline + 30 and cached() != set(ids):
        time.sleep(0.1)
    assert cached() == set(ids)  # the start list, and nothing else, without a read


def test_a_killed_mounts_half_written_chunks_are_swept_when_the_cache_opens(tmp_path):
    from efabuild.lazy.nodecache import NodeCache

    cache = tmp_path / "c"
    cache.mkdir(mode=0o700)
    dead = subprocess.Popen(["true"])
    dead.wait()
    cid = "ab" * 32
    killed = cache / f".{cid}.{dead.pid}.1.tmp"
    live = cache / f".{cid}.{os.getpid()}.2.tmp"  # this process's own write, under way
    old = cache / f".{cid}.{os.getpid()}.3.tmp"
    for path in (killed, live, old):
        path.write_bytes(b"half")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    NodeCache(cache, 1 << 20).close()
    assert sorted(p.name for p in cache.iterdir()) == [live.name]
