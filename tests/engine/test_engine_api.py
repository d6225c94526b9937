"""The Engine API reader on the local socket answers what the docker CLI answers, within its time
limit, and is used only for a local unix:// engine."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time

import pytest

from efabuild.engine.api import ApiError, EngineApi, local_socket
from efabuild.engine.client import EngineUnavailable, connect
from efabuild.engine.images import base_identity, existing_tags, image_id
from efabuild.settings import BuilderSettings


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def local_engine(docker_engine, monkeypatch):
    for name in ("DOCKER_HOST", "DOCKER_CONTEXT"):
        monkeypatch.delenv(name, raising=False)
    engine = connect(BuilderSettings())
    assert engine.api is not None, "the test machine's engine is the local socket"
    return engine


def inspected_by_cli(ref: str) -> dict:
    return json.loads(docker("image", "inspect", ref))[0]


def test_tags_ids_and_repo_digests_read_the_same_through_the_socket_as_through_the_cli(
        local_engine, busybox_image, image_names, local_registry):
    named = [image_names("efa"), image_names("user")]
    for tag in named:
        docker("tag", busybox_image, tag)
    cli_tags = {line for line in docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}}").splitlines()
                if line.startswith(image_names.prefix)}
    assert existing_tags(local_engine, image_names.prefix) == cli_tags == set(named)

    # pushed to a registry: the engine now knows its repository digest, as for a pulled base
    pushed = f"{local_registry}/{named[0].split(':')[0]}:pushed"
    docker("tag", busybox_image, pushed)
    try:
        docker("push", "--quiet", pushed)
        cli = inspected_by_cli(pushed)
        api = local_engine.api.inspect(pushed)
        assert (api["Id"], sorted(api["RepoTags"]), sorted(api["RepoDigests"])) == (
            cli["Id"], sorted(cli["RepoTags"]), sorted(cli["RepoDigests"]))
        assert cli["RepoDigests"], "a pushed image has a repository digest"
        digest = next(d.split("@")[1] for d in cli["RepoDigests"] if d.startswith(pushed.rsplit(":", 1)[0]))
        assert base_identity(local_engine, pushed) == (digest, "registry")
    finally:
        subprocess.run(["docker", "image", "rm", pushed], capture_output=True)


def test_a_base_reads_the_same_id_through_the_socket(local_engine, busybox_image):
    cli_id = inspected_by_cli(busybox_image)["Id"]
    assert image_id(local_engine, busybox_image) == cli_id
    # imported here, never pulled: no repository digest, so the image ID names its content
    assert base_identity(local_engine, busybox_image) == (cli_id, "image-id")
    assert image_id(local_engine, "efabuild-test/no-such-image:nope") is None
    assert local_engine.api.inspect("efabuild-test/no-such-image:nope") is None
    assert local_engine.api.server_version() == docker("version", "--format", "{{.Server.Version}}").strip()


def test_an_images_config_size_and_time_clamp_read_the_same_through_the_socket(local_engine, busybox_image,
                                                                               image_names, tmp_path):
    """What an export takes from an image (the config Enroot writes, the size, the creation time it
    clamps file times to) is the same through the socket as through the CLI, whatever the config
    holds: a working directory with a trailing slash, volumes, an entrypoint, labels, no Cmd."""
    from efabuild.engine.images import image_facts
    from efabuild.export.tarfilter import time_clamp

    through_cli = connect(BuilderSettings())
    through_cli.__dict__["api"] = None  # the cached property, as for an engine reached over ssh

    tag = image_names("facts")
    dockerfile = (f"FROM {busybox_image}\nLABEL a=b c=\"d e\"\nENV X=1 Y=two\nWORKDIR /workspace/app/\n"
                  "VOLUME /data /scratch\nENTRYPOINT [\"/bin/sh\", \"-c\"]\nCMD []\n")
    subprocess.run(["docker", "build", "-q", "-t", tag, "-f", "-", str(tmp_path)], input=dockerfile.encode(),
                   capture_output=True, check=True)
    try:
        for ref in (busybox_image, tag):
            api, cli = image_facts(local_engine, ref), image_facts(through_cli, ref)
            assert (api.config, api.size) == (cli.config, cli.size)
            assert time_clamp([api.created]) == time_clamp([cli.created]) is not None
        assert image_facts(local_engine, tag).config["WorkingDir"] == "/workspace/app"
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)


def test_export_containers_and_their_labels_read_the_same_through_the_socket(local_engine, busybox_image):
    import secrets

    from efabuild.engine.containers import EXPORT_LABEL, OWNER_LABEL
    from efabuild.engine.leftovers import _labelled

    name = f"efabuild-test-api-{secrets.token_hex(4)}"
    target = f"/tmp/{name}/objects/ab/{'ab' * 32}.sqsh"
    docker("create", "--name", name, "--label", f"{EXPORT_LABEL}={target}",
           "--label", f"{OWNER_LABEL}=some-host:1:2", busybox_image, "true")
    try:
        through_api = [row for row in _labelled(local_engine) if row[0] == name]
        cli = docker("container", "ls", "--all", "--filter", f"label={EXPORT_LABEL}", "--filter", f"name={name}",
                     "--format", f'{{{{.Names}}}}\t{{{{.Label "{OWNER_LABEL}"}}}}\t{{{{.Label "{EXPORT_LABEL}"}}}}')
        assert through_api == [tuple(cli.strip().split("\t"))] == [(name, "some-host:1:2", target)]
    finally:
        subprocess.run(["docker", "rm", "--force", name], capture_output=True)


def test_only_a_local_unix_engine_is_read_through_its_socket(monkeypatch, tmp_path):
    for name in ("DOCKER_HOST", "DOCKER_CONTEXT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    assert local_socket(None, None) == "/var/run/docker.sock"
    assert local_socket("unix:///run/other.sock", None) == "/run/other.sock"
    assert local_socket("ssh://builder@gpu-host", None) is None
    assert local_socket("tcp://10.0.0.5:2376", None) is None
    assert local_socket(None, "remote-builder") is None
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.5:2376")
    assert local_socket(None, None) is None
    monkeypatch.delenv("DOCKER_HOST")
    (tmp_path / "config.json").write_text('{"currentContext": "gpu-host"}')
    assert local_socket(None, None) is None
    assert connect(BuilderSettings(host="ssh://builder@gpu-host")).api is None


def test_a_socket_that_never_answers_is_given_up_on_within_the_time_limit(tmp_path):
    path = str(tmp_path / "silent.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(server.accept()[0]), daemon=True).start()
    started = time.monotonic()
    with pytest.raises(ApiError) as caught:
        EngineApi(path, timeout=0.5).server_version()
    assert caught.value.kind == "timeout"
    assert time.monotonic() - started < 5
    server.close()
    for conn in accepted:
        conn.close()


def test_no_engine_on_the_socket_is_one_line_naming_where(tmp_path):
    dead = f"unix://{tmp_path}/dead.sock"
    with pytest.raises(EngineUnavailable) as caught:
        connect(BuilderSettings(host=dead)).check(need_buildx=False)
    assert str(caught.value).startswith(f"no Docker engine at {dead} ([builder] host or --builder): ")
    with pytest.raises(ApiError) as absent:
        EngineApi(f"{tmp_path}/dead.sock", timeout=1).repo_tags()
    assert absent.value.kind == "absent"


def serve_once(path: str, send) -> None:  # noqa: ANN001
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def answer() -> None:
        conn = server.accept()[0]
        conn.recv(4096)
        try:
            send(conn)
        except OSError:
            pass  # the reader gave up: what is being tested
        conn.close()
        server.close()

    threading.Thread(target=answer, daemon=True).start()


def test_a_reply_that_is_not_the_engines_is_an_error_not_a_traceback(tmp_path):
    path = str(tmp_path / "other.sock")
    serve_once(path, lambda conn: conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nnot json!"))
    with pytest.raises(ApiError) as caught:
        EngineApi(path, timeout=5).repo_tags()
    assert caught.value.kind == "reply"


def test_a_plan_and_a_no_op_make_start_no_docker_process_and_a_make_asks_for_buildx_only_to_build(
        docker_engine, busybox_image, tmp_path, monkeypatch):
    """Every docker process is logged by a wrapper first on PATH; one without buildx fails as a
    machine without the plugin does."""
    import os
    import shutil
    import sys

    from tests.kits.storekit import REPO
    from tests.kits.wsfactory import make_workspace

    for name in ("DOCKER_HOST", "DOCKER_CONTEXT"):
        monkeypatch.delenv(name, raising=False)
    bin_dir, calls = tmp_path / "bin", tmp_path / "docker-calls"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\n'
        "[ \"$1\" = buildx ] && { echo \"docker: 'buildx' is not a docker command.\" >&2; exit 1; }\n"
        f'exec {shutil.which("docker")} "$@"\n')
    (bin_dir / "docker").chmod(0o755)
    graph = f'[layers.only]\nbase = "{busybox_image}"\ndockerfile = "RUN true\\n"\n'
    ws = make_workspace(tmp_path / "ws", {"g": graph}, build='[store]\nlocal = "cache"\n')
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}

    def efabuild(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "efabuild", *args], cwd=ws, env=env,
                              capture_output=True, text=True, timeout=120)

    planned = efabuild("plan", "--json")
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["engine"] == "reachable"
    assert not calls.exists(), calls.read_text()
    # nor does it load the code for starting one, nor socket.py: the socket is read through _socket;
    # nor attrs (15 ms to import, and 0.4 ms to build each class: the start-up's classes are tuples)
    probe = ("import sys\nfrom efabuild.cli import main\nstatus = main(['plan'])\n"
             "print(status, *(m for m in ('subprocess', 'ctypes', 'socket', 'attrs') if m in sys.modules),"
             " file=sys.stderr)")
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ws, env=env, capture_output=True, text=True, timeout=120)
    assert loaded.stderr.strip().splitlines()[-1] == "0", loaded.stderr
    made = efabuild("make", "--no-lint")
    assert made.returncode == 1
    assert made.stderr.strip().splitlines()[-1].endswith(
        "the docker buildx plugin is missing: install it with `bash scripts/setup-host.sh`")
    assert calls.read_text().splitlines() == ["buildx version"]

    # the layer's image present under its key, as a make leaves it: the next make has nothing to do
    key = json.loads(planned.stdout)["layers"][0]["key"]
    docker("tag", busybox_image, f"efabuild/only:{key}")
    try:
        # nor attrs, nor subprocess and ctypes (host.children) or a thread pool: it starts nothing
        probe = ("import sys\nfrom efabuild.cli import main\nstatus = main(['make'])\n"
                 "print(status, *(m for m in ('python_on_whales', 'attrs', 'subprocess', 'ctypes',"
                 " 'concurrent.futures') if m in sys.modules), file=sys.stderr)")
        noop = subprocess.run([sys.executable, "-c", probe], cwd=ws, env=env, capture_output=True, text=True,
                              timeout=120)
        assert noop.stderr.strip().splitlines()[-1] == "0", noop.stderr
        assert "1 reused" in noop.stdout
        assert calls.read_text().splitlines() == ["buildx version"], "a no-op make started a docker process"
    finally:
        subprocess.run(["docker", "image", "rm", f"efabuild/only:{key}"], capture_output=True)


def test_a_chunked_reply_is_read_whole(tmp_path):
    path = str(tmp_path / "chunked.sock")
    body = b'[{"RepoTags": ["efabuild/user:' + b"a" * 64 + b'"]}]'
    serve_once(path, lambda conn: conn.sendall(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n" % 10 + body[:10] + b"\r\n" + b"%x\r\n" % (len(body) - 10) + body[10:] + b"\r\n0\r\n\r\n"))
    assert EngineApi(path, timeout=5).repo_tags() == ["efabuild/user:" + "a" * 64]


def test_a_reply_that_trickles_in_is_given_up_on_at_the_time_limit(tmp_path):
    path = str(tmp_path / "slow.sock")

    def trickle(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
        for _ in range(50):
            conn.sendall(b" ")
            time.sleep(0.1)

    serve_once(path, trickle)
    started = time.monotonic()
    with pytest.raises(ApiError) as caught:
        EngineApi(path, timeout=0.5).repo_tags()
    assert caught.value.kind == "timeout" and time.monotonic() - started < 2
