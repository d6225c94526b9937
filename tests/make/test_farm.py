"""Builders that cannot see the local engine's images, and farms of them.

No standalone BuildKit daemon can be installed here from a package registry (Debian ships
buildx but not buildkitd, and its Go is too old to build v0.17), so the builder is the second
Docker engine (scripts/start-second-engine.sh) used only through buildx, by a docker context:
its builds, images and build cache are that engine's, which the main engine cannot see. Parents
reach children through a loopback registry of this module's own, whose access log shows what
each build pulled.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures.builder import MINI_NGC_TAG
from tests.plugins.engine import free_port, stop_pid
from tests.kits.wsfactory import TOOLS_LAYER, demo_on_base

REPO = Path(__file__).resolve().parents[2]
# each test makes on a farm of engines, several makes in a row
pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(900)]


def docker(host: str | None, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    command = ["docker", *(["--host", host] if host else []), *args]
    return subprocess.run(command, capture_output=True, text=True, check=check)


def efabuild(root: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "efabuild", "-C", str(root), *args], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=600)
    if ok:
        assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc


class Registry:
    """A loopback docker-registry with its own storage and access log."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        started = subprocess.run(["bash", str(REPO / "scripts/start-registry.sh"), str(free_port()), str(directory)],
                                 capture_output=True, text=True)
        if started.returncode != 0:
            pytest.fail(f"registry did not start: {started.stderr.strip()}")
        self.url = started.stdout.strip()

    def log_size(self) -> int:
        return (self.dir / "registry.log").stat().st_size

    def requests_since(self, offset: int) -> list[str]:
        """`METHOD /v2/...` of every request logged after `offset`."""
        with open(self.dir / "registry.log", "rb") as log:
            log.seek(offset)
            lines = log.read().decode(errors="replace").splitlines()
        return [line.split('"')[1] for line in lines if line.count('"') >= 2 and '"' in line]

    def stop(self) -> None:
        stop_pid(int((self.dir / "registry.pid").read_text()), "docker-registry")


@pytest.fixture(scope="module")
def registry(docker_engine, tmp_path_factory):
    reg = Registry(tmp_path_factory.mktemp("farm-registry"))
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def farm_context(second_engine) -> str:
    """A docker context for the second engine: `docker --context NAME buildx build` builds there."""
    name = f"efabuild-test-{secrets.token_hex(4)}"
    docker(None, "context", "create", name, "--docker", f"host={second_engine}")
    yield name
    docker(None, "context", "rm", "--force", name, check=False)


@pytest.fixture(scope="module")
def registry_base(registry) -> str:
    """The offline fixture base in the registry, as REGISTRY/…:TAG and its digest."""
    from fixtures.builder import build_fixtures

    image = build_fixtures()[0].image_id
    name = f"{registry.url}/{MINI_NGC_TAG}"
    docker(None, "image", "tag", image, name)
    pushed = docker(None, "image", "push", name).stdout
    docker(None, "image", "rm", "--no-prune", name)
    digest = next(word for line in pushed.splitlines() if "digest:" in line for word in line.split()
                  if word.startswith("sha256:"))
    return f"{name}@{digest}"


def workspace(root: Path, base: str, builder: str, registry: str | None) -> Path:
    """The shipped demo graph on the registry base, with a run-unique ARG so no builder has its
    steps cached, built by `builder` (a BUILD.toml [builder] line)."""
    settings = '[workspace]\ngraphs = ["graphs/*.toml"]\n[audit]\nhost_efa_installer = "1.50.0"\n'
    settings += f"[builder]\n{builder}\n"
    if registry:
        settings += f'[registry]\nurl = "{registry}"\n'
    ref, digest = base.split("@")
    return demo_on_base(root, ref, digest, secrets.token_hex(6), settings)


def keys(root: Path) -> dict[str, str]:
    data = json.loads(efabuild(root, "plan", "--json").stdout)
    return {layer["name"].split(":")[1]: layer["key"] for layer in data["layers"]}


def states(root: Path) -> dict[str, str]:
    data = json.loads(efabuild(root, "plan", "--json").stdout)
    return {layer["name"].split(":")[1]: layer["action"] for layer in data["layers"]}


def test_parents_reach_children_through_the_registry(registry, registry_base, farm_context, second_engine,
                                                     tmp_path):
    ws = workspace(tmp_path / "ws", registry_base, f'farm = ["{farm_context}"]', registry.url)
    key = keys(ws)
    pushed = {layer: f"{registry.url}/efabuild/{layer}:{key[layer]}" for layer in ("efa", "deepep", "user")}
    try:
        for parent, child in (("efa", None), ("efa", "deepep"), ("deepep", "user")):
            if child is None:
                efabuild(ws, "make", "demo:efa")
                continue
            # the parent is gone from the builder's engine and its cache: the child's FROM must pull it
            docker(second_engine, "image", "rm", "--force", pushed[parent])
            docker(second_engine, "builder", "prune", "--all", "--force")
            offset = registry.log_size()
            efabuild(ws, "make", f"demo:{child}")
            requests = registry.requests_since(offset)
            manifest = [r for r in requests if r.startswith(f"GET /v2/efabuild/{parent}/manifests/sha256:")]
            assert manifest, f"{child}'s FROM did not pull {parent} from the registry: {requests}"
            assert any(r.startswith(f"GET /v2/efabuild/{parent}/blobs/sha256:") for r in requests)
            # and BuildKit pushed the child itself
            assert any(r.startswith(f"PUT /v2/efabuild/{child}/manifests/{key[child]}") for r in requests)
            log = Path(ws, "cache/logs/demo", child, f"{key[child]}.log").read_text()
            assert f"on {farm_context}" in log.splitlines()[0]
        # the main engine never had any of them: the builds ran where it cannot see
        for layer in pushed:
            assert docker(None, "image", "inspect", f"efabuild/{layer}:{key[layer]}", check=False).returncode
            assert docker(None, "image", "inspect", pushed[layer], check=False).returncode
        audit = efabuild(ws, "audit", "--all", ok=False)
        assert audit.returncode == 0, audit.stdout + audit.stderr
        assert audit.stdout.count("passed,") == 2  # demo:efa and demo:user, the artifact layers
        # the plan says what a farm make does: its builders have what the registry has, so nothing
        # is "to pull" into an engine they cannot see
        assert states(ws) == {"efa": "none", "deepep": "none", "user": "none"}
        Path(efabuild(ws, "lookup", "demo:user").stdout.strip()).unlink()
        assert states(ws) == {"efa": "none", "deepep": "none", "user": "export"}
        made = json.loads(efabuild(ws, "make", "--json", "demo").stdout)
        assert {o["name"]: o["status"] for o in made["layers"]}["demo:user"] == "exported", made
        # the layer diffs above the efa artifact are the registry's blobs: written from it
        record = Path(efabuild(ws, "lookup", "demo:user").stdout.strip()).with_suffix(".json")
        assert json.loads(record.read_text())["export"]["incremental"]["ancestor"] == key["efa"]
        graph = ws / "graphs/demo.toml"
        graph.write_text(graph.read_text().replace("COPY app/ /workspace/app/\n",
                                                   "COPY app/ /workspace/app/\nRUN echo changed > /changed\n"))
        assert states(ws) == {"efa": "none", "deepep": "none", "user": "build"}
    finally:
        docker(second_engine, "image", "rm", "--force", *pushed.values(), check=False)


def test_a_builder_that_cannot_see_local_images_needs_a_registry_and_a_pullable_base(
        farm_context, registry, registry_base, busybox_image, tmp_path):
    ws = workspace(tmp_path / "noreg", registry_base, f'farm = ["{farm_context}"]', None)
    made = efabuild(ws, "make", "--no-lint", "demo", ok=False)
    assert made.returncode == 2
    assert made.stderr.strip().splitlines()[-1].startswith("efabuild: BUILD.toml [builder]: builder "), made.stderr
    assert "add [registry] url" in made.stderr
    assert not (ws / "cache/logs").exists()  # nothing was built

    local = workspace(tmp_path / "localbase", registry_base, f'farm = ["{farm_context}"]', registry.url)
    graph = (local / "graphs/demo.toml").read_text()
    ref, digest = registry_base.split("@")
    graph = graph.replace(f'base = "{ref}"\ndigest = "{digest}"', f'base = "{busybox_image}"')
    (local / "graphs/demo.toml").write_text(graph)
    made = efabuild(local, "make", "--no-lint", "demo", ok=False)
    assert made.returncode == 2
    line = made.stderr.strip().splitlines()[-1]
    assert f"base {busybox_image} is only in this engine" in line and "push it to a registry" in line, line
    assert not (local / "cache/logs").exists()


def test_two_builders_in_a_farm_both_take_work(farm_context, registry, registry_base, second_engine, tmp_path):
    dead = f"unix://{tmp_path}/no-engine.sock"
    ws = workspace(tmp_path / "farm", registry_base,
                   f'jobs = 1\nfarm = ["{dead}", "{farm_context}", "unix:///var/run/docker.sock"]', registry.url)
    # two independent roots: the demo's efa layer and a second graph's root on the same base
    ref, digest = registry_base.split("@")
    (ws / "graphs/side.toml").write_text(
        f'[layers.side]\nbase = "{ref}"\ndigest = "{digest}"\n'
        f"dockerfile = '''\nRUN echo {secrets.token_hex(6)} > /side\n'''\nartifact = true\n")
    key = keys(ws)
    started = time.monotonic()
    made = efabuild(ws, "make", "demo:efa", "side")
    assert f"builder {dead} skipped" in made.stderr
    builders = {}
    for graph, layer in (("demo", "efa"), ("side", "side")):
        first = Path(ws, "cache/logs", graph, layer, f"{key[layer]}.log").read_text().splitlines()[0]
        builders[layer] = first.rsplit(" on ", 1)[1].split(" (")[0]
    assert set(builders.values()) == {farm_context, "unix:///var/run/docker.sock"}, builders
    # each manifest names the builder that built its layer, not the make's own engine
    for name, layer in (("demo:efa", "efa"), ("side:side", "side")):
        sqsh = Path(efabuild(ws, "lookup", name).stdout.strip())
        builder = json.loads(sqsh.with_suffix(".manifest.json").read_text())["builder"]
        assert builder["node"] == builders[layer], (name, builder)
        assert builder["builder"] == (farm_context if builders[layer] == farm_context else "default"), builder
    # each image is in the engine of the builder that built it, and only there
    for layer, builder in builders.items():
        name = f"{registry.url}/efabuild/{layer}:{key[layer]}"
        host = second_engine if builder == farm_context else None
        other = None if host else second_engine
        assert docker(host, "image", "inspect", name, check=False).returncode == 0
        assert docker(other, "image", "inspect", name, check=False).returncode != 0
        docker(host, "image", "rm", "--force", name, check=False)
    assert time.monotonic() - started < 300


def test_streamed_export_is_byte_identical_to_docker_export(farm_context, registry, busybox_image, second_engine,
                                                            tmp_path):
    """One image exported twice: from the builder's tar stream with its config from the registry,
    and with docker create | docker export from an engine that has it."""
    from efabuild.engine.build import BuildRequest, build_layer
    from efabuild.engine.client import connect
    from efabuild.export.remote import export_remote
    from efabuild.make.farm import Farm
    from efabuild.export.squash import export_image
    from efabuild.settings import BuilderSettings, ExportSettings, RegistrySettings
    from efabuild.chunks.cdc import chunk_file

    base = f"{registry.url}/efabuild-test/busybox:{busybox_image.rsplit(':', 1)[1]}"
    docker(None, "image", "tag", busybox_image, base)
    docker(None, "image", "push", base)
    docker(None, "image", "rm", "--no-prune", base)
    (tmp_path / "hostname").write_text("from-the-image\n")
    # what docker create adds or replaces (/etc/hostname), a working directory and a volume whose
    # times it pins, a hard link, and files the build dates with the wall clock
    dockerfile = (f"FROM {base}\nARG SOURCE_DATE_EPOCH\nCOPY hostname /etc/hostname\n"
                  f"RUN mkdir -p /opt/app/data && echo {secrets.token_hex(4)} > /opt/app/a && ln /opt/app/a /opt/app/b\n"
                  "WORKDIR /opt/app\nVOLUME /opt/app/data\nENV MODE=farm\nCMD [\"sh\"]\n")
    node = connect(BuilderSettings(context=farm_context))
    farm = Farm(nodes=[node], registry=RegistrySettings(url=registry.url), jobs=1, busy=[0])
    name = farm.push_name("stream", secrets.token_hex(8))
    built = build_layer(node, BuildRequest(tag=name, dockerfile=dockerfile, context_dir=tmp_path, push=name,
                                           source_date_epoch=315532800), tmp_path / "build.log")
    ref = farm.built("stream", name.rsplit(":", 1)[1], built.image_id)
    try:
        options = ExportSettings()
        chunking = (64 * 1024, 256 * 1024, 1024 * 1024)  # a chunked S3 tier's: the digest pass cuts the index too
        streamed = export_remote(node, ref, tmp_path / "streamed.sqsh", options=options, epoch=315532800,
                                 platform="linux/amd64", chunking=chunking)
        exported = export_image(name, tmp_path / "exported.sqsh", options=options, epoch=315532800,
                                engine=connect(BuilderSettings(host=second_engine)))
        assert streamed.time_clamp == exported.time_clamp is not None
        assert streamed.path.read_bytes() == exported.path.read_bytes()
        assert streamed.index == chunk_file(streamed.path, chunking=chunking) and exported.index is None
        listing = subprocess.run(["unsquashfs", "-lln", "-d", "", str(streamed.path)], capture_output=True,
                                 text=True, check=True).stdout
        for path in ("/etc/hosts", "/etc/resolv.conf", "/etc/mtab -> /proc/mounts", "/proc", "/sys", "/dev",
                     "/opt/app/data", "/etc/rc"):
            assert path in listing, path
        assert subprocess.run(["unsquashfs", "-cat", str(streamed.path), "/etc/hostname"],
                              capture_output=True, check=True).stdout == b""  # docker create's, empty
    finally:
        docker(second_engine, "image", "rm", "--force", name, check=False)


CHECK_GRAPH = TOOLS_LAYER + """
[layers.stamp]
parent = "tools"
dockerfile = '''
RUN date > /stamp
'''
artifact = true
"""


def test_check_rebuilds_on_the_farm_through_the_registry(farm_context, registry, registry_base, second_engine,
                                                         tmp_path):
    ws = tmp_path / "ws"
    (ws / "graphs").mkdir(parents=True)
    ref, digest = registry_base.split("@")
    (ws / "graphs/g.toml").write_text(CHECK_GRAPH.format(base=ref, digest=digest, run=secrets.token_hex(6)))
    build = f'[workspace]\ngraphs = ["graphs/*.toml"]\n[builder]\nfarm = ["{farm_context}"]\n'
    (ws / "BUILD.toml").write_text(build + f'[registry]\nurl = "{registry.url}"\n')
    efabuild(ws, "make", "g")
    key = keys(ws)
    pushed = {layer: f"{registry.url}/efabuild/{layer}:{key[layer]}" for layer in key}
    checked = {layer: f"{registry.url}/efabuild/{layer}:check-{key[layer][:12]}" for layer in key}
    stored = Path(efabuild(ws, "lookup", "g:stamp").stdout.strip())
    before = (stored.read_bytes(), docker(None, "buildx", "imagetools", "inspect", pushed["stamp"]).stdout)
    try:
        # the parent is gone from the builder's engine and its cache: the rebuild's FROM must pull it
        docker(second_engine, "image", "rm", "--force", *pushed.values())
        docker(second_engine, "builder", "prune", "--all", "--force")
        time.sleep(1.1)  # `date` prints seconds
        offset = registry.log_size()
        check = efabuild(ws, "make", "--check", "g:stamp", ok=False)
        assert check.returncode == 1, check.stdout + check.stderr
        assert "g:stamp" in check.stdout and "differs" in check.stdout
        assert "content  /stamp" in check.stdout
        requests = registry.requests_since(offset)
        assert any(r.startswith("GET /v2/efabuild/tools/manifests/sha256:") for r in requests), requests
        assert any(r.startswith(f"PUT /v2/efabuild/stamp/manifests/check-{key['stamp'][:12]}") for r in requests)
        log = Path(ws, "cache/logs/g/stamp", f"{key['stamp']}.check.log").read_text()
        assert f"on {farm_context}" in log.splitlines()[0]
        # the stored artifact and the layer's registry tag are left as they were; the rebuild is
        # in no engine (the builder's copy went after its export)
        assert (stored.read_bytes(), docker(None, "buildx", "imagetools", "inspect", pushed["stamp"]).stdout) == before
        for host in (None, second_engine):
            assert docker(host, "image", "inspect", checked["stamp"], check=False).returncode
        # a root layer rebuilds on its base, from the registry too, to the same bytes
        same = efabuild(ws, "make", "--check", "--json", "g:tools", ok=False)
        assert same.returncode == 0, same.stdout + same.stderr
        [result] = json.loads(same.stdout)["checks"]
        assert result["identical"] and result["differences"] == []

        # what a farm's check cannot do is one line: no [registry] ...
        (ws / "BUILD.toml").write_text(build)
        bad = efabuild(ws, "make", "--check", "g:stamp", ok=False)
        assert bad.returncode == 2 and "add [registry] url" in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        # ... or a parent the registry lacks (deleted there; the main engine never had it)
        (ws / "BUILD.toml").write_text(build + f'[registry]\nurl = "{registry.url}"\n')
        tools_digest = json.loads(docker(None, "buildx", "imagetools", "inspect", pushed["tools"], "--format",
                                         "{{json .Manifest}}").stdout)["digest"]
        subprocess.run(["curl", "-fsS", "-X", "DELETE",
                        f"http://{registry.url}/v2/efabuild/tools/manifests/{tools_digest}"], check=True)
        bad = efabuild(ws, "make", "--check", "g:stamp", ok=False)
        assert bad.returncode == 1, bad.stderr
        [line] = bad.stderr.strip().splitlines()
        assert "parent g:tools" in line and "efabuild make g:tools" in line, line
    finally:
        docker(second_engine, "image", "rm", "--force", *pushed.values(), *checked.values(), check=False)


# ---- incremental export from the registry's blobs ------------------------------------------------

def _child(root: Path) -> tuple[Path, dict]:
    sqsh = Path(efabuild(root, "lookup", "demo:user").stdout.strip())
    return sqsh, json.loads(sqsh.with_suffix(".json").read_text())


def _export_line(proc: subprocess.CompletedProcess) -> str:
    return next((line for line in (proc.stdout + proc.stderr).splitlines() if "demo:user: export: " in line), "")


def test_the_same_key_is_the_same_bytes_from_a_local_engine_and_from_a_farm(registry, registry_base, farm_context,
                                                                            second_engine, tmp_path):
    """A one-file change written from the efa artifact: here from the engine's overlay2
    directories, on the farm from the registry's blobs; the same child either way, and a farm's
    make --check rebuilds it the same way."""
    run_id = secrets.token_hex(6)
    ref, digest = registry_base.split("@")
    common = '[workspace]\ngraphs = ["graphs/*.toml"]\n'
    roots = {"local": demo_on_base(tmp_path / "local", ref, digest, run_id, common),
             "farm": demo_on_base(tmp_path / "farm", ref, digest, run_id, common +
                                  f'[builder]\nfarm = ["{farm_context}"]\n[registry]\nurl = "{registry.url}"\n')}
    line = f"\n# one change on both sides {run_id}\n"
    made, tags = {}, set()
    try:
        for side, root in roots.items():
            efabuild(root, "make", "demo")
            tags |= {f"efabuild/{name}:{key}" for name, key in keys(root).items()}
            with (root / "app" / "train.py").open("a") as f:
                f.write(line)
            again = efabuild(root, "make", "demo")
            tags |= {f"efabuild/{name}:{key}" for name, key in keys(root).items()}
            made[side] = (*_child(root), _export_line(again))
        efa = keys(roots["farm"])["efa"]
        assert keys(roots["local"]) == keys(roots["farm"])
        for side, (_sqsh, record, shown) in made.items():
            assert record["export"]["incremental"]["ancestor"] == efa, (side, record["export"])
            assert f"export: incremental from {efa[:12]}" in shown, (side, shown)
        assert made["local"][1]["digest"] == made["farm"][1]["digest"]
        assert made["local"][0].read_bytes() == made["farm"][0].read_bytes()
        efabuild(roots["farm"], "make", "--check", "demo:user")
    finally:
        docker(None, "image", "rm", "--force", *tags, check=False)
        docker(second_engine, "image", "rm", "--force", *(f"{registry.url}/{t}" for t in tags), check=False)


def test_a_blob_changed_in_the_registry_gives_a_full_export_naming_it(registry, registry_base, farm_context,
                                                                     second_engine, tmp_path):
    import gzip

    from efabuild.export.registryclient import Registry as Client
    from efabuild.export.registrylayers import read_image

    ws = workspace(tmp_path / "ws", registry_base, f'farm = ["{farm_context}"]', registry.url)
    key = keys(ws)
    pushed = [f"{registry.url}/efabuild/{layer}:{key[layer]}" for layer in ("efa", "deepep", "user")]
    try:
        efabuild(ws, "make", "demo")
        with (ws / "app" / "train.py").open("a") as f:
            f.write(f"\n# {secrets.token_hex(8)}\n")
        efabuild(ws, "make", "demo")
        sqsh, record = _child(ws)
        assert "ancestor" in record["export"]["incremental"], record["export"]
        # the blob that holds the changed file (a blob of this run alone), its last byte changed in storage
        image = read_image(Client(registry.url), f"{registry.url}/efabuild/user:{record['key']}", "linux/amd64")
        stored = {}
        for blob in image.layers:
            hexed = blob.digest.split(":")[1]
            stored[blob.digest] = registry.dir / "storage/docker/registry/v2/blobs/sha256" / hexed[:2] / hexed / "data"
        blob = next(d for d, path in stored.items() if b"workspace/app/train.py" in gzip.decompress(path.read_bytes()))
        data = bytearray(stored[blob].read_bytes())
        data[len(data) // 2] ^= 0xFF
        stored[blob].write_bytes(bytes(data))
        sqsh.unlink()  # exported again: from the registry's blobs, as the record says it was
        again = efabuild(ws, "make", "demo:user")
        sqsh, record = _child(ws)
        reason = record["export"]["incremental"]["full"]
        assert reason.startswith(f"blob {blob}: "), reason
        assert f"export: full (blob {blob}: " in _export_line(again)
        # the child is the builder's own copy of the image, not the tampered bytes
        train = subprocess.run(["unsquashfs", "-cat", str(sqsh), "workspace/app/train.py"], capture_output=True,
                               check=True).stdout
        assert train == (ws / "app" / "train.py").read_bytes()
    finally:
        docker(second_engine, "image", "rm", "--force", *pushed, check=False)
