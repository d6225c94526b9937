"""Images in the engine: do they exist, what is their ID, config and repo digest."""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import NamedTuple

from efabuild.engine.api import ApiError
from efabuild.engine.client import Engine, EngineError, EngineTimeout, output_text
from efabuild.errors import NotFound
from efabuild.refs import KEY_LABEL

LIST_TIMEOUT_S = 120.0
INSPECT_TIMEOUT_S = 60.0
# Asking a registry for a digest must not hold a plan up when the network is down.
REMOTE_TIMEOUT_S = 15.0


def image_id(engine: Engine, ref: str) -> str | None:
    """The image ID (sha256:...) of `ref` in the engine, None when it has no such image."""
    if engine.api is not None:
        inspected = _api_inspect(engine, ref)
        return str(inspected.get("Id") or "") or None if inspected else None
    found = engine.run("image", "inspect", "--format", "{{.Id}}", ref, timeout=INSPECT_TIMEOUT_S)
    if found.returncode != 0:
        if _no_such_image(found.stderr):
            return None
        raise EngineError.from_output(f"cannot inspect image {ref} at {engine.where()}", found.stderr)
    return found.stdout.strip() or None


def image_exists(engine: Engine, ref: str) -> bool:
    return image_id(engine, ref) is not None


def existing_tags(engine: Engine, repo_prefix: str = "efabuild/") -> set[str]:
    """Every `repo:tag` in the engine whose repository starts with `repo_prefix`, in one call."""
    if engine.api is not None:
        try:
            return {tag for tag in engine.api.repo_tags()
                    if tag.startswith(repo_prefix) and not tag.endswith(":<none>")}
        except ApiError as exc:
            raise EngineError(f"cannot list images at {engine.where()}: {exc}") from None
    listed = engine.run("image", "ls", "--format", "{{.Repository}}:{{.Tag}}", timeout=LIST_TIMEOUT_S)
    if listed.returncode != 0:
        raise EngineError.from_output(f"cannot list images at {engine.where()}", listed.stderr)
    return {
        line.strip() for line in listed.stdout.splitlines()
        if line.startswith(repo_prefix) and not line.strip().endswith(":<none>")
    }


class ImageFacts(NamedTuple):
    """What an export needs to know of an image before it reads its filesystem."""

    config: dict  # what Enroot writes into the container: see image_config
    size: int | None  # bytes, as the engine counts them: the export's expected stream length
    created: str  # the config's creation time, RFC 3339 ("" when unset)


def image_facts(engine: Engine, ref: str) -> ImageFacts:
    """The one reader of an image's config: its Enroot-relevant part, size and creation time.
    Raises NotFound for an image the engine lacks. Through the engine's socket where it is on this
    host (2 ms; the docker CLI takes 25-30 ms to start, and an incremental export asks three
    times), else the CLI; both give the same facts (engine test)."""
    if engine.api is not None:
        inspected = _api_inspect(engine, ref)
        if not inspected:
            raise NotFound(f"no image {ref} at {engine.where()}")
        return _api_facts(inspected, ref, engine)
    from python_on_whales.exceptions import DockerException, NoSuchImage

    try:
        inspected = engine.client.image.inspect(ref)
    except NoSuchImage:
        raise NotFound(f"no image {ref} at {engine.where()}") from None
    except DockerException as exc:
        raise EngineError.from_output(f"cannot inspect image {ref} at {engine.where()}", exc.stderr) from None
    c = inspected.config
    config = {
        "Env": list(c.env or []),
        "Labels": dict(c.labels or {}),
        # python-on-whales reads an unset WorkingDir ("") as Path("."): Enroot's default is "/"
        "WorkingDir": "" if c.working_dir is None or str(c.working_dir) == "." else str(c.working_dir),
        "Entrypoint": list(c.entrypoint or []) or None,
        "Cmd": list(c.cmd or []) or None,
        "Volumes": sorted(str(v) for v in c.volumes or {}),
    }
    created = inspected.created.isoformat() if inspected.created else ""
    return ImageFacts(config, inspected.size, created)


def _api_facts(inspected: dict, ref: str, engine: Engine) -> ImageFacts:
    """image_facts from the engine API's inspect, shaped as python-on-whales shapes the CLI's."""
    c = inspected.get("Config") or {}
    if not isinstance(c, dict):
        raise EngineError(f"cannot read the config of {ref} at {engine.where()}")
    workdir = c.get("WorkingDir") or ""
    workdir = str(PurePosixPath(workdir)) if workdir else ""  # as pydantic's Path gives it
    config = {
        "Env": list(c.get("Env") or []),
        "Labels": dict(c.get("Labels") or {}),
        "WorkingDir": "" if workdir == "." else workdir,
        "Entrypoint": list(c.get("Entrypoint") or []) or None,
        "Cmd": list(c.get("Cmd") or []) or None,
        "Volumes": sorted(str(v) for v in c.get("Volumes") or {}),
    }
    size = inspected.get("Size")
    created = inspected.get("Created")
    return ImageFacts(config, size if isinstance(size, int) else None, created if isinstance(created, str) else "")


def image_config(engine: Engine, ref: str) -> dict:
    """The parts of the image config that Enroot writes into the container: Env, Labels,
    WorkingDir, Entrypoint, Cmd and Volumes (a sorted list of paths)."""
    return image_facts(engine, ref).config


def built_for_key(engine: Engine, ref: str, key: str) -> bool:
    """Whether the image `ref` names is one efabuild built for `key`: its org.efabuild.key label
    says so. Whoever shares an engine can give any image a layer's name; a plain retag is caught,
    a label set at build time is not."""
    return image_config(engine, ref)["Labels"].get(KEY_LABEL) == key


def history_times(engine: Engine, ref: str, timeout: float = LIST_TIMEOUT_S) -> list[str]:
    """The creation time of every step in the image's history, as the engine prints them.

    The docker CLI itself: python-on-whales 0.81 has no `image history` (it raises
    NotImplementedError)."""
    listed = engine.run("image", "history", "--no-trunc", "--format", "{{.CreatedAt}}", ref, timeout=timeout)
    if listed.returncode != 0:
        raise EngineError.from_output(f"cannot read the history of {ref} at {engine.where()}", listed.stderr)
    return listed.stdout.splitlines()


def base_identity(engine: Engine, ref: str, timeout: float = REMOTE_TIMEOUT_S) -> tuple[str | None, str]:
    """What a `FROM ref` builds on, as (digest, source), in one inspect when the engine has it.

    A local image pulled from a registry: its repository digest ("registry"). One built or loaded
    here has none: its image ID names its content ("image-id") — the registry's digest for the same
    tag could name other content. Absent locally: the registry's digest, which FROM will pull.
    """
    if "@" in ref:
        return ref.rsplit("@", 1)[1], "pinned"
    local = _local_identity(engine, ref)
    if local is not None:
        digest = _repo_digest(ref, local[1])
        return (digest, "registry") if digest else (local[0], "image-id")
    digest = remote_digest(engine, ref, timeout=timeout)
    return digest, "registry" if digest else "unresolved"


def base_identity_for(engine: Engine, ref: str, platform: str | None, timeout: float = REMOTE_TIMEOUT_S,
                      asked: dict | None = None) -> tuple[str | None, str, str | None]:
    """base_identity for one platform of a several-platform workspace: (digest, source, index
    digest). A registry's multi-platform index gives the platform's own manifest digest (what a
    build for it pulls, so what its key covers) and the index's beside it. A local image counts
    only when it is of that platform: Docker's image store keeps one platform per tag, so an
    amd64 image under the tag says nothing of the arm64 one. `asked`: the registry's answers by
    ref, kept by the caller so that one question serves every platform."""
    if platform is None:
        return (*base_identity(engine, ref, timeout), None)
    if "@" in ref:
        return ref.rsplit("@", 1)[1], "pinned", None
    local = _local_identity(engine, ref)
    if local is not None and _repo_digest(ref, local[1]) is None and _local_platform(engine, ref) == platform:
        return local[0], "image-id", None
    asked = {} if asked is None else asked
    if ref not in asked:
        asked[ref] = platform_digests(engine, ref, timeout=timeout)
    top, digests = asked[ref]
    if digests is None:  # a single-platform image: its own digest (its platform unchecked)
        return top, "registry" if top else "unresolved", None
    digest = digests.get(platform) or digests.get(platform.rsplit("/", 1)[0] if platform.count("/") == 2 else "")
    return digest, "registry" if digest else "unresolved", top


def platform_digests(engine: Engine, ref: str,
                     timeout: float = REMOTE_TIMEOUT_S) -> tuple[str | None, dict[str, str] | None]:
    """(`ref`'s digest in its registry, {os/arch[/variant]: manifest digest} when it is a
    multi-platform index, else None), in one question; (None, None) when absent or unreachable."""
    try:
        found = engine.run("buildx", "imagetools", "inspect", ref, "--format", "{{json .Manifest}}",
                           timeout=timeout)
    except EngineTimeout:
        return None, None
    try:
        data = json.loads(found.stdout) if found.returncode == 0 else None
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("digest"), str):
        return None, None
    manifests = data.get("manifests")
    if not isinstance(manifests, list):
        return data["digest"], None
    digests: dict[str, str] = {}
    for entry in manifests:
        wanted = entry.get("platform") if isinstance(entry, dict) else None
        if isinstance(wanted, dict) and isinstance(entry.get("digest"), str):
            name = "/".join(str(wanted[k]) for k in ("os", "architecture", "variant") if wanted.get(k))
            digests.setdefault(name, entry["digest"])
    return data["digest"], digests


def _local_platform(engine: Engine, ref: str) -> str | None:
    """os/arch[/variant] of the image `ref` in the engine (None when it lacks it)."""
    if engine.api is not None:
        inspected = _api_inspect(engine, ref) or {}
        parts = [str(inspected.get(k) or "") for k in ("Os", "Architecture", "Variant")]
    else:
        found = engine.run("image", "inspect", "--format", "{{.Os}} {{.Architecture}} {{.Variant}}", ref,
                           timeout=INSPECT_TIMEOUT_S)
        parts = found.stdout.split() if found.returncode == 0 else []
    return "/".join(p for p in parts if p) or None


def _local_identity(engine: Engine, ref: str) -> tuple[str, list[str]] | None:
    """(image ID, RepoDigests) of `ref` in the engine, in one question; None when it lacks it."""
    if engine.api is not None:
        inspected = _api_inspect(engine, ref)
        if not inspected or not inspected.get("Id"):
            return None
        return str(inspected["Id"]), [str(d) for d in inspected.get("RepoDigests") or []]
    found = engine.run("image", "inspect", "--format", "{{.Id}} {{json .RepoDigests}}", ref,
                       timeout=INSPECT_TIMEOUT_S)
    if found.returncode != 0 or not found.stdout.strip():
        return None
    image_id, _, repo_digests = found.stdout.strip().partition(" ")
    return image_id, json.loads(repo_digests or "null") or []


def _repo_digest(ref: str, repo_digests: list[str]) -> str | None:
    """The digest among RepoDigests that belongs to `ref`'s own repository."""
    wanted = _familiar_repository(ref)
    for repo_digest in repo_digests:
        repo, _, digest = repo_digest.partition("@")
        if _familiar_repository(repo) == wanted and digest:
            return digest
    return None


def _api_inspect(engine: Engine, ref: str) -> dict | None:
    try:
        return engine.api.inspect(ref)
    except ApiError as exc:
        raise EngineError(f"cannot inspect image {ref} at {engine.where()}: {exc}") from None


def remote_digest(engine: Engine, ref: str, timeout: float = REMOTE_TIMEOUT_S,
                  insecure: bool = False) -> str | None:
    """The manifest digest of `ref` in its registry, None when absent or unreachable in time.

    `imagetools` speaks plain HTTP to loopback registries by itself; other plain-HTTP registries
    need `docker manifest inspect --insecure`.
    """
    try:
        if insecure:
            found = engine.run("manifest", "inspect", "--insecure", "--verbose", ref, timeout=timeout)
            if found.returncode != 0:
                return None
            data = json.loads(found.stdout or "null")
            # a multi-platform index comes back as one entry per platform, without its own digest
            return (data or {}).get("Descriptor", {}).get("digest") if isinstance(data, dict) else None
        found = engine.run("buildx", "imagetools", "inspect", ref, "--format", "{{json .Manifest}}",
                           timeout=timeout)
    except EngineTimeout:
        return None
    if found.returncode != 0:
        return None
    try:
        return json.loads(found.stdout).get("digest") or None
    except (ValueError, AttributeError):
        return None


def tag_image(engine: Engine, source: str, target: str) -> None:
    from python_on_whales.exceptions import DockerException

    try:
        engine.client.image.tag(source, target)
    except DockerException as exc:
        raise EngineError.from_output(f"cannot tag {source} as {target} at {engine.where()}", exc.stderr) from None


def untag_image(engine: Engine, ref: str) -> None:
    """Remove the name `ref`; the image itself goes only when no other name is left on it."""
    from python_on_whales.exceptions import DockerException, NoSuchImage

    try:
        engine.client.image.remove(ref, prune=False)
    except NoSuchImage:
        pass
    except DockerException as exc:
        if not _no_such_image(output_text(exc.stderr)):
            raise EngineError.from_output(f"cannot remove {ref} at {engine.where()}", exc.stderr) from None


def _no_such_image(stderr: str) -> bool:
    text = stderr.lower()
    return "no such image" in text or "no such object" in text


def _familiar_repository(ref: str) -> str:
    """`docker.io/library/ubuntu:22.04` → `ubuntu`; `nvcr.io/nvidia/pytorch:26.08-py3` → itself
    without the tag. RepoDigests use the familiar form."""
    name = ref.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    for prefix in ("docker.io/", "index.docker.io/"):
        if name.startswith(prefix):
            name = name[len(prefix):]
            if name.startswith("library/") and name.count("/") == 1:
                name = name[len("library/"):]
    return name


def layer_facts(engine: Engine, ref: str) -> tuple[dict, tuple[str, ...]] | None:
    """(GraphDriver, diff IDs) of an image in an engine on this host (its local socket): where the
    engine keeps its layers (driver name and directories) and the image's `RootFS.Layers`, oldest
    first. None for an engine elsewhere, whose directories this host cannot read."""
    if engine.api is None:
        return None
    inspected = _api_inspect(engine, ref)
    if not inspected:
        raise NotFound(f"no image {ref} at {engine.where()}")
    driver, layers = inspected.get("GraphDriver"), (inspected.get("RootFS") or {}).get("Layers")
    if not isinstance(driver, dict) or not isinstance(layers, list) or not all(isinstance(x, str) for x in layers):
        raise EngineError(f"cannot read the layers of {ref} at {engine.where()}")
    return driver, tuple(layers)
