"""lazy: a cold node starting a job from an artifact's chunks (`efabuild mount`) against fetching the
whole `.sqsh` first, on moto's S3 server over loopback, everything through squashfuse as Pyxis's
use_squashfuse=1 reads it.

The image: large libraries and many small Python files (an NGC-like spread), with a start set among
them: what a job start reads (the interpreter, NCCL, libfabric, the OFI plugin, the user's code and
some modules), about 3 % of the image, scattered over the file as mksquashfs orders it.

- cold start: `efabuild mount --background` + squashfuse + reading the start set, on a node whose
  store has S3 only (no shared tier, so no start list: the first start ever), against `efabuild
  lookup` fetching the whole file + squashfuse + the same reads. Also: the bytes the S3 server sent
  before the start set was read ÷ the artifact (the mount's prefetch runs meanwhile, as it does in
  a job);
- 8 nodes: eight mounts of one new artifact at once, each with its own node cache, one shared
  directory (FSx), each reading the whole file: bytes the S3 server sent ÷ one artifact;
- sequential read once local: every file read through squashfuse on the mounted file (its chunks
  in the node cache, nothing in the page cache) against squashfuse on the plain file;
- the mount process's peak RSS after serving the whole file.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

from benchmarks.chunked import _squash
from benchmarks.common import BenchError, Check, Context, Result, Timing, efabuild_command, human_bytes
from benchmarks.s3 import S3Server

KiB, MiB = 1024, 1024 * 1024
NODES = 8


def _tree(root: Path, full: bool) -> list[Path]:
    """The image's tree; returns its start set (paths inside it)."""
    rng = random.Random(11)
    big, big_bytes, small = (20, 64 * MiB, 20_000) if full else (4, 16 * MiB, 1_000)
    scale = 1 if full else 4  # the start set's share stays about the same

    def write(path: str, size: int) -> Path:
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as f:
            while size > 0:
                f.write(rng.randbytes(min(size, 8 * MiB)))
                size -= 8 * MiB
        return Path(path)

    for i in range(big):
        write(f"opt/lib{i:02d}/libbig{i}.so", big_bytes)
    for i in range(small):
        write(f"usr/lib/python3/pkg{i // 200}/mod{i}.py", rng.randint(512, 8 * KiB))
    start = [write("usr/bin/python3", 8 * MiB // scale), write("opt/nccl/lib/libnccl.so.2", 24 * MiB // scale),
             write("opt/amazon/efa/lib/libfabric.so.1", 2 * MiB // scale),
             write("opt/amazon/ofi-nccl/lib/libnccl-net.so", 1 * MiB // scale)]
    start += [write(f"workspace/app/train{i}.py", rng.randint(1 * KiB, 16 * KiB)) for i in range(40)]
    start += [Path(f"usr/lib/python3/pkg{i // 200}/mod{i}.py") for i in range(0, small, max(1, small // 300))]
    return start


def _workspace(where: Path, settings, shared: Path | None = None) -> Path:  # noqa: ANN001 - an S3Config
    """A node's workspace: BUILD.toml's [store] with a local tier, S3, and maybe a shared tier."""
    where.mkdir(parents=True)
    lines = ["[store]", 'local = "store"'] + ([f'shared = "{shared}"'] if shared else [])
    lines += ["[store.s3]", f'bucket = "{settings.bucket}"', f'prefix = "{settings.prefix}"',
              f'endpoint_url = "{settings.endpoint_url}"',
              'region = "us-east-1"']
    (where / "BUILD.toml").write_text("\n".join(lines) + "\n")
    return where


class CountingProxy:
    """A loopback TCP proxy in front of the S3 server that counts the bytes it sends to clients:
    what the nodes pulled from S3 (the server's own /proc io counters do not count socket writes)."""

    def __init__(self, port: int) -> None:
        self.target, self.sent = port, 0
        self._lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, counted: bool) -> None:
        try:
            while data := source.recv(1 << 20):
                sink.sendall(data)
                if counted:
                    with self._lock:
                        self.sent += len(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()


def _read(root: Path, paths: list[Path]) -> int:
    total = 0
    for path in paths:
        with open(root / path, "rb") as f:
            while chunk := f.read(4 * MiB):
                total += len(chunk)
    return total


def _squashfuse(image: Path, rootfs: Path) -> None:
    rootfs.mkdir(exist_ok=True)
    subprocess.run(["squashfuse", str(image), str(rootfs)], check=True, timeout=60)


def _unmount(*where: Path) -> None:
    for path in where:
        subprocess.run(["fusermount3", "-u", str(path)], capture_output=True, timeout=60)


def _mount(node: Path, key: str, where: Path, *extra: str) -> Path:
    where.mkdir()
    done = subprocess.run([*efabuild_command(), "mount", "--background", "--cache", str(node / "cache"), *extra,
                           key, str(where)], cwd=node, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise BenchError(f"efabuild mount: {done.stderr.strip()[-300:]}")
    return Path(done.stdout.strip())


def _daemon(where: Path) -> int:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"mount" in argv and str(where).encode() in argv and b"--background" not in argv:
            return int(pid)
    raise BenchError(f"no mount process for {where}")


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * KiB
    return 0


def _cold(ctx: Context, server: CountingProxy, settings, key: str, start: list[Path], n: int) -> dict:  # noqa: ANN001
    """One cold start each way, on new nodes: seconds, and bytes S3 sent before the start set was read."""
    work = ctx.work / "lazy" / f"cold{n}"
    lazy, whole = _workspace(work / "lazy", settings), _workspace(work / "whole", settings)
    subprocess.run(["sync"], check=True)
    before = server.sent
    started = time.perf_counter()
    served = _mount(lazy, key, lazy / "mnt")
    _squashfuse(served, lazy / "rootfs")
    _read(lazy / "rootfs", start)
    lazy_seconds, lazy_bytes = time.perf_counter() - started, server.sent - before
    _unmount(lazy / "rootfs", lazy / "mnt")
    subprocess.run(["sync"], check=True)
    started = time.perf_counter()
    done = subprocess.run([*efabuild_command(), "lookup", key], cwd=whole, capture_output=True, text=True,
                          timeout=900)
    if done.returncode != 0:
        raise BenchError(f"efabuild lookup: {done.stderr.strip()[-300:]}")
    _squashfuse(Path(done.stdout.strip()), whole / "rootfs")
    _read(whole / "rootfs", start)
    whole_seconds = time.perf_counter() - started
    _unmount(whole / "rootfs")
    shutil.rmtree(work, ignore_errors=True)
    return {"lazy": lazy_seconds, "lazy_bytes": lazy_bytes, "whole": whole_seconds}


def _nodes(ctx: Context, server: CountingProxy, settings, key: str, files: list[Path]) -> dict:  # noqa: ANN001
    """Eight nodes, one shared directory, each mounting the artifact and reading it whole at once;
    then the sequential read through one node's mount against the plain file, and its peak RSS."""
    work = ctx.work / "lazy" / "nodes"
    shared = work / "fsx"
    shared.mkdir(parents=True)
    nodes = [_workspace(work / f"node{i}", settings, shared) for i in range(NODES)]
    before = server.sent
    served = [_mount(node, key, node / "mnt", "--prefetch", "none") for node in nodes]
    readers = [subprocess.Popen(["cat", str(path)], stdout=subprocess.DEVNULL) for path in served]
    if any(reader.wait(timeout=1800) != 0 for reader in readers):
        raise BenchError("a node's read of the mounted file failed")
    s3_bytes = server.sent - before
    rss = _peak_rss(_daemon(nodes[0] / "mnt"))  # having served the whole file
    plain = nodes[0] / "plain.sqsh"
    shutil.copyfile(served[0], plain)
    _unmount(*[node / "mnt" for node in nodes])
    seconds: dict[str, list[float]] = {"mount": [], "plain": []}
    for n in range(ctx.repeats):
        # a new mount each time: nothing of the file in the page cache, its chunks in the node cache
        mounted = _mount(nodes[0], key, nodes[0] / f"again{n}", "--prefetch", "none")
        for label, image in (("mount", mounted), ("plain", plain)):
            _drop(plain, nodes[0] / "cache")
            _squashfuse(image, work / "rootfs")
            started = time.perf_counter()
            _read(work / "rootfs", files)
            seconds[label].append(time.perf_counter() - started)
            _unmount(work / "rootfs")
        _unmount(nodes[0] / f"again{n}")
    shutil.rmtree(work, ignore_errors=True)
    return {"s3_bytes": s3_bytes, "read": seconds, "rss": rss}


def _drop(*paths: Path) -> None:
    """Nothing of these files (or the files in these directories) in the page cache."""
    for path in paths:
        for file in ([path] if path.is_file() else [p for p in path.iterdir() if p.is_file()]):
            fd = os.open(file, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def scenario(ctx: Context) -> Result:
    import boto3

    from efabuild.host.digest import file_digest
    from efabuild.settings import S3Config
    from efabuild.store.record import ArtifactRecord
    from efabuild.store.tiered import Store
    from efabuild.store.tiers.fs import FilesystemTier

    if shutil.which("squashfuse") is None or not os.path.exists("/dev/fuse"):
        raise BenchError("needs squashfuse and /dev/fuse (scripts/setup-host.sh)")
    scratch = ctx.scratch("lazy")
    ctx.log("lazy: writing the image's tree")
    start = _tree(scratch / "tree", not ctx.quick)
    files = [p.relative_to(scratch / "tree") for p in sorted((scratch / "tree").rglob("*")) if p.is_file()]
    start_bytes = sum((scratch / "tree" / p).stat().st_size for p in start)
    sqsh = _squash(scratch / "tree", scratch / "image.sqsh")
    shutil.rmtree(scratch / "tree")
    size = sqsh.stat().st_size
    with S3Server() as server:
        client = boto3.session.Session().client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
        bucket = f"bench-{secrets.token_hex(4)}"
        client.create_bucket(Bucket=bucket)
        direct = S3Config(bucket=bucket, prefix="lazy/", endpoint_url=server.endpoint, region="us-east-1")
        proxy = CountingProxy(server.port)
        settings = S3Config(bucket=bucket, prefix="lazy/", endpoint_url=proxy.endpoint, region="us-east-1")
        key = secrets.token_hex(32)
        ctx.log(f"lazy: publishing the {human_bytes(size)} image to S3 in chunks")
        builder = Store([FilesystemTier(scratch / "builder", "local")], direct, show_progress=False)
        builder.publish(key, sqsh, ArtifactRecord.for_file(key, "bench:user", sqsh, file_digest(sqsh)))
        shutil.rmtree(scratch / "builder")
        cold = []
        for n in range(ctx.repeats):
            ctx.log(f"lazy: cold start {n + 1}/{ctx.repeats}, mounted and fetched whole")
            cold.append(_cold(ctx, proxy, settings, key, start, n))
        ctx.log(f"lazy: {NODES} nodes reading it at once through one shared directory")
        nodes = _nodes(ctx, proxy, settings, key, files)
        proxy.close()
    lazy = Timing("mount + squashfuse + start set", tuple(c["lazy"] for c in cold))
    whole = Timing("lookup (whole fetch) + squashfuse + start set", tuple(c["whole"] for c in cold))
    mounted = Timing("every file through squashfuse on the mounted file", tuple(nodes["read"]["mount"]))
    plain = Timing("every file through squashfuse on the plain file", tuple(nodes["read"]["plain"]))
    before_start = sorted(c["lazy_bytes"] for c in cold)[len(cold) // 2] / size * 100
    checks = (
        Check("cold start: S3 bytes before the start set is read ÷ artifact", before_start, 5.0, "lower", "%",
              human_bytes(before_start * size / 100), human_bytes(size), full_size_only=True),
        Check("cold start: mount + start set vs whole fetch + mount + start set", lazy.median / whole.median, 0.20,
              "lower", efabuild=f"{lazy.median:.2f} s", baseline=f"{whole.median:.2f} s", full_size_only=True),
        Check(f"{NODES} nodes, one shared tier: S3 bytes ÷ one artifact", nodes["s3_bytes"] / size, 1.10, "lower",
              efabuild=human_bytes(nodes["s3_bytes"]), baseline=human_bytes(size)),
        Check("sequential read once local: mounted vs plain file", plain.median / mounted.median, 0.80, "higher",
              efabuild=f"{mounted.median:.2f} s", baseline=f"{plain.median:.2f} s"),
        Check("mount process peak RSS (MiB)", nodes["rss"] / MiB, 200, "lower", "",
              efabuild=human_bytes(nodes["rss"]), full_size_only=True),
    )
    return Result("lazy", "a cold node starts a job from the artifact's chunks vs fetching the whole .sqsh",
                  checks, (lazy, whole, mounted, plain),
                  figures={"artifact_bytes": size, "start_set_bytes": start_bytes, "start_set_files": len(start),
                           "files": len(files), "nodes": NODES})
