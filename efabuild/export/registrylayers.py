"""The layers an image adds over its ancestor, as OCI layer tars read from the registry's blobs:
the source of a farm's incremental export, where no engine on this host has the image.

    manifest (by the digest the build recorded; the platform's, from an index)
      → config (rootfs.diff_ids, the Enroot config, the creation times)
      → each blob above the ancestor's layers: gzip, zstd or plain tar, inflated while the writer reads it

A registry is shared storage: nothing it serves is taken on its word. The manifest must hash to
the digest it was asked by, the config and each blob to their descriptors' digests, and each
inflated tar to its diff ID. A blob is checked as it streams into the writer (no copy of it on
disk): the writer's output is kept only when `finish` found every digest right, so a tampered
blob gives a full export with its reason, never a child of its bytes. Every read is bounded: a
manifest or config by its size limit, a blob by its descriptor's size, its tar by an expansion
limit, each socket read by a timeout (registryclient).

The HTTP side (registryclient) asks without credentials, which stay with the docker CLI: a
registry that wants a login is a reason for a full export, not a prompt.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import io
import json
from typing import Any

import attrs
import zstandard

from efabuild.export.enroot import ImageConfig
from efabuild.export.layerdiff import LayerSourceUnavailable
from efabuild.export.registryclient import DIGEST, Registry, bounded, split_ref
from efabuild.export.tarfilter import time_clamp
from efabuild.refs import KEY_LABEL

MAX_MANIFEST = 4 << 20  # what the distribution spec has registries accept
MAX_CONFIG = 16 << 20
# deflate's ceiling is 1032:1; a tar that inflates past this many times its blob is refused
MAX_EXPANSION = 1100
_CHUNK = 1 << 20
_INDEXES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
_MANIFESTS = ("application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json")
_GZIP = ("application/vnd.oci.image.layer.v1.tar+gzip", "application/vnd.docker.image.rootfs.diff.tar.gzip",
         "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip")
_ZSTD = ("application/vnd.oci.image.layer.v1.tar+zstd",)
_PLAIN = ("application/vnd.oci.image.layer.v1.tar", "application/vnd.docker.image.rootfs.diff.tar")


@attrs.frozen
class Blob:
    """A layer's descriptor in the manifest and its diff ID in the config."""

    digest: str
    size: int
    media_type: str
    diff_id: str


@attrs.frozen
class RegistryImage:
    """An image's manifest and config as the registry served them, every digest checked."""

    ref: str
    config: dict  # the config blob's JSON
    layers: tuple[Blob, ...]

    @property
    def diff_ids(self) -> tuple[str, ...]:
        return tuple(blob.diff_id for blob in self.layers)

    @property
    def created(self) -> list[str]:
        """The config's creation time and its history's, as a time clamp reads them."""
        history = self.config.get("history") or []
        return [str(self.config.get("created") or "")] + [
            str(h.get("created") or "") for h in history if isinstance(h, dict)]


def read_image(registry: Registry, ref: str, platform: str) -> RegistryImage:
    """`ref`'s manifest for `platform` (picked from an index) and its config, checked against
    their digests; by tag when `ref` names none (then the caller checks what it got)."""
    _host, repository, reference = split_ref(ref)
    if DIGEST.match(reference):
        body = registry.checked(repository, "manifests", reference, MAX_MANIFEST, _INDEXES + _MANIFESTS)
    else:
        response = registry.get(repository, f"manifests/{reference}", _INDEXES + _MANIFESTS)
        try:
            body = bounded(response, MAX_MANIFEST, ref)
        finally:
            response.close()
    manifest = _json(body, f"the manifest of {ref}")
    if manifest.get("mediaType") in _INDEXES or "manifests" in manifest:
        digest = _platform_manifest(manifest, platform, ref)
        manifest = _json(registry.checked(repository, "manifests", digest, MAX_MANIFEST, _MANIFESTS),
                         f"the {platform} manifest of {ref}")
    config_desc, layers = manifest.get("config"), manifest.get("layers")
    if not isinstance(config_desc, dict) or not isinstance(layers, list):
        raise LayerSourceUnavailable(f"the manifest of {ref} is not an image manifest")
    config = _json(registry.checked(repository, "blobs", _digest_of(config_desc, ref), MAX_CONFIG), f"the config of {ref}")
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") if isinstance(config.get("rootfs"), dict) else None
    if not isinstance(diff_ids, list) or len(diff_ids) != len(layers) or not all(
            isinstance(d, str) and DIGEST.match(d) for d in diff_ids):
        raise LayerSourceUnavailable(f"the config of {ref} does not list one sha256 diff ID per layer")
    blobs = []
    for desc, diff_id in zip(layers, diff_ids):
        if not isinstance(desc, dict) or not isinstance(desc.get("size"), int) or desc["size"] < 0:
            raise LayerSourceUnavailable(f"the manifest of {ref} has a malformed layer descriptor")
        blobs.append(Blob(_digest_of(desc, ref), desc["size"], str(desc.get("mediaType") or ""), diff_id))
    return RegistryImage(ref, config, tuple(blobs))


def _enroot_config(image: RegistryImage) -> ImageConfig:
    try:  # a dict by then (its labels were read); its fields are whatever the registry holds
        return ImageConfig.from_docker(image.config["config"])
    except (TypeError, ValueError, AttributeError):
        raise LayerSourceUnavailable(f"the config of {image.ref} has malformed fields") from None


def _platform_manifest(index: dict, platform: str, ref: str) -> str:
    want = platform.split("/")
    entries = index.get("manifests")
    for entry in entries if isinstance(entries, list) else []:
        p = entry.get("platform") if isinstance(entry, dict) else None
        if not isinstance(p, dict):
            continue
        have = [p.get("os"), p.get("architecture")] + ([p["variant"]] if p.get("variant") else [])
        if have[:2] == want[:2] and (len(want) < 3 or have[2:] == want[2:]):
            return _digest_of(entry, ref)
    raise LayerSourceUnavailable(f"the index of {ref} has no {platform} manifest")


def _digest_of(desc: dict, ref: str) -> str:
    digest = desc.get("digest")
    if not isinstance(digest, str) or not DIGEST.match(digest):
        raise LayerSourceUnavailable(f"a descriptor in {ref} has no sha256 digest")
    return digest


def _json(body: bytes, what: str) -> dict:
    try:
        found = json.loads(body)
    except ValueError:
        found = None
    if not isinstance(found, dict):
        raise LayerSourceUnavailable(f"{what} is not a JSON object")
    return found


class _Stop(Exception):
    """The blob's bytes cannot be read on: `_Packed.problem` says why."""


class _Packed(io.RawIOBase):
    """The blob's bytes as the registry sends them: at most its descriptor's size, hashed as read."""

    def __init__(self, response: http.client.HTTPResponse, size: int) -> None:
        self.response, self.left, self.size = response, size, size
        self.sha256 = hashlib.sha256()
        self.problem = ""

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:  # noqa: ANN001 - a writable buffer
        want = min(len(buf), self.left)
        if not want:
            return 0
        try:
            data = self.response.read(want)
        except (OSError, http.client.HTTPException) as exc:
            self.problem = f"the registry's answer broke off: {exc}"
            raise _Stop from None
        if not data:
            self.problem = f"ended {self.left} bytes before its descriptor's {self.size}"
            raise _Stop
        self.left -= len(data)
        self.sha256.update(data)
        buf[:len(data)] = data
        return len(data)


class BlobStream(io.RawIOBase):
    """One layer blob, inflated as it is read, its two digests checked by `finish`. A problem
    while streaming ends the stream early (the writer then sees a cut tar); `errors_seen` says it."""

    def __init__(self, registry: Registry, repository: str, blob: Blob) -> None:
        self.blob, self.where = blob, f"blob {blob.digest}"
        self.errors_seen: list[str] = []
        self._tar = hashlib.sha256()
        self._inflated, self._limit, self._done = 0, MAX_EXPANSION * blob.size + _CHUNK, False
        if blob.media_type not in _GZIP + _ZSTD + _PLAIN:
            raise LayerSourceUnavailable(f"{self.where} is a {blob.media_type or 'untyped'} layer, not a tar "
                                         "(plain, gzip or zstd)")
        self._response = registry.get(repository, f"blobs/{blob.digest}")
        self._packed = _Packed(self._response, blob.size)
        raw = io.BufferedReader(self._packed, _CHUNK)
        if blob.media_type in _GZIP:
            self._plain: Any = gzip.GzipFile(fileobj=raw, mode="rb")
        elif blob.media_type in _ZSTD:
            self._plain = zstandard.ZstdDecompressor().stream_reader(raw, read_size=_CHUNK, read_across_frames=True)
        else:
            self._plain = raw

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self._done:
            return b""
        try:
            data = self._plain.read(_CHUNK if n is None or n < 0 else min(n, _CHUNK))
        except _Stop:
            return self._fail(self._packed.problem)
        except Exception as exc:  # noqa: BLE001 - zlib.error, BadGzipFile, EOFError, zstandard.ZstdError
            return self._fail(f"does not inflate: {exc}")
        self._inflated += len(data)
        if self._inflated > self._limit:
            return self._fail(f"inflates past {MAX_EXPANSION} times its size")
        self._tar.update(data)
        if not data:
            self._done = True
        return data

    def _fail(self, problem: str) -> bytes:
        self.errors_seen.append(f"{self.where}: {problem}")
        self._done = True
        return b""

    def finish(self) -> str | None:
        """Read what the writer left of the blob (the tar's end blocks), then check both digests:
        None when the blob is the one the manifest names and inflates to its diff ID."""
        while self.read(_CHUNK):
            pass
        if self.errors_seen:
            return self.errors_seen[0]
        if self._packed.left:  # bytes after the compressed stream: still part of the blob's digest
            try:
                while self._packed.read(_CHUNK):
                    pass
            except _Stop:
                return f"{self.where}: {self._packed.problem}"
        try:
            extra = self._response.read(1)
        except (OSError, http.client.HTTPException):
            extra = b""
        if extra:
            return f"{self.where}: longer than its descriptor's {self.blob.size} bytes"
        if "sha256:" + self._packed.sha256.hexdigest() != self.blob.digest:
            return f"{self.where}: its bytes do not hash to its digest (the registry served other bytes)"
        if "sha256:" + self._tar.hexdigest() != self.blob.diff_id:
            return f"{self.where}: its tar does not hash to its diff ID {self.blob.diff_id}"
        return None

    def close(self) -> None:
        self._response.close()
        super().close()


def open_blobs(registry: Registry, image: RegistryImage, first: int) -> list[BlobStream]:
    """A stream of each of `image`'s layers from index `first` on, oldest first."""
    _host, repository, _ = split_ref(image.ref)
    streams: list[BlobStream] = []
    try:
        for blob in image.layers[first:]:
            streams.append(BlobStream(registry, repository, blob))
    except BaseException:
        for stream in streams:
            stream.close()
        raise
    return streams


class RegistryLayers:
    """The layer diffs of a registry image (a farm's build) above its ancestor's, as
    export.incremental reads a source; `ancestor_ref` names the ancestor's image there."""

    where = "registry's"

    def __init__(self, registry: Registry, ref: str, platform: str, key: str, ancestor_ref: str) -> None:
        self.registry, self.image, self.platform, self.key, self.ancestor_ref = registry, ref, platform, key, ancestor_ref
        self._images: dict[str, RegistryImage] = {}

    def _read(self, ref: str, key: str, what: str) -> RegistryImage:
        if ref not in self._images:
            image = read_image(self.registry, ref, self.platform)
            labels = (image.config.get("config") or {}).get("Labels") if isinstance(image.config.get("config"), dict) \
                else None
            if not isinstance(labels, dict) or labels.get(KEY_LABEL) != key:
                raise LayerSourceUnavailable(f"the registry's {ref} is not {what} (its {KEY_LABEL} label)")
            self._images[ref] = image
        return self._images[ref]

    def child(self) -> RegistryImage:
        return self._read(self.image, self.key, "the image built for its key")

    def facts(self, clamp_times: bool) -> tuple[ImageConfig, int | None]:
        image = self.child()
        return _enroot_config(image), time_clamp(image.created) if clamp_times else None

    def ancestor_config(self, ancestor) -> ImageConfig:  # noqa: ANN001 - an export.incremental.Ancestor
        return _enroot_config(self._read(self.ancestor_ref, ancestor.key, "the ancestor's image"))

    def diff_ids(self, ancestor) -> tuple[tuple[str, ...], tuple[str, ...]]:  # noqa: ANN001
        return self.child().diff_ids, self._read(self.ancestor_ref, ancestor.key, "the ancestor's image").diff_ids

    def open(self, first: int, count: int) -> list[BlobStream]:
        return open_blobs(self.registry, self.child(), first)

    def problems(self, streams: list[BlobStream], verify: bool) -> list[str]:
        """What the streams saw; with `verify`, also each blob's digests, the rest of it read."""
        if not verify:
            return [p for s in streams for p in s.errors_seen]
        return [p for s in streams if (p := s.finish())]
