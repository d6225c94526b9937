"""The layer-cache registry: built layer images are pushed as `REGISTRY/efabuild/<layer>:<key>`
and pulled back on another machine (or after a prune) instead of being rebuilt.

Credentials stay with the docker CLI (`docker login`, an ECR credential helper); nothing here
reads, passes or prints them.
"""

from __future__ import annotations

import json

from efabuild.engine.client import Engine, EngineTimeout, first_line
from efabuild.engine.images import INSPECT_TIMEOUT_S, REMOTE_TIMEOUT_S, tag_image, untag_image
from efabuild.errors import EfabuildError
from efabuild.host.stops import step_boundary
from efabuild.settings import RegistrySettings


class RegistryError(EfabuildError):
    """The registry could not be reached, refused us, or failed a push or pull."""


def remote_ref(tag: str, registry: RegistrySettings) -> str:
    """`efabuild/efa:KEY` → `REGISTRY/efabuild/efa:KEY`."""
    return f"{registry.url.rstrip('/')}/{tag}"


def has(engine: Engine, tag: str, registry: RegistrySettings, timeout: float = REMOTE_TIMEOUT_S) -> bool:
    """Whether the registry holds `tag` (one manifest request, no download).

    Raises RegistryError when the registry does not answer or refuses, so that an outage is
    not mistaken for a missing layer.
    """
    ref = remote_ref(tag, registry)
    try:
        if registry.insecure:
            found = engine.run("manifest", "inspect", "--insecure", ref, timeout=timeout)
        else:
            found = engine.run("buildx", "imagetools", "inspect", ref, "--format", "{{json .Manifest}}",
                               timeout=timeout)
    except EngineTimeout:
        raise RegistryError(f"registry {registry.url} did not answer within {timeout:g}s") from None
    if found.returncode == 0:
        return True
    if _means_absent(found.stderr):
        return False
    raise RegistryError(
        f"cannot ask registry {registry.url} for {tag}: {first_line(found.stderr)}{_hint(found.stderr, registry)}"
    )


def pull(engine: Engine, tag: str, registry: RegistrySettings) -> bool:
    """Pull `tag` from the registry and name it `tag` locally. False when the registry lacks it."""
    if not has(engine, tag, registry):
        return False
    ref = remote_ref(tag, registry)
    failed = _transfer(engine, "pull", ref)
    if failed is not None:
        if _means_absent(failed):  # deleted between the two requests
            return False
        raise RegistryError(f"cannot pull {ref}: {first_line(failed)}{_hint(failed, registry)}")
    tag_image(engine, ref, tag)
    untag_image(engine, ref)  # the local name is the key's; the registry's name is not needed
    return True


def push(engine: Engine, tag: str, registry: RegistrySettings) -> str:
    """Push the local image `tag` to the registry; returns `REGISTRY/efabuild/<layer>@sha256:...`."""
    ref = remote_ref(tag, registry)
    tag_image(engine, tag, ref)
    try:
        step_boundary("push")
        failed = _transfer(engine, "push", ref)
        if failed is not None:
            raise RegistryError(f"cannot push {ref}: {first_line(failed)}{_hint(failed, registry)}")
        digest = _repo_digest(engine, ref)
    finally:
        untag_image(engine, ref)
    repository = ref.rsplit(":", 1)[0]
    return f"{repository}@{digest}" if digest else ref


def _transfer(engine: Engine, verb: str, ref: str) -> str | None:
    """`docker image push|pull REF`; its error output when it fails. The docker CLI itself, as a
    child that dies with efabuild: a push or pull of gigabytes must not run on after a kill -9."""
    done = engine.run("image", verb, "--quiet", ref)
    return None if done.returncode == 0 else (done.stderr or done.stdout or f"docker image {verb} failed")


def _repo_digest(engine: Engine, ref: str) -> str | None:
    repository = ref.rsplit(":", 1)[0]
    found = engine.run("image", "inspect", "--format", "{{json .RepoDigests}}", ref, timeout=INSPECT_TIMEOUT_S)
    if found.returncode != 0:
        return None
    for repo_digest in json.loads(found.stdout or "null") or []:
        repo, _, digest = repo_digest.partition("@")
        if repo == repository:
            return digest
    return None


def _means_absent(stderr: str) -> bool:
    text = stderr.lower()
    return any(marker in text for marker in (
        ": not found", "manifest unknown", "no such manifest", "name unknown", "not found: manifest",
    ))


def _hint(stderr: str, registry: RegistrySettings) -> str:
    """What to do about the usual refusals (ECR in particular)."""
    text = stderr.lower()
    host = registry.url.split("/", 1)[0]
    if any(marker in text for marker in ("no basic auth credentials", "authorization token has expired",
                                         "unauthorized", "401")):
        if ".ecr." in host:
            return (f" (log in: aws ecr get-login-password | docker login --username AWS "
                    f"--password-stdin {host})")
        return f" (log in: docker login {host})"
    if "does not exist in the registry" in text:
        return " (create that repository in ECR first, or enable ECR's create-on-push)"
    if "http response to https client" in text:
        return " (a plain-HTTP registry: set [registry] insecure = true and list it in dockerd's insecure-registries)"
    return ""
