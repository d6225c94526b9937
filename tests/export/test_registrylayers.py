"""Layer diffs read from a registry's blobs (export/registrylayers), against Debian's docker-registry
on loopback: images are put there through its HTTP API as BuildKit pushes them (blobs, then the
manifests, an index over two platforms), and tampered with in its storage directory, as whoever
shares the registry's disk could."""

from __future__ import annotations

import gzip
import hashlib
import http.client
import json
import os
import subprocess
from pathlib import Path

import attrs
import pytest
import zstandard

from efabuild.export.layerdiff import LayerSourceUnavailable
from efabuild.export.registryclient import Registry
from efabuild.export.registrylayers import RegistryLayers, open_blobs, read_image
from efabuild.refs import KEY_LABEL
from tests.kits.tarkit import T0, tar_entries
from tests.plugins.engine import free_port, stop_pid

REPO = Path(__file__).resolve().parents[2]
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


class LoopbackRegistry:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        started = subprocess.run(["bash", str(REPO / "scripts/start-registry.sh"), str(free_port()), str(directory)],
                                 capture_output=True, text=True, timeout=60)
        if started.returncode != 0:
            pytest.fail(f"registry did not start: {started.stderr.strip()}")
        self.url = started.stdout.strip()

    def _request(self, method: str, path: str, body: bytes = b"", headers: dict | None = None):  # noqa: ANN202
        conn = http.client.HTTPConnection(self.url, timeout=30)
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        response.read()
        conn.close()
        return response

    def blob(self, repo: str, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        started = self._request("POST", f"/v2/{repo}/blobs/uploads/")
        assert started.status == 202, started.status
        location = started.getheader("Location").split(self.url, 1)[-1]
        done = self._request("PUT", f"{location}{'&' if '?' in location else '?'}digest={digest}", data,
                             {"Content-Type": "application/octet-stream"})
        assert done.status == 201, done.status
        return digest

    def manifest(self, repo: str, reference: str, body: bytes, media_type: str) -> str:
        done = self._request("PUT", f"/v2/{repo}/manifests/{reference}", body, {"Content-Type": media_type})
        assert done.status == 201, done.status
        return "sha256:" + hashlib.sha256(body).hexdigest()

    def stored(self, digest: str) -> Path:
        hexed = digest.split(":")[1]
        return self.dir / "storage/docker/registry/v2/blobs/sha256" / hexed[:2] / hexed / "data"

    def stop(self) -> None:
        stop_pid(int((self.dir / "registry.pid").read_text()), "docker-registry")


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    reg = LoopbackRegistry(tmp_path_factory.mktemp("blob-registry"))
    yield reg
    reg.stop()


LOWER = tar_entries([("etc", "d", 0o755, T0, None), ("etc/passwd", "f", 0o644, T0, b"root:x:0:0::/root:/bin/sh\n")])
MIDDLE = tar_entries([("opt", "d", 0o755, T0, None), ("opt/lib.so", "f", 0o755, T0, bytes(range(256)) * 900),
                      ("etc", "d", 0o755, T0, None), ("etc/.wh.passwd", "f", 0o644, T0, b"")])
TOP = tar_entries([("workspace", "d", 0o755, T0, None), ("workspace/train.py", "f", 0o644, T0, b"print(1)\n")])


def push_image(registry: LoopbackRegistry, repo: str, key: str, layers: list[tuple[bytes, str]],
               arch: str = "amd64") -> tuple[str, dict]:
    """An image of `layers` (tar, gzip|zstd|plain) labelled with `key`: its manifest digest, config."""
    packed = {"gzip": lambda t: gzip.compress(t, mtime=0), "zstd": zstandard.ZstdCompressor().compress,
              "plain": lambda t: t}
    types = {"gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
             "zstd": "application/vnd.oci.image.layer.v1.tar+zstd", "plain": "application/vnd.oci.image.layer.v1.tar"}
    descriptors, diff_ids = [], []
    for tar, how in layers:
        blob = packed[how](tar)
        descriptors.append({"mediaType": types[how], "digest": registry.blob(repo, blob), "size": len(blob)})
        diff_ids.append("sha256:" + hashlib.sha256(tar).hexdigest())
    config = {"architecture": arch, "os": "linux", "created": "2024-01-02T03:04:05.123456789Z",
              "config": {"Env": ["PATH=/usr/bin"], "WorkingDir": "/workspace", "Labels": {KEY_LABEL: key}},
              "rootfs": {"type": "layers", "diff_ids": diff_ids},
              "history": [{"created": "2024-01-01T00:00:00Z"}]}
    body = json.dumps(config).encode()
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": registry.blob(repo, body), "size": len(body)},
                "layers": descriptors}
    raw = json.dumps(manifest).encode()
    return registry.manifest(repo, f"{key}-{arch}", raw, OCI_MANIFEST), config


def test_a_platforms_layers_above_the_ancestors_stream_from_an_index_with_every_digest_checked(registry):
    repo, key = "efabuild/user", "k" * 8
    layers = [(LOWER, "gzip"), (MIDDLE, "zstd"), (TOP, "plain")]
    amd = push_image(registry, repo, key, layers)[0]
    arm = push_image(registry, repo, key, layers[:2], arch="arm64")[0]
    index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": d, "size": registry.stored(d).stat().st_size,
         "platform": {"os": "linux", "architecture": a}} for d, a in ((amd, "amd64"), (arm, "arm64"))]}).encode()
    digest = registry.manifest(repo, key, index, OCI_INDEX)
    client = Registry(registry.url)
    image = read_image(client, f"{registry.url}/{repo}:{key}@{digest}", "linux/amd64")
    assert len(image.layers) == 3
    assert read_image(client, f"{registry.url}/{repo}:{key}@{digest}", "linux/arm64").diff_ids == image.diff_ids[:2]
    streams = open_blobs(client, image, 1)  # the two layers above a one-layer ancestor
    try:
        assert [s.read(1 << 30) for s in streams] == [MIDDLE, TOP]
        assert [s.finish() for s in streams] == [None, None]
    finally:
        for s in streams:
            s.close()
    with pytest.raises(LayerSourceUnavailable, match="has no linux/riscv64 manifest"):
        read_image(client, f"{registry.url}/{repo}:{key}@{digest}", "linux/riscv64")
    source = RegistryLayers(client, f"{registry.url}/{repo}@{amd}", "linux/amd64", "other-key", "unused")
    with pytest.raises(LayerSourceUnavailable, match=f"is not the image built for its key \\(its {KEY_LABEL}"):
        source.facts(True)


def test_a_blob_changed_in_the_registrys_storage_is_named_and_never_passes(registry):
    repo, key = "efabuild/tampered", "t" * 8
    # blobs of their own: the registry keeps one file per digest, whichever repository pushed it
    mine = [tar_entries([("opt", "d", 0o755, T0, None), (f"opt/{n}", "f", 0o644, T0, b"tampered" * 200)])
            for n in ("a", "b")]
    digest, _ = push_image(registry, repo, key, [(LOWER, "gzip"), (mine[0], "plain"), (mine[1], "gzip")])
    client = Registry(registry.url)
    image = read_image(client, f"{registry.url}/{repo}@{digest}", "linux/amd64")
    plain, packed = image.layers[1], image.layers[2]
    # same size, other bytes: a file body in the plain tar, the last byte (the size trailer) of the gzip one
    for blob, at in ((plain, 1024 + 100), (packed, packed.size - 1)):
        stored = registry.stored(blob.digest)
        data = bytearray(stored.read_bytes())
        data[at] ^= 0xFF
        stored.write_bytes(bytes(data))
    streams = open_blobs(client, image, 1)
    try:
        for stream in streams:
            while stream.read(1 << 20):
                pass
        problems = [s.finish() for s in streams]
    finally:
        for s in streams:
            s.close()
    assert problems[0] == f"blob {plain.digest}: its bytes do not hash to its digest (the registry served other bytes)"
    assert problems[1].startswith(f"blob {packed.digest}: "), problems[1]


def test_a_manifest_or_config_that_is_not_its_digest_or_a_tar_that_is_not_its_diff_id_is_one_line(registry):
    repo, key = "efabuild/lies", "l" * 8
    digest, config = push_image(registry, repo, key, [(LOWER, "gzip"), (TOP, "gzip")])
    client = Registry(registry.url)
    image = read_image(client, f"{registry.url}/{repo}@{digest}", "linux/amd64")
    # a config whose diff ID is not the tar's, under a manifest of its own: both digests right
    config["rootfs"]["diff_ids"][1] = "sha256:" + "0" * 64
    body = json.dumps(config).encode()
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": registry.blob(repo, body), "size": len(body)},
                "layers": [{"mediaType": b.media_type, "digest": b.digest, "size": b.size} for b in image.layers]}
    other = registry.manifest(repo, "other", json.dumps(manifest).encode(), OCI_MANIFEST)
    (stream,) = open_blobs(client, read_image(client, f"{registry.url}/{repo}@{other}", "linux/amd64"), 1)
    assert stream.read(1 << 20) == TOP, stream.errors_seen
    assert stream.finish() == f"blob {image.layers[1].digest}: its tar does not hash to its diff ID sha256:{'0' * 64}"
    stream.close()
    stored = registry.stored(digest)
    stored.write_bytes(stored.read_bytes().replace(b'"schemaVersion": 2', b'"schemaVersion":  2'))
    with pytest.raises(LayerSourceUnavailable, match=f"manifest {repo}@{digest} is other bytes than its digest"):
        read_image(client, f"{registry.url}/{repo}@{digest}", "linux/amd64")


def test_a_registry_that_stalls_or_wants_a_login_is_one_line_not_a_hang_or_a_prompt(tmp_path):
    import socket
    import time

    from efabuild.export.registryclient import Registry as Client

    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        host = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(LayerSourceUnavailable, match=f"cannot reach the registry {host}: timed out"):
            Client(host, timeout=0.5).get("efabuild/user", "manifests/x")
        assert time.monotonic() - started < 5
    # docker-registry's own token auth ("silly": a Bearer challenge, no anonymous token at its realm)
    port = free_port()
    (tmp_path / "storage").mkdir()
    config = tmp_path / "config.yml"
    config.write_text(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path}/storage\n"
                      f"auth:\n  silly:\n    realm: http://127.0.0.1:{port}/token\n    service: efabuild-test\n"
                      f"http:\n  addr: 127.0.0.1:{port}\n")
    with open(tmp_path / "log", "wb") as log:
        server = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=log)
    try:
        for _ in range(80):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        with pytest.raises(LayerSourceUnavailable, match=f"the registry 127.0.0.1:{port} gives no anonymous token for "
                                                         "efabuild/user: it wants a login, which efabuild leaves to "
                                                         "the docker CLI"):
            read_image(Client(f"127.0.0.1:{port}"), f"127.0.0.1:{port}/efabuild/user@sha256:{'a' * 64}", "linux/amd64")
    finally:
        server.terminate()
        server.wait(timeout=20)


def test_a_child_is_written_from_the_registrys_blobs_only_on_the_build_its_ancestor_came_from(registry, tmp_path):
    """export_incremental with the registry as its source: the child is the one the writer makes
    of the same layer read from memory, and another build of the ancestor's key is a reason."""
    import io

    from efabuild.export.artifact import recorded_options
    from efabuild.export.enroot import ImageConfig
    from efabuild.export.incremental import Ancestor, export_incremental, layers_digest
    from efabuild.export.squash import ExportResult, mksquashfs_options
    from efabuild.export.squashfs import write_incremental
    from efabuild.export.tarfilter import RewritePlan, time_clamp
    from efabuild.settings import ExportSettings
    from tests.kits.tarkit import full_export

    options, epoch = ExportSettings(), T0
    top = tar_entries([("workspace", "d", 0o755, T0, None), ("workspace/app.py", "f", 0o644, T0, b"print(2)\n" * 50)])
    efa_key, user_key = "e" * 64, "u" * 64
    efa_digest, efa_cfg = push_image(registry, "efabuild/efa", efa_key, [(LOWER, "gzip")])
    user_digest, user_cfg = push_image(registry, "efabuild/user", user_key, [(LOWER, "gzip"), (top, "zstd")])
    clamp = time_clamp([user_cfg["created"]] + [h["created"] for h in user_cfg["history"]])
    plan = RewritePlan.for_config(ImageConfig.from_docker(user_cfg["config"]), epoch=epoch, clamp=clamp)
    efa_plan = RewritePlan.for_config(ImageConfig.from_docker(efa_cfg["config"]), epoch=epoch, clamp=clamp)
    efa_sqsh = full_export(LOWER, tmp_path / "efa.sqsh", efa_plan, options)
    recorded = recorded_options(options, epoch)
    tag = f"efabuild/efa:{efa_key}-amd64"

    def ancestor(exported_from: str) -> Ancestor:
        return Ancestor(efa_key, tag, efa_sqsh, "blake3:unused", {
            **recorded, "mksquashfs": list(mksquashfs_options(options, epoch=epoch)), "time_clamp": clamp,
            "image_layers": exported_from})

    def source() -> RegistryLayers:
        return RegistryLayers(Registry(registry.url), f"{registry.url}/efabuild/user@{user_digest}", "linux/amd64",
                              user_key, f"{registry.url}/{tag}")

    this_build = layers_digest(tuple(efa_cfg["rootfs"]["diff_ids"]))
    made = export_incremental(source(), ancestor(this_build), tmp_path / "child.sqsh", options=options, epoch=epoch,
                              recorded=recorded, sha256=False)
    assert isinstance(made, ExportResult), made
    direct = write_incremental(efa_sqsh, [io.BytesIO(top)], tmp_path / "direct.sqsh", plan=plan, ancestor_plan=efa_plan)
    assert not direct.full_needed, direct.reason
    assert (tmp_path / "child.sqsh").read_bytes() == (tmp_path / "direct.sqsh").read_bytes()
    other = export_incremental(source(), ancestor(layers_digest(("sha256:" + "1" * 64,))), tmp_path / "other.sqsh",
                               options=options, epoch=epoch, recorded=recorded, sha256=False)
    assert other == f"the registry's {tag} is another build of its key than the one the ancestor's copy was exported from"
    assert not (tmp_path / "other.sqsh").exists()

    # as make asks for it: the sha256 begun beside the copy goes on after the child is kept, and
    # is given only if the ancestor, whose pages it read, is then still the one checked
    from efabuild.errors import EfabuildError
    from efabuild.host import statstamp
    from efabuild.host.digest import sha256_file

    for n, moved in enumerate((False, True)):
        checked = attrs.evolve(ancestor(this_build), stamp=statstamp.stamp(os.stat(efa_sqsh)))
        later = export_incremental(source(), checked, tmp_path / f"later{n}.sqsh", options=options, epoch=epoch,
                                   recorded=recorded, sha256=False, sha256_beside_copy=True)
        assert isinstance(later, ExportResult) and later.sha256 is None, later
        assert (tmp_path / f"later{n}.sqsh").read_bytes() == (tmp_path / "direct.sqsh").read_bytes()
        if not moved:
            assert later.sha256_later() == sha256_file(tmp_path / f"later{n}.sqsh")
            continue
        os.utime(efa_sqsh)  # its stamp moves: what the sha256 read may not be what was checked
        with pytest.raises(EfabuildError, match="changed while the child was written from it.*make again"):
            later.sha256_later()
