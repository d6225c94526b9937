"""The layer-cache registry: Debian's docker-registry on loopback, pushed to and pulled from."""

from __future__ import annotations

import secrets
import subprocess

import pytest

from efabuild.engine.build import BuildRequest, build_layer
from efabuild.engine.client import connect
from efabuild.engine.images import (
    base_identity,
    existing_tags,
    image_exists,
    image_id,
    untag_image,
)
from efabuild.engine.registry import RegistryError, has, pull, push, remote_ref
from efabuild.settings import BuilderSettings, RegistrySettings

pytestmark = pytest.mark.engine


@pytest.fixture
def engine(docker_engine):
    return connect(BuilderSettings())


@pytest.fixture
def built_layer(engine, busybox_image, image_names, tmp_path):
    tag = image_names("efa")
    req = BuildRequest(tag=tag, dockerfile=f"FROM {busybox_image}\nRUN echo {secrets.token_hex(8)} > /id\n",
                       context_dir=tmp_path, labels={"org.efabuild.key": tag.rsplit(":", 1)[1]})
    build_layer(engine, req, tmp_path / "build.log")
    return tag


def test_push_remove_pull_gives_back_the_same_image(engine, local_registry, built_layer):
    registry = RegistrySettings(url=local_registry)
    original = image_id(engine, built_layer)
    assert not has(engine, built_layer, registry)

    pushed = push(engine, built_layer, registry)
    repository = remote_ref(built_layer, registry).rsplit(":", 1)[0]
    assert pushed.startswith(f"{repository}@sha256:")
    assert has(engine, built_layer, registry)
    # the registry's name is not left behind in the engine
    assert existing_tags(engine, repo_prefix=f"{local_registry}/") == set()

    untag_image(engine, built_layer)
    assert not image_exists(engine, built_layer)
    assert pull(engine, built_layer, registry) is True
    assert image_id(engine, built_layer) == original
    assert existing_tags(engine, repo_prefix=f"{local_registry}/") == set()


def test_the_base_digest_of_a_pushed_image_is_the_registrys(engine, local_registry, built_layer):
    registry = RegistrySettings(url=local_registry)
    pushed = push(engine, built_layer, registry)
    ref = remote_ref(built_layer, registry)
    assert base_identity(engine, ref) == (pushed.rsplit("@", 1)[1], "registry")
    # the digest pins the image: pulling by it gives the same image
    subprocess.run(["docker", "pull", "-q", pushed], capture_output=True, check=True)
    try:
        assert image_id(engine, pushed) == image_id(engine, built_layer)
        # pulled from a registry: a FROM of the tag builds on the registry's digest
        assert base_identity(engine, ref) == (pushed.rsplit("@", 1)[1], "registry")
    finally:
        untag_image(engine, pushed)


def test_pull_of_an_absent_layer_is_false(engine, local_registry, image_names):
    registry = RegistrySettings(url=local_registry)
    tag = image_names("never-pushed")
    assert pull(engine, tag, registry) is False
    assert not image_exists(engine, tag)


def test_insecure_registry_setting_works_on_loopback_too(engine, local_registry, built_layer, image_names):
    registry = RegistrySettings(url=local_registry, insecure=True)
    assert not has(engine, built_layer, registry)
    push(engine, built_layer, registry)
    assert has(engine, built_layer, registry)
    assert not has(engine, image_names("never-pushed"), registry)


def test_unreachable_registry_is_an_error_not_a_missing_layer(engine, image_names):
    registry = RegistrySettings(url="127.0.0.1:1")
    tag = image_names("efa")
    with pytest.raises(RegistryError) as caught:
        has(engine, tag, registry)
    assert str(caught.value).startswith(f"cannot ask registry 127.0.0.1:1 for {tag}: ")
    assert "\n" not in str(caught.value)
    with pytest.raises(RegistryError):
        pull(engine, tag, registry)
