"""The real Docker engine (dockerd + buildx), as started by scripts/setup-host.sh, and what tests
build on it: a tiny busybox base image, a loopback registry, a second engine on another socket.

Nothing here needs the internet: the base image is made with `docker import` from the host's
busybox-static binary.
"""

from __future__ import annotations

import hashlib
import io
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BUSYBOX = Path("/bin/busybox")


@pytest.fixture(scope="session")
def docker_engine() -> None:
    """Skip nothing silently: a missing engine fails the test that needs it, with the fix."""
    if shutil.which("docker") is None or subprocess.run(
        ["docker", "info"], capture_output=True
    ).returncode != 0:
        pytest.fail("no Docker engine reachable: run `bash scripts/setup-host.sh` (as root) first")


def busybox_rootfs_tar() -> bytes:
    """A root filesystem of busybox-static: /bin/busybox, a link per applet, /tmp, /etc, /root.

    Deterministic (fixed owners and times), so the imported image is the same every time.
    """
    if not BUSYBOX.is_file():
        pytest.fail("busybox-static missing: run `bash scripts/setup-host.sh` (as root) first")
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        def add_dir(name: str, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, 0
            tar.addfile(info)

        for directory in ("bin", "etc", "root", "usr", "usr/bin"):
            add_dir(directory)
        add_dir("tmp", 0o1777)
        data = BUSYBOX.read_bytes()
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode, info.mtime = len(data), 0o755, 0
        tar.addfile(info, io.BytesIO(data))
        for applet in sorted(set(applets.stdout.split()) - {"busybox"}):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname, link.mode, link.mtime = tarfile.SYMTYPE, "busybox", 0o777, 0
            tar.addfile(link)
    return buffer.getvalue()


def import_busybox(tag: str, host: str | None = None) -> str:
    """`docker import` the busybox root filesystem as `tag` (on `host`, else the default engine)."""
    command = ["docker"] + (["--host", host] if host else []) + [
        "import", "--change", "ENV PATH=/usr/bin:/bin", "-", tag,
    ]
    subprocess.run(command, input=busybox_rootfs_tar(), capture_output=True, check=True)
    return tag


@pytest.fixture(scope="session")
def busybox_image(docker_engine) -> str:
    """A tiny base image made from busybox-static, shared by the session (and kept: it is named
    by the busybox binary's hash, so the next session reuses it)."""
    digest = hashlib.sha256(BUSYBOX.read_bytes()).hexdigest()[:12]
    tag = f"efabuild-test/busybox:{digest}"
    if subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode != 0:
        import_busybox(tag)
    return tag


@pytest.fixture
def image_names(docker_engine):
    """Factory of unique `efabuild-test-XXXX/<name>:<key>` tags; every one is removed afterwards
    (on the main engine), so tests running side by side never see each other's images."""
    prefix = f"efabuild-test-{secrets.token_hex(4)}"
    made: list[str] = []

    def make(name: str = "layer", key: str | None = None) -> str:
        tag = f"{prefix}/{name}:{key or secrets.token_hex(8)}"
        made.append(tag)
        return tag

    make.prefix = prefix + "/"  # type: ignore[attr-defined]
    yield make
    for tag in made:
        subprocess.run(["docker", "image", "rm", "--force", tag], capture_output=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def local_registry(docker_engine, tmp_path_factory) -> str:
    """Debian's docker-registry on a free loopback port, with its own storage; `host:port`."""
    directory = tmp_path_factory.mktemp("registry")
    started = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts/start-registry.sh"), str(free_port()), str(directory)],
        capture_output=True, text=True,
    )
    if started.returncode != 0:
        pytest.fail(f"registry did not start: {started.stderr.strip()}")
    yield started.stdout.strip()
    pidfile = directory / "registry.pid"
    if pidfile.exists():
        stop_pid(int(pidfile.read_text()), "docker-registry")


@pytest.fixture(scope="session")
def second_engine(busybox_image) -> str:
    """A second dockerd on its own socket (a stand-in for a remote builder), with the busybox
    base imported into it; its DOCKER_HOST URL. Stopped at the end if this session started it."""
    run_dir = Path(os.environ.get("EFABUILD_ENGINE2_RUN", "/run/efabuild-engine2"))
    pidfile = run_dir / "docker.pid"
    was_running = pidfile.exists() and _alive(int(pidfile.read_text() or 0))
    started = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts/start-second-engine.sh")], capture_output=True, text=True,
    )
    if started.returncode != 0:
        pytest.fail(f"second engine did not start: {started.stderr.strip()}")
    host = started.stdout.strip()
    found = subprocess.run(["docker", "--host", host, "image", "inspect", busybox_image], capture_output=True)
    if found.returncode != 0:
        import_busybox(busybox_image, host=host)
    yield host
    if not was_running and pidfile.exists():
        stop_pid(int(pidfile.read_text()), "dockerd")


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
        # a zombie (no init reaping it) has already exited
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _runs(pid: int, program: str) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == program[:15]  # comm is cut at 15
    except OSError:
        return False


def stop_pid(pid: int, program: str, grace_s: float = 20.0) -> None:
    """SIGTERM a daemon this session started, and wait (bounded) until it is gone. Only when the pid
    is still that program: a daemon that died meanwhile leaves its pid to be reused, perhaps by
    another test run on this machine."""
    if not _alive(pid) or not _runs(pid, program):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def pinned_fixture_base(local_registry) -> str:
    """The offline fixture base (fixtures/builder.py) pushed to the loopback registry, as
    `REGISTRY/efabuild-fixtures/pytorch@sha256:…`: a FROM pinned by digest, so its keys hold even
    when another checkout rebuilds the shared fixture tag meanwhile."""
    from fixtures.builder import MINI_NGC_TAG, build_fixtures

    image = build_fixtures()[0].image_id  # by ID: the shared name may be retagged meanwhile
    name = f"{local_registry}/{MINI_NGC_TAG}"
    subprocess.run(["docker", "image", "tag", image, name], capture_output=True, check=True)
    pushed = subprocess.run(["docker", "image", "push", name], capture_output=True, text=True, check=True).stdout
    digest = next(word for line in pushed.splitlines() if "digest:" in line for word in line.split()
                  if word.startswith("sha256:"))
    # no registry name left behind in the engine: tests of the layer-cache registry count them
    subprocess.run(["docker", "image", "rm", "--no-prune", name], capture_output=True, check=True)
    return f"{name.rsplit(':', 1)[0]}@{digest}"
