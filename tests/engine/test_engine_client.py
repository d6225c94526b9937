"""Connecting to the engine, saying clearly where it looked when none answers, and reading images."""

from __future__ import annotations

import subprocess

import pytest

from efabuild.engine.client import EngineUnavailable, connect
from efabuild.engine.images import (
    base_identity,
    existing_tags,
    image_config,
    image_exists,
    image_id,
)
from efabuild.errors import InputError, NotFound
from efabuild.settings import BuilderSettings


def test_no_engine_behind_docker_host_says_where_it_looked_and_how_to_start_one(tmp_path, monkeypatch):
    dead = f"unix://{tmp_path}/dead.sock"
    monkeypatch.setenv("DOCKER_HOST", dead)
    with pytest.raises(EngineUnavailable) as caught:
        connect(BuilderSettings()).check()
    assert str(caught.value) == (
        f"no Docker engine at {dead} (DOCKER_HOST): start one with `bash scripts/setup-host.sh` "
        "or set [builder] host/context in BUILD.toml"
    )


def test_no_engine_at_the_configured_host_names_the_setting(tmp_path, monkeypatch):
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    dead = f"unix://{tmp_path}/other.sock"
    with pytest.raises(EngineUnavailable) as caught:
        connect(BuilderSettings(host=dead)).check()
    message = str(caught.value)
    assert message.startswith(f"no Docker engine at {dead} ([builder] host or --builder): ")
    assert "\n" not in message


def test_default_place_is_the_docker_socket_when_nothing_is_set(monkeypatch):
    for name in ("DOCKER_HOST", "DOCKER_CONTEXT"):
        monkeypatch.delenv(name, raising=False)
    assert connect(BuilderSettings()).where() == "unix:///var/run/docker.sock (DOCKER_HOST unset)"


def test_unknown_context_and_unknown_buildx_builder_are_named(docker_engine):
    with pytest.raises(EngineUnavailable, match=r"no docker context named 'efabuild-no-such-context'"):
        connect(BuilderSettings(context="efabuild-no-such-context")).check()
    with pytest.raises(EngineUnavailable, match=r"no buildx builder named 'efabuild-no-such-builder'"):
        connect(BuilderSettings(buildx_builder="efabuild-no-such-builder")).check()


def test_a_registered_but_dead_builder_is_one_line_naming_it_and_how_to_start_it(docker_engine, tmp_path):
    """`buildx inspect` exits 0 for it (`Status: inactive`); builds would fail 20 s later."""
    import socket
    import sys

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    name = f"efabuild-test-dead-{port}"
    subprocess.run(["docker", "buildx", "create", "--name", name, "--driver", "remote", f"tcp://127.0.0.1:{port}"],
                   capture_output=True, check=True)
    try:
        with pytest.raises(EngineUnavailable) as caught:
            connect(BuilderSettings(buildx_builder=name)).check()
        message = str(caught.value)
        assert "\n" not in message
        assert message.startswith(f"buildx builder '{name}' (remote) is not running ")
        assert f"tcp://127.0.0.1:{port}: inactive" in message and "start the BuildKit daemon" in message
        # the command line says the same in one line, before planning anything
        (tmp_path / "BUILD.toml").write_text('[workspace]\ngraphs = ["graphs/*.toml"]\n')
        (tmp_path / "graphs").mkdir()
        (tmp_path / "graphs" / "g.toml").write_text('[layers.a]\nbase = "busybox"\ndockerfile = "RUN true"\n')
        made = subprocess.run([sys.executable, "-m", "efabuild", "-C", str(tmp_path), "make", "--no-lint",
                               "--builder", f"buildx:{name}"], capture_output=True, text=True)
        assert made.returncode == 1 and made.stderr.strip() == f"efabuild: {message}"
    finally:
        subprocess.run(["docker", "buildx", "rm", name], capture_output=True)


def _started_farm(*entries: str) -> tuple[object, list[str]]:
    """Farm.start over `entries`: (the farm, or the EngineUnavailable it raised; its warnings)."""
    from efabuild.make.farm import Farm
    from efabuild.settings import RegistrySettings

    said: list[str] = []
    try:
        started = Farm.start(BuilderSettings(farm=entries), None, RegistrySettings(url="127.0.0.1:5000"), said.append)
    except EngineUnavailable as exc:
        started = exc
    return started, said


def test_a_dead_farm_entry_is_named_by_its_entry_in_the_farm_list(tmp_path, monkeypatch):
    """Not by [builder] host/context, which the user did not set and need not fix."""
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    dead, context = f"unix://{tmp_path}/dead.sock", "efabuild-no-such-context"
    started, said = _started_farm(dead, context)
    assert str(started) == f"no builder of [builder] farm answers ({dead}, {context}): start them or fix the list"
    assert said == [
        f"builder {dead} skipped: no Docker engine at {dead} ([builder] farm): start it, or fix or remove its "
        "entry in [builder] farm in BUILD.toml",
        f"builder {context} skipped: no docker context named {context!r}: create it with `docker context create "
        f"{context} --docker host=...` or fix its entry {context!r} in [builder] farm in BUILD.toml",
    ]


def test_a_dead_buildx_builder_of_a_farm_is_skipped_naming_its_farm_entry(docker_engine):
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    name = f"efabuild-test-dead-{port}"
    subprocess.run(["docker", "buildx", "create", "--name", name, "--driver", "remote", f"tcp://127.0.0.1:{port}"],
                   capture_output=True, check=True)
    try:
        started, said = _started_farm(f"buildx:{name}", "unix:///var/run/docker.sock", "buildx:efabuild-no-such")
        assert [node.farm_entry for node in started.nodes] == ["unix:///var/run/docker.sock"]
        assert len(said) == 2 and all("[builder] buildx_builder" not in line for line in said), said
        assert said[0].startswith(f"builder buildx:{name} skipped: buildx builder '{name}' (remote) is not running")
        assert said[0].endswith(f"start the BuildKit daemon it points at, or fix or remove its entry "
                                f"'buildx:{name}' in [builder] farm")
        assert said[1].endswith("or fix its entry 'buildx:efabuild-no-such' in [builder] farm in BUILD.toml"), said
    finally:
        subprocess.run(["docker", "buildx", "rm", name], capture_output=True)


def test_builder_nodes_reads_buildx_inspect():
    from efabuild.engine.client import builder_nodes

    text = ("Name:          farm\nDriver:        remote\nLast Activity: 2026-11-30 16:07:27 +0000 UTC\n\n"
            "Nodes:\nName:     farm0\nEndpoint: tcp://10.0.0.1:1234\nStatus:   inactive\n\n"
            "Name:     farm1\nEndpoint: tcp://10.0.0.2:1234\nStatus:   running\nBuildKit version: v0.17.0\n")
    assert builder_nodes(text) == ("remote", [("farm0", "tcp://10.0.0.1:1234", "inactive"),
                                              ("farm1", "tcp://10.0.0.2:1234", "running")])


def test_host_and_context_together_is_bad_input():
    with pytest.raises(InputError, match=r"^BUILD.toml \[builder\]: set either host or context"):
        connect(BuilderSettings(host="unix:///x.sock", context="other"))


def test_versions_report_the_running_engine(docker_engine):
    engine = connect(BuilderSettings())
    engine.check()
    versions = engine.versions()
    server = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert versions["engine"] == server
    assert versions["buildx"] and versions["buildx"][0].isdigit()
    assert versions["builder_driver"] == "docker"
    assert {"client", "engine_api", "buildkit", "builder"} <= versions.keys()


def test_existing_tags_lists_only_the_prefix_in_one_call(busybox_image, image_names):
    engine = connect(BuilderSettings())
    tags = {image_names("efa"), image_names("efa"), image_names("deepep")}
    for tag in tags:
        subprocess.run(["docker", "image", "tag", busybox_image, tag], check=True)
    assert existing_tags(engine, repo_prefix=image_names.prefix) == tags
    some = sorted(tags)[0]
    assert image_exists(engine, some)
    assert image_id(engine, some) == image_id(engine, busybox_image)
    assert not image_exists(engine, image_names("never-built"))


def test_image_config_has_what_enroot_writes(busybox_image, image_names, tmp_path):
    from efabuild.engine.build import BuildRequest, build_layer

    engine = connect(BuilderSettings())
    tag = image_names("config")
    dockerfile = "\n".join([
        f"FROM {busybox_image}",
        "ENV NCCL_NET_PLUGIN=ofi",
        'LABEL com.nvidia.nccl.version="2.30.7"',
        "WORKDIR /workspace",
        'VOLUME ["/data", "/cache"]',
        'ENTRYPOINT ["/bin/sh", "-c"]',
        'CMD ["echo hi"]',
    ])
    build_layer(engine, BuildRequest(tag=tag, dockerfile=dockerfile, context_dir=tmp_path,
                                     labels={"org.efabuild.layer": "config"}), tmp_path / "build.log")
    config = image_config(engine, tag)
    assert "NCCL_NET_PLUGIN=ofi" in config["Env"]
    assert config["Labels"] == {"com.nvidia.nccl.version": "2.30.7", "org.efabuild.layer": "config"}
    assert config["WorkingDir"] == "/workspace"
    assert config["Volumes"] == ["/cache", "/data"]
    assert config["Entrypoint"] == ["/bin/sh", "-c"]
    assert config["Cmd"] == ["echo hi"]
    with pytest.raises(NotFound):
        image_config(engine, image_names("absent"))


def test_base_identity_names_what_from_builds_on(busybox_image):
    engine = connect(BuilderSettings())
    # built or loaded here: no repository digest, so the image ID stands for its content
    assert base_identity(engine, busybox_image) == (image_id(engine, busybox_image), "image-id")
    assert base_identity(engine, "127.0.0.1:1/efabuild/none:1") == (None, "unresolved")
    pinned = "nvcr.io/nvidia/pytorch:26.08-py3@sha256:" + "ab" * 32
    assert base_identity(engine, pinned) == ("sha256:" + "ab" * 32, "pinned")
