"""Builds on another engine ([builder] host or context): a second dockerd on its own socket,
started by scripts/start-second-engine.sh, stands in for a remote builder."""

from __future__ import annotations

import secrets
import subprocess

import pytest

from efabuild.engine.build import BuildRequest, build_layer
from efabuild.engine.client import connect
from efabuild.engine.images import image_exists, untag_image
from efabuild.settings import BuilderSettings

# the first test starts the second engine
pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(600)]


def _request(tag: str, base: str, context_dir) -> BuildRequest:
    return BuildRequest(tag=tag, dockerfile=f"FROM {base}\nRUN echo {secrets.token_hex(8)} > /id\n",
                        context_dir=context_dir, labels={"org.efabuild.key": tag.rsplit(":", 1)[1]})


def test_builder_host_builds_on_that_engine_only(second_engine, busybox_image, image_names, tmp_path):
    remote = connect(BuilderSettings(host=second_engine))
    remote.check()
    assert remote.where() == f"{second_engine} ([builder] host or --builder)"
    tag = image_names("remote")
    try:
        result = build_layer(remote, _request(tag, busybox_image, tmp_path), tmp_path / "remote.log")
        assert image_exists(remote, tag)
        assert not image_exists(connect(BuilderSettings()), tag)
        assert result.image_id
    finally:
        untag_image(remote, tag)


def test_builder_context_builds_on_the_contexts_engine(second_engine, busybox_image, image_names, tmp_path):
    name = f"efabuild-test-{secrets.token_hex(4)}"
    subprocess.run(["docker", "context", "create", name, "--docker", f"host={second_engine}"],
                   capture_output=True, check=True)
    try:
        remote = connect(BuilderSettings(context=name))
        remote.check()
        assert remote.where() == f"{second_engine} (docker context {name})"
        tag = image_names("via-context")
        build_layer(remote, _request(tag, busybox_image, tmp_path), tmp_path / "context.log")
        try:
            assert image_exists(connect(BuilderSettings(host=second_engine)), tag)
            assert not image_exists(connect(BuilderSettings()), tag)
        finally:
            untag_image(remote, tag)
    finally:
        subprocess.run(["docker", "context", "rm", "--force", name], capture_output=True)
