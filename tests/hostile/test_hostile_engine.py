"""A shared engine: whoever can reach it can tag any image with efabuild's names. push must not send
an image under a layer's key unless efabuild built it for that key."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from efabuild.engine.client import connect
from efabuild.engine.registry import has
from efabuild.settings import BuilderSettings, RegistrySettings
from tests.kits.storekit import efabuild

pytestmark = pytest.mark.engine

GRAPH = """\
[layers.one]
base = "{base}"
dockerfile = '''
RUN echo {run} > /run-id
'''
artifact = true
ignore = [{{ rule = "EFA010", reason = "a local test image" }}]
"""


def one_layer_workspace(tmp_path: Path, base: str, build: str = "", graph: str | None = None) -> Path:
    """A workspace of one artifact layer, g:one, whose build is new to the engine (a fresh run id)."""
    root = tmp_path / "ws"
    (root / "graphs").mkdir(parents=True)
    (root / "BUILD.toml").write_text('[workspace]\ngraphs = ["graphs/*.toml"]\n' + build)
    (root / "graphs" / "g.toml").write_text(graph or GRAPH.format(base=base, run=uuid.uuid4().hex))
    return root


def planned_key(root: Path) -> str:
    return json.loads(efabuild("-C", str(root), "plan", "--json", check=True).stdout)["layers"][0]["key"]


def test_push_refuses_an_image_another_tenant_tagged_with_a_layer_s_name(tmp_path, busybox_image, local_registry):
    root = one_layer_workspace(tmp_path, busybox_image, build=f'[registry]\nurl = "{local_registry}"\n')
    key = planned_key(root)
    planted = f"efabuild/one:{key}"
    subprocess.run(["docker", "image", "tag", busybox_image, planted], check=True)  # not this layer's build
    try:
        refused = efabuild("-C", str(root), "push", "--json")
        assert refused.returncode == 1, refused.stderr
        [row] = json.loads(refused.stdout)["layers"]
        assert row["pushed"] is None and "org.efabuild.key" in row["problem"]
        assert refused.stderr.strip() == "efabuild: not pushed (an image not built for its key): g:one"
        engine = connect(BuilderSettings())
        assert not has(engine, planted, RegistrySettings(url=local_registry))
        # the layer made by efabuild under the same name is pushed
        subprocess.run(["docker", "image", "rm", planted], capture_output=True, check=True)
        efabuild("-C", str(root), "make", "--no-lint", check=True)
        done = json.loads(efabuild("-C", str(root), "push", "--json", check=True).stdout)["layers"]
        assert done[0]["pushed"].startswith(f"{local_registry}/efabuild/one@sha256:")
        # the image found for the key is another layer's of the same inputs (sorted first), and
        # the name push sends from is planted: what goes is the found image, under the layer's name
        built = image_id(planted)
        subprocess.run(["docker", "image", "tag", planted, f"efabuild/alpha:{key}"], check=True)
        subprocess.run(["docker", "image", "tag", busybox_image, planted], check=True)
        assert efabuild("-C", str(root), "push", "g:one").returncode == 0
        assert image_id(planted) == built
    finally:
        subprocess.run(["docker", "image", "rm", planted, f"efabuild/alpha:{key}"], capture_output=True)


def image_id(ref: str) -> str:
    return subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True,
                          text=True, check=True).stdout.strip()


def test_make_never_exports_an_image_another_tenant_tagged_with_a_layer_s_name(tmp_path, busybox_image):
    """The plan sees the tag and says `to export`: the planted image must not become the layer's
    .sqsh in the store, where every job looking the layer up would run it."""
    root = one_layer_workspace(tmp_path, busybox_image)
    layer = json.loads(efabuild("-C", str(root), "plan", "--json", check=True).stdout)["layers"][0]
    planted = f"efabuild/one:{layer['key']}"
    subprocess.run(["docker", "image", "tag", busybox_image, planted], check=True)
    try:
        assert json.loads(efabuild("-C", str(root), "plan", "--json", check=True).stdout)["layers"][0]["state"] \
            == "to export"
        made = efabuild("-C", str(root), "make", "--no-lint")
        assert made.returncode == 1
        assert f"the engine's {planted} does not carry key {layer['key'][:12]}" in made.stderr
        assert efabuild("-C", str(root), "lookup", "g:one").returncode == 1
        assert not list((root / "cache").rglob("*.sqsh"))
    finally:
        subprocess.run(["docker", "image", "rm", planted], capture_output=True)


def test_make_never_writes_a_build_log_into_a_directory_linked_from_the_logs(tmp_path, busybox_image):
    """logs/ sits in the local store, which may be on a shared path: a co-tenant who replaces a
    layer's log directory with a link (the layer's name and key are what `plan` prints) must not
    make a make, run as root, delete or create files in the directory it points at."""
    root = one_layer_workspace(tmp_path, busybox_image)
    key = planned_key(root)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / f"{key}.log").write_text("a file of the directory's owner\n")
    (root / "cache" / "logs" / "g").mkdir(parents=True)
    (root / "cache" / "logs" / "g" / "one").symlink_to(victim)
    try:
        made = efabuild("-C", str(root), "make", "--no-lint")
        assert made.returncode == 1
        assert f"{root}/cache/logs/g/one: a symbolic link, not a directory" in made.stderr
        assert (victim / f"{key}.log").read_text() == "a file of the directory's owner\n"
        assert sorted(p.name for p in victim.iterdir()) == [f"{key}.log"]
    finally:
        subprocess.run(["docker", "image", "rm", f"efabuild/one:{key}"], capture_output=True)


def _stopped(pid: int) -> bool:
    stat = open(f"/proc/{pid}/stat").read()
    return stat[stat.rfind(")") + 2] == "T"


def test_a_push_killed_mid_way_leaves_no_name_that_keeps_an_old_image_alive(tmp_path, busybox_image, local_registry):
    """push names the image REGISTRY/efabuild/<layer>:<key> in the engine for `docker push`, and
    removes the name after. Killed in between, the name stays: once the key is old, `gc --images`
    must remove it with the layer's own name, or the image it said it removed stays on the disk."""
    import os
    import signal
    import sys
    import time

    root = one_layer_workspace(tmp_path, busybox_image)
    graph = root / "graphs" / "g.toml"
    efabuild("-C", str(root), "make", "--no-lint", check=True)
    key = planned_key(root)
    image = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", f"efabuild/one:{key}"],
                           capture_output=True, text=True, check=True).stdout.strip()
    alias = f"{local_registry}/efabuild/one:{key}"
    with (root / "BUILD.toml").open("a") as f:
        f.write(f'[registry]\nurl = "{local_registry}"\n')
    proc = subprocess.Popen([sys.executable, "-m", "efabuild", "-C", str(root), "push"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "EFABUILD_STOP_AT": "push"})
    try:
        deadline = time.monotonic() + 60
        while not _stopped(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _stopped(proc.pid), "push never reached its push step"
        proc.kill()
        proc.wait()
        assert subprocess.run(["docker", "image", "inspect", alias], capture_output=True).returncode == 0
        graph.write_text(GRAPH.format(base=busybox_image, run=uuid.uuid4().hex))  # the key is old now
        efabuild("-C", str(root), "make", "--no-lint", check=True)
        efabuild("-C", str(root), "gc", "--images", "--yes", check=True)
        for name in (alias, f"efabuild/one:{key}", image):
            assert subprocess.run(["docker", "image", "inspect", name], capture_output=True).returncode != 0, name
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run(["docker", "image", "rm", alias, f"efabuild/one:{key}"], capture_output=True)
        new = json.loads(efabuild("-C", str(root), "plan", "--json").stdout or '{"layers": []}')["layers"]
        subprocess.run(["docker", "image", "rm", *[f"efabuild/one:{l['key']}" for l in new]], capture_output=True)


def test_make_never_writes_a_build_context_into_a_tmp_directory_replaced_by_a_link(tmp_path, busybox_image):
    """The store's tmp/ holds each build's context while it builds: a co-tenant who replaces it
    with a link must not have a make, run as root, create directories and copy the workspace's
    files into the directory it points at."""
    root = one_layer_workspace(tmp_path, busybox_image)
    key = planned_key(root)
    victim = tmp_path / "victim"
    victim.mkdir()
    (root / "cache").mkdir()
    (root / "cache" / "tmp").symlink_to(victim)
    try:
        made = efabuild("-C", str(root), "make", "--no-lint")
        assert made.returncode == 1
        assert f"{root}/cache/tmp: a symbolic link, not a directory" in made.stderr
        assert list(victim.iterdir()) == []
    finally:
        subprocess.run(["docker", "image", "rm", f"efabuild/one:{key}"], capture_output=True)


def test_a_push_killed_outright_takes_its_docker_push_with_it(tmp_path, busybox_image, local_registry):
    """A `docker image push` of gigabytes must not run on after `scancel` or the OOM killer took
    efabuild: every program it starts dies with it (the promise of docs/guides/building.md)."""
    import os
    import signal
    import sys
    import time

    pushing = None
    # 64 MB that compress to nothing less: a push long enough to be killed in
    graph = GRAPH.format(base=busybox_image, run=uuid.uuid4().hex).replace(
        "RUN echo", "RUN head -c 64000000 /dev/urandom > /big && echo")
    root = one_layer_workspace(tmp_path, busybox_image, graph=graph)
    efabuild("-C", str(root), "make", "--no-lint", check=True)
    key = planned_key(root)
    with (root / "BUILD.toml").open("a") as f:
        f.write(f'[registry]\nurl = "{local_registry}"\n')
    proc = subprocess.Popen([sys.executable, "-m", "efabuild", "-C", str(root), "push"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=os.environ.copy())
    try:
        deadline = time.monotonic() + 60
        while pushing is None and proc.poll() is None and time.monotonic() < deadline:
            found = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "docker .*push"], capture_output=True, text=True)
            pushing = int(found.stdout.split()[0]) if found.stdout.split() else None
            time.sleep(0.02)
        assert pushing is not None, "never saw the docker push"
        os.kill(pushing, signal.SIGSTOP)  # held mid-push, however fast the loopback registry is
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{pushing}") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not os.path.exists(f"/proc/{pushing}"), "docker push runs on after efabuild was killed"
    finally:
        if proc.poll() is None:
            proc.kill()
        if pushing is not None and os.path.exists(f"/proc/{pushing}"):
            os.kill(pushing, signal.SIGKILL)
        subprocess.run(["docker", "image", "rm", f"efabuild/one:{key}", f"{local_registry}/efabuild/one:{key}"],
                       capture_output=True)
