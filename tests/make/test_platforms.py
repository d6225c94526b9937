"""Two platforms in one workspace, built for real: linux/amd64 natively and linux/arm64 under QEMU.

The base is the offline fixture built for both platforms and joined in one multi-platform index in
a loopback registry (as NGC publishes its tags), so each platform's key covers that platform's own
manifest digest. Needs scripts/setup-host.sh's QEMU registration and Debian's arm64 packages.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.kits.wsfactory import REPO

PLATFORMS = ("linux/amd64", "linux/arm64")
# emulated builds: a cold arm64 demo takes a minute or two on two cores
pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(1500)]
EM_X86_64, EM_AARCH64 = 62, 183


def efabuild(root: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "efabuild", "-C", str(root), *args], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=1200)
    if ok:
        assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc


@pytest.fixture(scope="module")
def multiarch_base(local_registry) -> str:
    """REGISTRY/efabuild-fixtures/pytorch:26.08-py3: an index of the amd64 and arm64 fixture bases."""
    from efabuild.engine.client import connect
    from fixtures.builder import build_fixtures, publish_index
    from efabuild.settings import BuilderSettings

    images = build_fixtures(platforms=PLATFORMS)
    return publish_index(connect(BuilderSettings()), images, PLATFORMS, local_registry).split("@")[0]


def demo(root: Path, base: str, builder: str) -> Path:
    """The shipped demo graph on `base` (a tag: resolved per platform), with a run-unique ARG so no
    build is cached, and `builder` as [builder]."""
    root.mkdir(parents=True)
    shutil.copytree(REPO / "app", root / "app")
    (root / "graphs").mkdir()
    text = (REPO / "graphs" / "demo.toml").read_text()
    text = text.replace('base = "efabuild-fixtures/pytorch:26.08-py3"', f'base = "{base}"')
    text = text.replace("ARG EFA_INSTALLER_VERSION=1.50.0\n", "ARG EFA_INSTALLER_VERSION=1.50.0\nARG TEST_RUN\n")
    text = text.replace('args = { EFA_INSTALLER_VERSION = "1.50.0" }',
                        f'args = {{ EFA_INSTALLER_VERSION = "1.50.0", TEST_RUN = "{secrets.token_hex(6)}" }}')
    assert base in text and "TEST_RUN" in text
    (root / "graphs" / "demo.toml").write_text(text)
    (root / "BUILD.toml").write_text('[workspace]\ngraphs = ["graphs/*.toml"]\n'
                                     '[audit]\nhost_efa_installer = "1.50.0"\n'
                                     f"[builder]\nplatforms = {json.dumps(list(PLATFORMS))}\n{builder}\n")
    return root


def unsquashed_head(sqsh: Path, path: str, tmp: Path) -> bytes:
    """The first 20 bytes of `path` inside the .sqsh, as unsquashfs extracts it (links followed)."""
    out = tmp / f"x-{secrets.token_hex(4)}"
    subprocess.run(["unsquashfs", "-no-progress", "-follow-symlinks", "-d", str(out), str(sqsh), path],
                   check=True, capture_output=True)
    return (out / path.lstrip("/")).read_bytes()[:20]


def e_machine(head: bytes) -> int:
    assert head[:4] == b"\x7fELF", head
    return int.from_bytes(head[18:20], "little")


def test_two_platforms_make_an_artifact_each_and_arm64_holds_aarch64_files(multiarch_base, tmp_path):
    ws = demo(tmp_path / "ws", multiarch_base, 'emulate = ["linux/arm64"]')
    planned = {layer["name"]: layer for layer in json.loads(efabuild(ws, "plan", "--json").stdout)["layers"]}
    arm_efa = planned["demo:efa@linux/arm64"]
    assert arm_efa["emulated"] and "emulated (QEMU, many times slower)" in arm_efa["reasons"]
    plan = json.loads(efabuild(ws, "plan", "--json").stdout)
    bases = {b["platform"]: b for b in plan["bases"]}
    # each platform's key covers its own manifest in the index; the index digest is recorded beside it
    assert bases["linux/amd64"]["digest"] != bases["linux/arm64"]["digest"]
    assert bases["linux/amd64"]["index_digest"] == bases["linux/arm64"]["index_digest"] is not None
    assert planned["demo:efa@linux/arm64"]["inputs"]["base"]["digest"] == bases["linux/arm64"]["digest"]

    started = time.monotonic()
    proc = efabuild(ws, "make", "--json", "demo")
    made = json.loads(proc.stdout)
    seconds = time.monotonic() - started
    # its own arm64 artifacts are what it was asked for: no warning that they are not this node's
    assert "is a linux/arm64 artifact" not in proc.stderr, proc.stderr
    layers = {o["name"]: o for o in made["layers"]}
    assert sorted(layers) == sorted(planned) and not made["failed"]
    for name in ("demo:efa", "demo:user"):
        amd, arm = layers[f"{name}@linux/amd64"], layers[f"{name}@linux/arm64"]
        assert amd["key"] != arm["key"] and amd["path"] != arm["path"]
        assert (arm["layer"], arm["platform"]) == (name, "linux/arm64")
        for outcome, platform in ((amd, "linux/amd64"), (arm, "linux/arm64")):
            record = json.loads(Path(outcome["path"]).with_suffix(".json").read_text())
            assert (record["name"], record["platform"]) == (name, platform)
    print(f"two-platform demo make (arm64 emulated): {seconds:.0f}s; per layer: "
          + ", ".join(f"{n} {o['seconds']:.0f}s" for n, o in layers.items()))

    arm = Path(layers["demo:user@linux/arm64"]["path"])
    amd = Path(layers["demo:user@linux/amd64"]["path"])
    # what the files are, read from their ELF headers inside the .sqsh, not from their names
    assert e_machine(unsquashed_head(arm, "/bin/busybox", tmp_path)) == EM_AARCH64
    assert e_machine(unsquashed_head(arm, "/usr/bin/python3.11", tmp_path)) == EM_AARCH64
    ofi = "/opt/amazon/ofi-nccl/lib/aarch64-linux-gnu/libnccl-net-ofi.so"
    assert e_machine(unsquashed_head(arm, ofi, tmp_path)) == EM_AARCH64
    assert e_machine(unsquashed_head(amd, "/bin/busybox", tmp_path)) == EM_X86_64

    manifest = json.loads(arm.with_suffix(".manifest.json").read_text())
    assert manifest["platform"] == "linux/arm64" and manifest["measured"]["machine"]["name"] == "aarch64"
    components = manifest["measured"]["components"]
    assert components["nccl"]["loads"].startswith("/usr/lib/aarch64-linux-gnu/libnccl.so"), components["nccl"]
    assert components["aws-ofi-nccl"]["loads"] == ofi and components["aws-ofi-nccl"]["version"] == "1.21.1"
    assert components["libfabric"]["version"] == "2.6.0"
    assert manifest["base"]["index_digest"] == bases["linux/arm64"]["index_digest"]
    for path in (arm, amd):
        audit = efabuild(ws, "audit", path.stem, ok=False)
        assert audit.returncode == 0, audit.stdout + audit.stderr
    # gc's keep counts per name and platform: with keep 1 both platforms' artifacts stay
    gc = efabuild(ws, "gc", "--keep", "1")  # what it would delete
    assert arm.stem[:12] not in gc.stdout and amd.stem[:12] not in gc.stdout, gc.stdout
    listed = efabuild(ws, "ls").stdout
    assert "demo:user@linux/arm64" in listed and "demo:user@linux/amd64" in listed, listed
    # make --check of a graph:layer rebuilds it on every platform it is built for
    checked = efabuild(ws, "make", "--check", "--json", "demo:user", ok=False)
    assert checked.returncode in (0, 1), checked.stderr
    assert sorted(c["name"] for c in json.loads(checked.stdout)["checks"]) == [
        "demo:user@linux/amd64", "demo:user@linux/arm64"]
    # make's platforms index for the job side: each name's key per platform
    from efabuild.make.result import MakeResult, published_platforms
    from efabuild.make.schedule import Outcome

    result = MakeResult(tuple(Outcome(o["name"], o["key"], o["status"]) for o in made["layers"]), {},
                        {o["name"]: (o["layer"], o["platform"]) for o in made["layers"]},
                        frozenset(n for n, o in layers.items() if o["path"]))
    assert published_platforms(result, {"demo:user": PLATFORMS})["demo:user"] == {"linux/amd64": amd.stem,
                                                                                "linux/arm64": arm.stem}


def test_an_arm64_image_with_an_x86_64_ofi_plugin_fails_audit_naming_the_file(multiarch_base, tmp_path):
    ws = tmp_path / "crafted"
    (ws / "graphs").mkdir(parents=True)
    (ws / "lib").mkdir()
    shutil.copy("/bin/busybox", ws / "lib" / "libnccl-net-ofi.so")  # a real x86_64 ELF file
    ofi = "/opt/amazon/ofi-nccl/lib/aarch64-linux-gnu/libnccl-net-ofi.so"
    (ws / "graphs" / "bad.toml").write_text(
        f'[layers.plugin]\nbase = "{multiarch_base}"\nartifact = true\ncontext = ["lib"]\n'
        f"dockerfile = '''\nCOPY lib/libnccl-net-ofi.so {ofi}\n"
        f"RUN echo {ofi.rsplit('/', 1)[0]} > /etc/ld.so.conf.d/100_ofinccl.conf\n"
        # BuildKit's own build args of the platform reach the layer's text
        "ARG TARGETARCH\nARG TARGETPLATFORM\nRUN echo $TARGETARCH $TARGETPLATFORM > /etc/built-for\n'''\n"
        'ignore = [{ rule = "EFA010", reason = "the test registry\'s tag" }]\n')
    (ws / "BUILD.toml").write_text('[workspace]\ngraphs = ["graphs/*.toml"]\n'
                                   '[builder]\nplatforms = ["linux/arm64"]\nemulate = ["linux/arm64"]\n')
    efabuild(ws, "make", "bad")
    # this x86_64 node is given the arm64 artifact by name only when it asks for that platform
    plain = efabuild(ws, "lookup", "bad:plugin", ok=False)
    assert plain.returncode == 1 and "bad:plugin has no linux/amd64 artifact (it has linux/arm64)" in plain.stderr
    sqsh = Path(efabuild(ws, "lookup", "bad:plugin@linux/arm64").stdout.strip())
    out = tmp_path / "built-for"
    subprocess.run(["unsquashfs", "-no-progress", "-d", str(out), str(sqsh), "/etc/built-for"], check=True,
                   capture_output=True)
    assert (out / "etc/built-for").read_text() == "arm64 linux/arm64\n"
    audit = efabuild(ws, "audit", "--json", sqsh.stem, ok=False)
    assert audit.returncode == 1, audit.stdout + audit.stderr
    checks = {c["check"]: c for c in json.loads(audit.stdout)["artifacts"][0]["checks"]}
    assert checks["elf-machine"]["status"] == "FAIL"
    assert checks["elf-machine"]["message"].startswith(f"{ofi} is x86_64: not aarch64"), checks["elf-machine"]


def test_without_emulate_a_platform_no_builder_runs_is_one_line_before_any_build(multiarch_base, tmp_path):
    ws = demo(tmp_path / "ws", multiarch_base, "")
    made = efabuild(ws, "make", "demo", ok=False)
    assert made.returncode == 2, made.stderr
    last = made.stderr.strip().splitlines()[-1]
    assert last.startswith("efabuild: BUILD.toml: builder: demo:efa@linux/arm64: no builder runs linux/arm64"), last
    assert 'emulate = ["linux/arm64"]' in last
    assert not (ws / "cache" / "logs").exists()  # nothing was built, not even the amd64 layers


def test_each_layer_goes_to_a_builder_of_its_platform(multiarch_base, local_registry, second_engine, tmp_path):
    """The second engine is the farm's arm64 node by declaration; the make's own engine its amd64
    node (its `docker version` says linux/amd64)."""
    arm_node = f"{second_engine}@linux/arm64"
    ws = demo(tmp_path / "ws", multiarch_base,
              f'jobs = 1\nfarm = ["unix:///var/run/docker.sock", "{arm_node}"]\n'
              f'[registry]\nurl = "{local_registry}"')
    made = json.loads(efabuild(ws, "make", "--json", "demo").stdout)
    assert not made["failed"], made
    nodes = {}
    for outcome in made["layers"]:
        if outcome["path"]:
            manifest = json.loads(Path(outcome["path"]).with_suffix(".manifest.json").read_text())
            nodes[outcome["name"]] = manifest["builder"]["node"]
    local = "unix:///var/run/docker.sock"  # a node is named by its builder, without the declaration
    assert nodes == {"demo:efa@linux/amd64": local, "demo:efa@linux/arm64": second_engine,
                     "demo:user@linux/amd64": local, "demo:user@linux/arm64": second_engine}, nodes


def test_a_local_base_of_one_platform_is_one_line_before_any_build(docker_engine, tmp_path):
    """The offline demo's base is a local amd64 image: Docker's image store holds no arm64 one
    under its tag, so BuildKit would ask docker.io for it mid-make."""
    from fixtures.builder import MINI_NGC_TAG, build_fixtures

    build_fixtures()
    ws = demo(tmp_path / "ws", MINI_NGC_TAG, 'emulate = ["linux/arm64"]')
    made = efabuild(ws, "make", "demo", ok=False)
    assert made.returncode == 2, made.stderr
    last = made.stderr.strip().splitlines()[-1]
    assert last.startswith("efabuild: graphs/demo.toml: layers.efa.base: demo:efa@linux/arm64: base "
                           f"{MINI_NGC_TAG} is a local image of linux/amd64 only"), last
    assert not (ws / "cache" / "logs").exists()
