"""`efabuild make` on the real engine, with the offline demo fixtures (no mocks)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import blake3
import pytest

from fixtures.builder import MINI_NGC_TAG, build_fixtures
from tests.cli.test_json_convention import check_convention
from tests.kits.storekit import cache_dir
from tests.kits.wsfactory import make_workspace

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.engine]


@pytest.fixture(scope="module")
def mini_ngc(docker_engine) -> str:
    build_fixtures()
    return MINI_NGC_TAG


@pytest.fixture
def demo_ws(tmp_path, mini_ngc):
    """A copy of the shipped demo graph with a run-unique build arg, so keys are new to the engine."""
    root = tmp_path / "ws"
    root.mkdir()
    shutil.copytree(REPO / "app", root / "app")
    (root / "graphs").mkdir()
    text = (REPO / "graphs" / "demo.toml").read_text()
    run_id = uuid.uuid4().hex[:12]
    text = text.replace('args = { EFA_INSTALLER_VERSION = "1.50.0" }',
                        f'args = {{ EFA_INSTALLER_VERSION = "1.50.0", TEST_RUN = "{run_id}" }}')
    (root / "graphs" / "demo.toml").write_text(text)
    (root / "BUILD.toml").write_text('[workspace]\ngraphs = ["graphs/*.toml"]\n[audit]\nhost_efa_installer = "1.50.0"\n')
    yield root
    _remove_images_of(root)


def _remove_images_of(root: Path) -> None:
    keys = set()
    for path in (root / "cache" / "builds" / "layers").rglob("*.json") if (root / "cache").exists() else []:
        keys |= {entry["key"] for entry in json.loads(path.read_text())["builds"]}
    tags = subprocess.run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", "efabuild/*"],
                          capture_output=True, text=True).stdout.split()
    doomed = [t for t in tags if t.rsplit(":", 1)[-1] in keys]
    if doomed:
        subprocess.run(["docker", "image", "rm", "-f", *doomed], capture_output=True)


def efabuild(root: Path, *args: str, env: dict | None = None, check: bool = False) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "efabuild", "-C", str(root), *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
    if check:
        assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc


def plan(root: Path, *args: str) -> dict[str, dict]:
    data = json.loads(efabuild(root, "plan", "--json", *args, check=True).stdout)
    return {layer["name"]: layer for layer in data["layers"]}


def outcomes(proc: subprocess.CompletedProcess) -> dict[str, str]:
    """LAYER -> RESULT from make's summary table."""
    rows = [line.split() for line in proc.stdout.splitlines()[1:] if line.strip()]
    return {row[0]: row[2] for row in rows if len(row) >= 3 and ":" in row[0]}


def tag_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def unsquash_list(sqsh: Path) -> str:
    return subprocess.run(["unsquashfs", "-lls", "-d", "", str(sqsh)], capture_output=True, text=True,
                          check=True).stdout


def test_demo_builds_everything_once_then_nothing(demo_ws):
    first = efabuild(demo_ws, "make", "demo")
    assert first.returncode == 0, first.stderr
    assert outcomes(first) == {"demo:efa": "built", "demo:deepep": "built", "demo:user": "built"}
    layers = plan(demo_ws)
    assert {n: l["state"] for n, l in layers.items()} == {n: "available" for n in layers}
    # each artifact layer is a .sqsh in cache/, found by name
    user = Path(efabuild(demo_ws, "lookup", "demo:user", check=True).stdout.strip())
    assert user.is_file() and user.is_relative_to(demo_ws / "cache")
    listing = unsquash_list(user)
    assert "/workspace/app/train.py" in listing
    assert "/opt/amazon/efa_installed_packages" in listing
    assert "/.dockerenv" not in listing
    # its record, manifest and in-toto statement name it by blake3 and by sha256
    key = layers["demo:user"]["key"]
    sha256 = hashlib.sha256(user.read_bytes()).hexdigest()
    assert json.loads(user.with_suffix(".json").read_text())["sha256"] == sha256
    assert json.loads(user.with_name(f"{key}.manifest.json").read_text())["artifact"]["sha256"] == sha256
    statement = json.loads(efabuild(demo_ws, "show", "--intoto", "demo:user", check=True).stdout)
    assert statement["subject"] == [{"name": f"{key}.sqsh", "digest": {
        "sha256": sha256, "blake3": blake3.blake3(user.read_bytes()).hexdigest()}}]
    efa = Path(efabuild(demo_ws, "lookup", "demo:efa", check=True).stdout.strip())
    assert efa != user and "/workspace/app" not in unsquash_list(efa)
    # the image tags carry the keys
    assert tag_exists(f"efabuild/user:{layers['demo:user']['key']}")
    labels = json.loads(subprocess.run(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}",
                                        f"efabuild/user:{layers['demo:user']['key']}"],
                                       capture_output=True, text=True).stdout)
    assert labels["org.efabuild.key"] == layers["demo:user"]["key"] and labels["org.efabuild.layer"] == "user"
    # every build's log is kept under the store
    assert len(list((demo_ws / "cache" / "logs" / "demo").rglob("*.log"))) == 3
    second = efabuild(demo_ws, "make", "demo")
    assert second.returncode == 0, second.stderr
    assert set(outcomes(second).values()) == {"reused"}
    assert "3 reused" in second.stdout
    # the audit of what was built passes
    audit = efabuild(demo_ws, "audit", "--all")
    assert audit.returncode == 0, audit.stdout + audit.stderr


def test_installer_version_change_rebuilds_only_efa_and_descendants(demo_ws):
    graph = demo_ws / "graphs" / "demo.toml"
    text = graph.read_text()
    graph.write_text(text.replace('EFA_INSTALLER_VERSION = "1.50.0"', 'EFA_INSTALLER_VERSION = "1.49.0"'))
    base_id = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", MINI_NGC_TAG],
                             capture_output=True, text=True).stdout.strip()
    efabuild(demo_ws, "make", "--no-lint", "demo", check=True)  # 1.49.0 differs from the host's 1.50.0
    old_efa = Path(efabuild(demo_ws, "lookup", "demo:efa", check=True).stdout.strip())
    graph.write_text(text)
    layers = plan(demo_ws)
    assert layers["demo:efa"]["reasons"] == ["EFA_INSTALLER_VERSION 1.49.0 → 1.50.0"]
    assert layers["demo:deepep"]["reasons"] == ["parent efa changed"]
    assert layers["demo:user"]["reasons"] == ["parent deepep changed"]
    again = efabuild(demo_ws, "make", "demo")
    assert again.returncode == 0, again.stderr
    assert outcomes(again) == {"demo:efa": "built", "demo:deepep": "built", "demo:user": "built"}
    new_efa = Path(efabuild(demo_ws, "lookup", "demo:efa", check=True).stdout.strip())
    assert new_efa != old_efa and old_efa.exists()  # the old artifact stays until gc
    installed = subprocess.run(["unsquashfs", "-cat", str(new_efa), "opt/amazon/efa_installed_packages"],
                               capture_output=True, text=True).stdout
    assert installed.startswith("# EFA installer version: 1.50.0")
    base_after = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", MINI_NGC_TAG],
                                capture_output=True, text=True).stdout.strip()
    assert base_after == base_id


def test_user_file_change_rebuilds_only_the_user_layer(demo_ws):
    efabuild(demo_ws, "make", "demo", check=True)
    (demo_ws / "app" / "train.py").write_text("print('v2')\n")
    layers = plan(demo_ws)
    assert [n for n, l in layers.items() if l["state"] != "available"] == ["demo:user"]
    assert layers["demo:user"]["reasons"] == ["context app/train.py changed"]
    again = efabuild(demo_ws, "make", "demo", check=True)
    assert outcomes(again) == {"demo:efa": "reused", "demo:deepep": "reused", "demo:user": "built"}
    user = Path(efabuild(demo_ws, "lookup", "demo:user", check=True).stdout.strip())
    content = subprocess.run(["unsquashfs", "-cat", str(user), "workspace/app/train.py"], capture_output=True,
                             text=True).stdout
    assert content == "print('v2')\n"


def test_failing_run_is_one_clear_error_and_leaves_no_tag(demo_ws):
    graph = demo_ws / "graphs" / "demo.toml"
    good = graph.read_text()
    graph.write_text(good.replace("WORKDIR /workspace\n", "RUN echo compiling && false\nWORKDIR /workspace\n"))
    failed = efabuild(demo_ws, "make", "demo")
    assert failed.returncode == 1
    assert "Traceback" not in failed.stderr
    assert outcomes(failed)["demo:user"] == "failed"
    user_key = plan(demo_ws)["demo:user"]["key"]
    assert not tag_exists(f"efabuild/user:{user_key}")
    message = [line for line in failed.stderr.splitlines() if line.startswith("efabuild: demo:user failed")]
    assert message and "RUN echo compiling && false" in message[0]
    assert "compiling" in failed.stderr  # the last lines of its log
    assert "log:" in message[0] or "log" in failed.stderr
    graph.write_text(good)
    fixed = efabuild(demo_ws, "make", "demo")
    assert fixed.returncode == 0 and outcomes(fixed)["demo:user"] == "built"


def test_a_failed_branch_skips_its_descendants_while_others_finish(demo_ws):
    (demo_ws / "graphs" / "side.toml").write_text(
        "[layers.broken]\nparent = \"demo:efa\"\ndockerfile = '''\nRUN exit 3\n'''\n\n"
        "[layers.after]\nparent = \"broken\"\ndockerfile = '''\nRUN true\n'''\n\n"
        "[layers.fine]\nparent = \"demo:efa\"\ndockerfile = '''\nRUN echo fine > /fine\n'''\n")
    proc = efabuild(demo_ws, "make", "--jobs", "2")
    assert proc.returncode == 1
    result = outcomes(proc)
    assert result["side:broken"] == "failed" and result["side:after"] == "skipped"
    assert result["side:fine"] == "built" and result["demo:user"] == "built"


def test_sigint_during_a_build_leaves_no_tag_and_the_next_make_completes(demo_ws):
    graph = demo_ws / "graphs" / "demo.toml"
    # long enough that the build cannot finish before the signal, even on a loaded machine, and
    # new to BuildKit's cache (an unused build arg would not make it so)
    run = uuid.uuid4().hex[:8]
    graph.write_text(graph.read_text().replace("WORKDIR /workspace\n", f"RUN sleep 10 && echo {run}\nWORKDIR /workspace\n"))
    efabuild(demo_ws, "make", "demo:deepep", check=True)
    key = plan(demo_ws)["demo:user"]["key"]
    log = demo_ws / "cache" / "logs" / "demo" / "user" / f"{key}.log"
    proc = subprocess.Popen([sys.executable, "-m", "efabuild", "-C", str(demo_ws), "make", "demo"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (log.exists() and "sleep 10" in log.read_text()):
        time.sleep(0.1)
    assert log.exists(), "the user layer's build never started"
    assert not tag_exists(f"efabuild/user:{key}"), "the build finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err
    assert not tag_exists(f"efabuild/user:{key}")
    assert efabuild(demo_ws, "plan", "--json", check=True) and plan(demo_ws)["demo:user"]["state"] == "to build"
    done = efabuild(demo_ws, "make", "demo")
    assert done.returncode == 0 and outcomes(done)["demo:user"] == "built"


def test_layer_cache_registry_pulls_instead_of_building(demo_ws, local_registry):
    with (demo_ws / "BUILD.toml").open("a") as f:
        f.write(f'[registry]\nurl = "{local_registry}"\n')
    first = efabuild(demo_ws, "make", "demo", check=True)
    assert set(outcomes(first).values()) == {"built"}
    keys = {n: l["key"] for n, l in plan(demo_ws).items()}
    # another machine: no local images, an empty store
    _remove_images_of(demo_ws)
    shutil.rmtree(demo_ws / "cache")
    layers = plan(demo_ws)
    assert layers["demo:efa"]["state"] == "to pull" and layers["demo:user"]["state"] == "to pull"
    assert layers["demo:deepep"]["state"] == "available"  # not needed: nothing above it builds
    again = efabuild(demo_ws, "make", "demo", check=True)
    assert outcomes(again) == {"demo:efa": "pulled", "demo:deepep": "reused", "demo:user": "pulled"}
    assert tag_exists(f"efabuild/user:{keys['demo:user']}")
    sqsh = Path(efabuild(demo_ws, "lookup", "demo:user", check=True).stdout.strip())
    assert sqsh.is_file()
    # built by the other machine's engine, which this one cannot name: its manifest names no builder
    from efabuild import __version__

    assert json.loads(sqsh.with_suffix(".manifest.json").read_text())["builder"] == {"efabuild": __version__}


def test_push_sends_layers_built_before_the_registry_was_set(demo_ws, local_registry):
    efabuild(demo_ws, "make", "demo", check=True)
    with (demo_ws / "BUILD.toml").open("a") as f:
        f.write(f'[registry]\nurl = "{local_registry}"\n')
    document = json.loads(efabuild(demo_ws, "push", "demo", "--json", check=True).stdout)
    check_convention(document, ("push",))
    assert document["format"] == "efabuild.push/v1"
    pushed = document["layers"]
    assert {r["name"] for r in pushed} == {"demo:efa", "demo:deepep", "demo:user"}
    for row in pushed:
        layer = row["name"].split(":")[1]
        assert row["pushed"].startswith(f"{local_registry}/efabuild/{layer}@sha256:"), row
    # another machine: no local images, an empty store; the registry has what push sent
    _remove_images_of(demo_ws)
    shutil.rmtree(demo_ws / "cache")
    layers = plan(demo_ws)
    assert layers["demo:efa"]["state"] == "to pull" and layers["demo:user"]["state"] == "to pull"
    missing = efabuild(demo_ws, "push", "demo")
    assert missing.returncode == 1 and "not built" in missing.stdout
    assert missing.stderr.strip() == "efabuild: not pushed (not built): demo:efa, demo:deepep, demo:user"


def test_gc_images_removes_the_old_images_this_workspace_built_and_nothing_else(demo_ws):
    efabuild(demo_ws, "make", "demo", check=True)
    old = {n: l["key"] for n, l in plan(demo_ws).items()}
    graph = demo_ws / "graphs" / "demo.toml"
    graph.write_text(graph.read_text().replace('EFA_INSTALLER_VERSION = "1.50.0"', 'EFA_INSTALLER_VERSION = "1.49.0"'))
    efabuild(demo_ws, "make", "demo", check=True)
    new = {n: l["key"] for n, l in plan(demo_ws).items()}
    old_tags = [f"efabuild/{n.split(':')[1]}:{old[n]}" for n in old]
    new_tags = [f"efabuild/{n.split(':')[1]}:{new[n]}" for n in new]
    foreign = f"efabuild/efa:{uuid.uuid4().hex * 2}"  # as another workspace on this engine would have
    subprocess.run(["docker", "tag", new_tags[0], foreign], check=True)
    try:
        dry = efabuild(demo_ws, "gc", "--images", check=True)
        assert sorted(line.split()[-1] for line in dry.stdout.splitlines() if " image " in line) == sorted(old_tags)
        assert all(tag_exists(tag) for tag in old_tags)  # a dry run removes nothing
        efabuild(demo_ws, "gc", "--images", "--yes", check=True)
        assert not any(tag_exists(tag) for tag in old_tags)
        assert all(tag_exists(tag) for tag in new_tags) and tag_exists(foreign) and tag_exists(MINI_NGC_TAG)
        assert efabuild(demo_ws, "lookup", "demo:user", check=True).stdout.strip()  # artifacts untouched
    finally:
        subprocess.run(["docker", "image", "rm", foreign], capture_output=True)


def test_images_carry_the_workspaces_git_state_and_their_own_title(demo_ws):
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(demo_ws), "-c", "user.name=t", "-c", "user.email=t@example.com",
                               *args], capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    git("remote", "add", "origin", "https://builder:s3cr3t-token@git.example.com/team/training.git")
    (demo_ws / ".gitignore").write_text("cache/\n")
    git("add", "-A")
    git("commit", "-qm", "training images")
    head = git("rev-parse", "HEAD")
    efabuild(demo_ws, "make", "demo", check=True)
    key = plan(demo_ws)["demo:user"]["key"]
    labels = json.loads(subprocess.run(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}",
                                        f"efabuild/user:{key}"], capture_output=True, text=True,
                                       check=True).stdout)
    assert labels["org.opencontainers.image.revision"] == head
    assert labels["org.opencontainers.image.source"] == "https://git.example.com/team/training.git"
    assert labels["org.opencontainers.image.title"] == "demo:user"  # not the base's
    # a later commit that changes no input: the stored artifact still checks out identical
    (demo_ws / "NOTES.md").write_text("unrelated\n")
    git("add", "-A")
    git("commit", "-qm", "notes")
    checked = efabuild(demo_ws, "make", "--check", "demo:user")
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_remote_builder_builds_on_the_other_engine(demo_ws, second_engine):
    from efabuild.engine.client import connect
    from efabuild.settings import BuilderSettings

    build_fixtures(engine=connect(BuilderSettings(host=second_engine)))
    proc = efabuild(demo_ws, "make", "--builder", second_engine, "demo:efa")
    assert proc.returncode == 0, proc.stderr
    key = plan(demo_ws, "--builder", second_engine, "demo:efa")["demo:efa"]["key"]
    there = subprocess.run(["docker", "--host", second_engine, "image", "inspect", f"efabuild/efa:{key}"],
                           capture_output=True)
    assert there.returncode == 0
    assert not tag_exists(f"efabuild/efa:{key}")
    subprocess.run(["docker", "--host", second_engine, "image", "rm", f"efabuild/efa:{key}"], capture_output=True)


def test_no_engine_is_one_line_saying_where_and_how(demo_ws):
    proc = efabuild(demo_ws, "make", "demo", env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unix:///nonexistent/docker.sock" in lines[0] and "setup-host.sh" in lines[0]


def test_dry_run_builds_nothing(demo_ws):
    proc = efabuild(demo_ws, "make", "--dry-run", "demo")
    assert proc.returncode == 0 and "3 to build" in proc.stdout
    assert plan(demo_ws)["demo:efa"]["state"] == "to build"
    assert not (demo_ws / "cache" / "objects").exists()


def test_identical_layers_in_two_graphs_are_built_once_and_found_by_both_names(demo_ws):
    shutil.copy(demo_ws / "graphs" / "demo.toml", demo_ws / "graphs" / "twin.toml")
    proc = efabuild(demo_ws, "make", check=True)
    result = outcomes(proc)
    assert result["demo:efa"] == "built" and result["twin:efa"] == "reused"
    assert sum(status == "built" for status in result.values()) == 3
    assert efabuild(demo_ws, "lookup", "twin:user", check=True).stdout == \
        efabuild(demo_ws, "lookup", "demo:user", check=True).stdout


def test_a_layer_that_is_an_artifact_only_in_the_second_graph_still_gets_its_sqsh(demo_ws):
    """The artifact flag is no input of the key: demo:deepep (an image) and twin:deepep (an
    artifact) share a key, and the image built once is exported for the twin."""
    twin = (demo_ws / "graphs" / "demo.toml").read_text().replace('parent = "efa"\n', 'parent = "efa"\nartifact = true\n')
    (demo_ws / "graphs" / "twin.toml").write_text(twin)
    result = outcomes(efabuild(demo_ws, "make", check=True))
    assert result["demo:deepep"] == "built" and result["twin:deepep"] == "exported"
    assert sum(status == "built" for status in result.values()) == 3
    assert Path(efabuild(demo_ws, "lookup", "twin:deepep", check=True).stdout.strip()).is_file()
    assert {layer["state"] for layer in plan(demo_ws).values()} == {"available"}


@pytest.mark.s3
def test_make_publishes_to_every_tier_and_a_compute_node_fetches_by_name(demo_ws, tmp_path, moto_server, s3_bucket,
                                                                         s3_client):
    shared = tmp_path / "fsx"
    with (demo_ws / "BUILD.toml").open("a") as f:
        f.write(f'[store]\nshared = "{shared}"\n[store.s3]\nbucket = "{s3_bucket}"\nprefix = "images/"\n'
                f'endpoint_url = "{moto_server}"\n')
    efabuild(demo_ws, "make", "demo", check=True)
    listing = efabuild(demo_ws, "ls", "--json", check=True)
    tiers = {entry["name"]: sorted(entry["tiers"]) for entry in json.loads(listing.stdout)["artifacts"]}
    assert tiers["demo:user"] == tiers["demo:efa"] == ["local", "s3", "shared"]
    stored = [o["Key"] for o in s3_client.list_objects_v2(Bucket=s3_bucket, Prefix="images/")["Contents"]]
    assert sum(key.endswith(".chunks.json") for key in stored) == 2  # chunked: an index per artifact
    assert any("/chunks/" in key for key in stored)
    # each S3 index is the one kept beside the local and shared copies (S3's also notes its chunks'
    # ETags), and describes the stored .sqsh
    from efabuild.chunks.cdc import ChunkIndex, mismatch

    for key in (k for k in stored if k.endswith(".chunks.json")):
        kept = demo_ws / "cache" / "objects" / key.split("/")[-2] / key.split("/")[-1]
        sent = s3_client.get_object(Bucket=s3_bucket, Key=key)["Body"].read()
        assert kept.read_bytes() == (shared / "objects" / key.split("/")[-2] / key.split("/")[-1]).read_bytes()
        assert ChunkIndex.from_json(kept.read_bytes(), str(kept)) == ChunkIndex.from_json(sent, key)
        assert set(json.loads(sent)["etags"]) == set(ChunkIndex.from_json(sent, key).unique())
        assert mismatch(ChunkIndex.from_json(sent, key), Path(str(kept).replace(".chunks.json", ".sqsh"))) is None
    # a compute node: only the shared filesystem's refs and store.toml, no workspace, no objects yet
    shutil.rmtree(shared / "objects")
    node = subprocess.run([sys.executable, "-m", "efabuild", "lookup", "demo:user"], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "EFABUILD_STORE": str(shared)})
    assert node.returncode == 0, node.stderr
    path = Path(node.stdout.strip())
    assert path.is_relative_to(shared) and path.is_file()
    assert "/workspace/app/train.py" in unsquash_list(path)
    # the next lookup of the name is answered by the shared filesystem alone, even with S3 gone
    (shared / "store.toml").write_text((shared / "store.toml").read_text().replace(moto_server, "http://127.0.0.1:9"))
    again = subprocess.run([sys.executable, "-m", "efabuild", "lookup", "demo:user"], capture_output=True, text=True,
                           cwd=tmp_path, env={**os.environ, "EFABUILD_STORE": str(shared)})
    assert again.returncode == 0 and again.stdout == node.stdout, again.stderr
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    assert secret not in node.stderr + listing.stdout
    assert not any(secret in p.read_text(errors="ignore") for p in shared.rglob("*") if p.is_file()
                   and p.suffix != ".sqsh")


@pytest.mark.s3
def test_make_without_aws_credentials_publishes_to_the_other_tiers_and_names_s3_as_skipped(
        demo_ws, tmp_path, moto_server, s3_bucket, s3_client):
    shared = tmp_path / "fsx"
    with (demo_ws / "BUILD.toml").open("a") as f:
        f.write(f'[store]\nshared = "{shared}"\n[store.s3]\nbucket = "{s3_bucket}"\n'
                f'endpoint_url = "{moto_server}"\n')
    no_credentials = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}  # the rest of the chain: off
    proc = efabuild(demo_ws, "make", "demo", env=no_credentials)
    assert proc.returncode == 1, proc.stderr
    assert set(outcomes(proc).values()) == {"built"}
    assert proc.stdout.strip().splitlines()[-1] == (
        "3 built; s3 tier skipped: no AWS credentials (boto3's standard chain: environment, ~/.aws, "
        "instance or pod role)")
    assert proc.stderr.count("s3 tier skipped") == 1 and "Traceback" not in proc.stderr
    assert len(list(shared.glob("objects/*/*.sqsh"))) == 2  # both artifacts on the shared tier
    user = Path(efabuild(demo_ws, "lookup", "demo:user", env=no_credentials, check=True).stdout.strip())
    assert "/workspace/app/train.py" in unsquash_list(user)
    assert "Contents" not in s3_client.list_objects_v2(Bucket=s3_bucket)  # nothing half-sent to S3
    # with credentials, the next make copies the artifacts to S3 and builds nothing
    again = efabuild(demo_ws, "make", "demo", check=True)
    assert set(outcomes(again).values()) == {"reused"} and "skipped" not in again.stdout
    stored = [o["Key"] for o in s3_client.list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert sum(key.endswith(".chunks.json") for key in stored) == 2


@pytest.mark.s3
def test_a_damaged_local_artifact_is_not_spread_to_new_tiers_but_repaired(demo_ws, tmp_path, moto_server, s3_bucket,
                                                                          s3_client):
    from efabuild.host.digest import file_digest
    from tests.store.test_store_tiers import flip_a_byte

    efabuild(demo_ws, "make", "demo", check=True)
    user = Path(efabuild(demo_ws, "lookup", "demo:user", check=True).stdout.strip())
    good = file_digest(user)
    flip_a_byte(user)
    shared = tmp_path / "fsx"
    with (demo_ws / "BUILD.toml").open("a") as f:
        f.write(f'[store]\nshared = "{shared}"\n[store.s3]\nbucket = "{s3_bucket}"\n'
                f'endpoint_url = "{moto_server}"\n')
    proc = efabuild(demo_ws, "make", "demo", check=True)
    assert f"local tier: {user}: corrupt artifact: digest" in proc.stderr
    assert outcomes(proc)["demo:user"] == "exported"  # exported again: no good copy was anywhere
    # every tier now holds the good bytes, the damaged local copy included
    assert efabuild(demo_ws, "lookup", "--verify", "demo:user", check=True).stdout.strip().startswith(str(shared))
    assert file_digest(user) == good
    key = user.name.removesuffix(".sqsh")
    # S3 holds the good bytes: its chunks assemble into them (checked against the record as well)
    from efabuild.settings import S3Config
    from efabuild.store.tiers.s3 import S3Tier

    tier = S3Tier(S3Config(bucket=s3_bucket, endpoint_url=moto_server), show_progress=False)
    assert tier.chunk_index(key).digest == good
    fetched = tmp_path / "from-s3.sqsh"
    tier.download(key, fetched, tier.record(key))
    assert file_digest(fetched) == good


@pytest.mark.s3
def test_a_warm_make_repairs_a_poisoned_s3_chunk_and_a_truncated_shared_copy(demo_ws, tmp_path, moto_server,
                                                                           s3_bucket, s3_client):
    """A co-tenant overwrites a chunk of the artifact in the bucket with other bytes and cuts the
    shared tier's copy to half: the next make says so, repairs both from the local copy, and a
    node that holds nothing fetches the artifact again."""
    from efabuild.settings import S3Config
    from efabuild.host.digest import file_digest
    from efabuild.store.tiers.s3 import S3Tier
    from efabuild.store.chunked.s3 import compress

    shared = tmp_path / "fsx"
    with (demo_ws / "BUILD.toml").open("a") as f:
        f.write(f'[store]\nshared = "{shared}"\n[store.s3]\nbucket = "{s3_bucket}"\n'
                f'endpoint_url = "{moto_server}"\n')
    efabuild(demo_ws, "make", "demo", check=True)
    user = Path(efabuild(demo_ws, "lookup", "demo:user", check=True).stdout.strip())
    assert user.is_relative_to(shared)
    good, key = file_digest(user), user.name.removesuffix(".sqsh")
    tier = S3Tier(S3Config(bucket=s3_bucket, endpoint_url=moto_server), show_progress=False)
    cid, length = tier.chunk_index(key).chunks[0]
    s3_client.put_object(Bucket=s3_bucket, Key=tier.chunks.object(cid), Body=compress(os.urandom(length)))
    half = user.read_bytes()[: user.stat().st_size // 2]
    user.unlink()
    user.write_bytes(half)
    node = tmp_path / "node"
    node.mkdir()
    (node / "store.toml").write_text((shared / "store.toml").read_text())
    assert efabuild(demo_ws, "lookup", "--store", str(node), key).returncode == 1  # unfetchable

    proc = efabuild(demo_ws, "make", "demo", check=True)
    assert f"s3 tier: {key[:12]} (demo:user): chunk {cid}: " in proc.stderr
    assert f"shared tier: {user}: corrupt artifact: {len(half)} bytes" in proc.stderr
    assert outcomes(proc)["demo:user"] == "reused"  # copied from the local tier, not built or exported
    assert file_digest(user) == good
    fetched = Path(efabuild(demo_ws, "lookup", "--store", str(node), key, check=True).stdout.strip())
    assert file_digest(fetched) == good
    again = efabuild(demo_ws, "make", "demo", check=True)
    assert set(outcomes(again).values()) == {"reused"} and "warning" not in again.stderr


def test_built_context_files_are_normalised_like_the_key(demo_ws):
    """The key ignores umask and mtimes, so the image must too: one key, one image."""
    train = demo_ws / "app" / "train.py"
    train.write_text(f"print('{uuid.uuid4().hex}')\n")  # new content: BuildKit cannot reuse an older COPY
    os.chmod(train, 0o664)
    os.utime(train, (1_700_000_000, 1_700_000_000))
    efabuild(demo_ws, "make", "demo", check=True)
    user = Path(efabuild(demo_ws, "lookup", "demo:user", check=True).stdout.strip())
    line = next(l for l in unsquash_list(user).splitlines() if l.endswith("/workspace/app/train.py"))
    assert line.startswith("-rw-r--r-- root/root") and " 1980-01-01 " in line


def test_an_excluded_file_is_not_in_the_context_the_engine_sees(demo_ws):
    (demo_ws / "app" / ".dockerignore").write_text("**/__pycache__\n")
    with (demo_ws / "graphs" / "demo.toml").open("a") as f:
        f.write('exclude = ["app/*.local"]\n')  # the last table in the file is layers.user
    (demo_ws / "app" / "__pycache__").mkdir()
    (demo_ws / "app" / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\x00compiled")
    (demo_ws / "app" / "settings.local").write_text("mine\n")
    efabuild(demo_ws, "make", "demo", check=True)
    listing = unsquash_list(Path(efabuild(demo_ws, "lookup", "demo:user", check=True).stdout.strip()))
    assert "/workspace/app/train.py" in listing and "/workspace/app/.dockerignore" in listing
    assert "/workspace/app/__pycache__" not in listing and "settings.local" not in listing


def test_a_context_of_the_whole_workspace_leaves_out_the_store(demo_ws):
    graph = demo_ws / "graphs" / "demo.toml"
    graph.write_text(graph.read_text().replace('context = ["app"]', 'context = ["."]'))
    first = plan(demo_ws)["demo:user"]["key"]
    efabuild(demo_ws, "make", "demo", check=True)
    assert plan(demo_ws)["demo:user"]["key"] == first  # the store's own writes do not move the key
    again = efabuild(demo_ws, "make", "demo", check=True)
    assert set(outcomes(again).values()) == {"reused"}
    assert not list((demo_ws / "cache" / "tmp").glob("context-*"))


def test_offline_plan_after_a_make_sees_everything_available(demo_ws):
    efabuild(demo_ws, "make", "demo", check=True)
    online = plan(demo_ws)
    offline = json.loads(efabuild(demo_ws, "plan", "--offline", "--json", check=True).stdout)
    assert {l["name"]: l["key"] for l in offline["layers"]} == {n: l["key"] for n, l in online.items()}
    assert {l["state"] for l in offline["layers"]} == {"available"}
    assert offline["bases"][0]["source"] == "recorded"


@pytest.mark.s3
def test_a_compute_node_that_fetched_a_name_sees_the_next_build_of_it(demo_ws, tmp_path, moto_server, s3_bucket):
    with (demo_ws / "BUILD.toml").open("a") as f:
        f.write(f'[store.s3]\nbucket = "{s3_bucket}"\nendpoint_url = "{moto_server}"\n')
    efabuild(demo_ws, "make", "demo", check=True)
    node = tmp_path / "node-store"  # the node's own store: only where S3 is
    node.mkdir()
    shutil.copy(demo_ws / "cache" / "store.toml", node / "store.toml")
    env = {"EFABUILD_STORE": str(node)}

    def node_lookup() -> Path:
        found = subprocess.run([sys.executable, "-m", "efabuild", "lookup", "demo:user"], capture_output=True,
                               text=True, cwd=tmp_path, env={**os.environ, **env})
        assert found.returncode == 0, found.stderr
        return Path(found.stdout.strip())

    first = node_lookup()
    (demo_ws / "app" / "train.py").write_text(f"print('{uuid.uuid4().hex}')\n")
    efabuild(demo_ws, "make", "demo", check=True)
    second = node_lookup()
    assert second != first and second.is_relative_to(node)
    assert second.name.startswith(plan(demo_ws)["demo:user"]["key"])


def test_artifacts_record_their_enroot_format_and_older_ones_are_kept(mini_ngc, tmp_path):
    """Same key → same bytes holds within one Enroot format: the format is recorded, and an artifact
    stored before it was (or under another one) is kept, not exported again."""
    graph = f'''[layers.one]\nbase = "{mini_ngc}"\nartifact = true\ndockerfile = "RUN echo {uuid.uuid4().hex} > /id"\n'''
    root = make_workspace(tmp_path / "ws", {"fmt": graph})
    try:
        first = efabuild(root, "make", "--json")
        assert first.returncode == 0, first.stderr
        sqsh = Path(efabuild(root, "lookup", "fmt:one").stdout.strip())
        record_path, manifest_path = sqsh.with_suffix(".json"), sqsh.with_suffix(".manifest.json")
        record = json.loads(record_path.read_text())
        assert record["export"]["enroot_format"] == "4.1.2"
        assert json.loads(manifest_path.read_text())["artifact"]["export"]["enroot_format"] == "4.1.2"
        # an artifact from before formats were recorded: kept as it is by the next make
        del record["export"]["enroot_format"]
        record_path.chmod(0o644)
        record_path.write_text(json.dumps(record, sort_keys=True, indent=1) + "\n")
        before = (sqsh.stat().st_ino, sqsh.stat().st_mtime_ns, record_path.read_text())
        again = efabuild(root, "make", "--json")
        assert again.returncode == 0, again.stderr
        [reused] = json.loads(again.stdout)["layers"]
        assert reused["status"] == "reused" and reused["path"] == str(sqsh)  # its path, though not new
        assert (sqsh.stat().st_ino, sqsh.stat().st_mtime_ns, record_path.read_text()) == before
    finally:
        _remove_images_of(root)


def test_make_signs_every_artifact_it_exports_and_a_reusing_make_adds_nothing(demo_ws, tmp_path):
    from efabuild.signing import dsse

    keys = tmp_path / "keys"
    keys.mkdir()
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(keys / "release.pem")], check=True)
    subprocess.run(["openssl", "pkey", "-in", str(keys / "release.pem"), "-pubout", "-out", str(keys / "release.pub")],
                   check=True)
    shared = tmp_path / "shared"
    (demo_ws / "BUILD.toml").write_text((demo_ws / "BUILD.toml").read_text() + (
        f'[store]\nshared = "{shared}"\n[sign]\nkey = "{keys / "release.pem"}"\n'
        f'[trust]\nkeys = ["{keys / "release.pub"}"]\n'))
    first = efabuild(demo_ws, "make", "demo")
    assert first.returncode == 0, first.stderr
    # the ancestor it just signed is one a signed child may be written from
    assert "demo:user: export: incremental from" in first.stdout + first.stderr, first.stderr
    envelopes = {tier: sorted((root / "objects").rglob("*.intoto.jsonl")) for tier, root in
                 (("local", demo_ws / "cache"), ("shared", shared))}
    assert len(envelopes["local"]) == len(envelopes["shared"]) == 2  # demo:efa and demo:user
    verified = efabuild(demo_ws, "verify", "--all", "--sha256")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.count("ok ") == 4  # two artifacts on two tiers
    before = {path: path.read_bytes() for paths in envelopes.values() for path in paths}
    assert all(len(dsse.decode(data).signatures) == 1 for data in before.values())
    # the private key is in no output, log or stored file
    secret = b"".join((keys / "release.pem").read_bytes().splitlines()[1:-1])
    assert secret.decode() not in first.stdout + first.stderr
    for path in [*(demo_ws / "cache").rglob("*"), *shared.rglob("*")]:
        if path.is_file() and not path.name.endswith(".sqsh"):
            assert secret not in path.read_bytes(), path
    (keys / "release.pem").unlink()  # a make with nothing to export never needs the key
    second = efabuild(demo_ws, "make", "demo")
    assert second.returncode == 0, second.stderr
    assert {path: path.read_bytes() for path in before} == before
    assert efabuild(demo_ws, "lookup", "--require-signature", "demo:user",
                    env={"EFABUILD_VERIFY_CACHE": str(cache_dir(tmp_path / "verified"))}).returncode == 0


def test_a_new_tier_gets_a_copy_of_a_stored_artifact_without_its_image(mini_ngc, tmp_path):
    """The plan says `to copy` (not `to export`, not `to build`) when a tier holds the .sqsh and
    another lacks it, and make copies it across even with the image gone from the engine."""
    from efabuild.host.digest import file_digest

    graph = f'''[layers.one]\nbase = "{mini_ngc}"\nartifact = true\ndockerfile = "RUN echo {uuid.uuid4().hex} > /id"\n'''
    root = make_workspace(tmp_path / "ws", {"fmt": graph})
    try:
        efabuild(root, "make", check=True)
        key = plan(root)["fmt:one"]["key"]
        subprocess.run(["docker", "image", "rm", f"efabuild/one:{key}"], check=True, capture_output=True)
        (root / "BUILD.toml").write_text((root / "BUILD.toml").read_text()
                                         + f'[store]\nlocal = "cache"\nshared = "{tmp_path / "fsx"}"\n')
        layer = plan(root)["fmt:one"]
        assert layer["state"] == "to copy" and layer["reasons"] == ["the .sqsh is in another store tier"]
        done = efabuild(root, "make", "--json")
        assert done.returncode == 0, done.stderr
        [one] = json.loads(done.stdout)["layers"]
        assert one["status"] == "reused" and one["steps"] == ["copy between tiers"]
        assert not tag_exists(f"efabuild/one:{key}")  # nothing was built
        shared = tmp_path / "fsx" / "objects" / key[:2] / f"{key}.sqsh"
        assert shared.is_file() and file_digest(shared) == file_digest(Path(one["path"]))
    finally:
        _remove_images_of(root)
