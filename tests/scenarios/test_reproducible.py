"""Same key, same bytes: the demo graph built on two engines, at different times, with cold build
caches, gives byte-identical .sqsh artifacts. Both engines take the fixture base from a loopback
registry, so they build on the same base digest (a fixture built on each engine would have another
image ID, hence other keys)."""

from __future__ import annotations

import calendar
import importlib.util
import json
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.kits.wsfactory import demo_on_base

# the same layers built on two engines, compared byte for byte
pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(600)]


def docker(host: str | None, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    command = ["docker", *(["--host", host] if host else []), *args]
    return subprocess.run(command, capture_output=True, text=True, check=check)


def efabuild(root: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "efabuild", "-C", str(root), *args], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc


@pytest.fixture(scope="module")
def registry_base(pinned_fixture_base, second_engine) -> str:
    """The fixture base from the loopback registry, pulled from there by both engines."""
    for host in (None, second_engine):
        docker(host, "image", "pull", pinned_fixture_base)
    return pinned_fixture_base


def demo_workspace(root: Path, base: str, run_id: str) -> Path:
    """The shipped demo graph on the registry base, with a run-unique ARG the first RUN sees, so
    BuildKit's cache has none of its steps on either engine."""
    ref, digest = base.split("@")
    return demo_on_base(root, f"{ref}:26.08-py3", digest, run_id, '[workspace]\ngraphs = ["graphs/*.toml"]\n')


def _keys(root: Path, *builder: str) -> dict[str, str]:
    data = json.loads(efabuild(root, "plan", "--json", *builder).stdout)
    return {layer["name"]: layer["key"] for layer in data["layers"]}


def _listing(sqsh: Path) -> dict[str, list[str]]:
    """path → [mode, owner, size, date, time (to the second), …] as unsquashfs lists it."""
    out = subprocess.run(["unsquashfs", "-lln", "-full-precision", "-UTC", "-d", "", str(sqsh)],
                         capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines():
        cols = line.split()
        if len(cols) >= 6 and cols[0][0] in "-dlcbps":
            rows[cols[5]] = cols
    return rows


def _cat(sqsh: Path, path: str) -> bytes:
    return subprocess.run(["unsquashfs", "-cat", str(sqsh), path], capture_output=True, check=True).stdout


def _epoch(cols: list[str]) -> int:
    return calendar.timegm(time.strptime(f"{cols[3]} {cols[4]}", "%Y-%m-%d %H:%M:%S"))


def test_same_key_gives_the_same_sqsh_on_two_engines(registry_base, second_engine, tmp_path):
    from efabuild.engine.client import connect
    from efabuild.settings import BuilderSettings, ExportSettings
    from efabuild.export.squash import export_image

    # the same base on both engines: same registry digest, same image ID
    seen = [docker(host, "image", "inspect", "--format", "{{.Id}} {{json .RepoDigests}}", registry_base)
            .stdout.strip().split(" ", 1) for host in (None, second_engine)]
    assert seen[0][0] == seen[1][0]
    assert all(registry_base in json.loads(repo_digests) for _, repo_digests in seen)

    run_id = uuid.uuid4().hex[:12]
    here, there = (demo_workspace(tmp_path / "here", registry_base, run_id),
                   demo_workspace(tmp_path / "there", registry_base, run_id))
    keys = _keys(here)
    assert _keys(there, "--builder", second_engine) == keys
    first_started = time.time()
    efabuild(here, "make", "demo")
    time.sleep(max(0.0, first_started + 2.5 - time.time()))
    efabuild(there, "make", "--builder", second_engine, "demo")
    try:
        # without the clamp, the same images export to different bytes: the build's own times
        loose = [export_image(f"efabuild/user:{keys['demo:user']}", tmp_path / f"loose-{n}.sqsh",
                              options=ExportSettings(clamp_times=False), engine=connect(BuilderSettings(host=host)))
                 for n, host in enumerate((None, second_engine))]
        assert loose[0].digest != loose[1].digest and loose[0].time_clamp is None
        listed = [_listing(result.path) for result in loose]
        assert {p: c[:3] for p, c in listed[0].items()} == {p: c[:3] for p, c in listed[1].items()}
        assert any(listed[0][p][3:5] != listed[1][p][3:5] for p in listed[0])

        # with it (the default), every artifact key is byte-identical across engines and times
        for layer in ("demo:efa", "demo:user"):
            mine = Path(efabuild(here, "lookup", layer).stdout.strip())
            theirs = Path(efabuild(there, "lookup", layer).stdout.strip())
            assert mine.name == theirs.name == f"{keys[layer]}.sqsh"
            assert mine.read_bytes() == theirs.read_bytes(), f"{layer}: the .sqsh differs between engines"
            record = json.loads(mine.with_suffix(".json").read_text())
            assert record["export"]["time_clamp"] >= 315532800

        user = Path(efabuild(here, "lookup", "demo:user").stdout.strip())
        files = _listing(user)
        clamp = json.loads(user.with_suffix(".json").read_text())["export"]["time_clamp"]
        assert max(_epoch(cols) for cols in files.values()) <= clamp
        # the build's .pyc (pip compiles with SOURCE_DATE_EPOCH declared): hash-checked, valid
        site = "/usr/local/lib/python3.12/dist-packages/deep_ep"
        pyc = _cat(user, f"{site}/__pycache__/buffer.cpython-311.pyc")
        flags, = struct.unpack("<I", pyc[4:8])
        assert flags == 0b11  # checked hash
        assert pyc[8:16] == importlib.util.source_hash(_cat(user, f"{site}/buffer.py"))
        # the base's timestamp-checked .pyc keeps matching its source's time and size
        std = "/usr/lib/python3.11"
        pyc = _cat(user, f"{std}/__pycache__/compileall.cpython-311.pyc")
        flags, mtime, size = struct.unpack("<III", pyc[4:16])
        assert flags == 0 and mtime == _epoch(files[f"{std}/compileall.py"])
        assert size == int(files[f"{std}/compileall.py"][2])
    finally:
        for host in (None, second_engine):
            tags = [f"efabuild/{layer.split(':')[1]}:{key}" for layer, key in keys.items()]
            docker(host, "image", "rm", "--force", *tags, check=False)


ONE_LAYER = """
[layers.tools]
base = "{base}"
digest = "{digest}"
dockerfile = '''
ARG TEST_RUN
COPY app/ /opt/app/
RUN echo "$TEST_RUN" > /opt/app/run
'''
args = {{ TEST_RUN = "{run}" }}
context = ["app"]
artifact = true
"""


def test_same_key_gives_the_same_sqsh_from_two_commits_and_a_renamed_copy_without_git(pinned_fixture_base, tmp_path):
    """The git commit and remote are labels of the engine's image and fields of the manifest, never
    bytes of the .sqsh: two CI runners on different commits publish one file under one key. So are
    the layer's graph and name, which the key does not hold either."""
    ref, digest = pinned_fixture_base.split("@")
    ws = tmp_path / "ws"
    (ws / "graphs").mkdir(parents=True)
    (ws / "app").mkdir()
    (ws / "app" / "main.py").write_text("print('train')\n")
    (ws / "graphs" / "g.toml").write_text(ONE_LAYER.format(base=f"{ref}:26.08-py3", digest=digest,
                                                           run=uuid.uuid4().hex))
    (ws / "BUILD.toml").write_text('[workspace]\ngraphs = ["graphs/*.toml"]\n')
    (ws / ".gitignore").write_text("cache/\n")

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ws), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    git("remote", "add", "origin", "https://git.example.com/team/training.git")
    git("add", "-A")
    git("commit", "-qm", "one")
    [key] = _keys(ws).values()
    built: list[tuple[bytes, dict, dict]] = []  # (.sqsh bytes, manifest, image labels) of each build
    shown: list[tuple[str, dict]] = []  # what show and show --intoto print of each
    statuses: list[str] = []

    def build(root: Path, name: str = "g:tools", keep_image: bool = False) -> None:
        tag = f"efabuild/{name.split(':')[1]}:{key}"
        statuses.append(json.loads(efabuild(root, "make", "--json", name).stdout)["layers"][0]["status"])
        labels = json.loads(docker(None, "image", "inspect", "--format", "{{json .Config.Labels}}", tag).stdout)
        sqsh = Path(efabuild(root, "lookup", name).stdout.strip())
        built.append((sqsh.read_bytes(), json.loads(sqsh.with_suffix(".manifest.json").read_text()), labels))
        shown.append((efabuild(root, "show", name).stdout,
                      json.loads(efabuild(root, "show", "--intoto", name).stdout)))
        # the next make builds the key again (labels and all), or only exports it, into a store of its own
        if not keep_image:
            docker(None, "image", "rm", tag)
        subprocess.run(["rm", "-rf", str(root / "cache")], check=True)

    try:
        build(ws, keep_image=True)
        first = git("rev-parse", "HEAD")
        (ws / "NOTES.md").write_text("no input of the layer\n")
        git("add", "-A")
        git("commit", "-qm", "two")
        second = git("rev-parse", "HEAD")
        build(ws)  # exported from the image built at the first commit
        build(ws)
        copy = tmp_path / "copy"
        subprocess.run(["cp", "-a", str(ws), str(copy)], check=True)
        subprocess.run(["rm", "-rf", str(copy / ".git")], check=True)
        # and under another graph and layer name: the same inputs, so the same key
        (copy / "graphs" / "g.toml").rename(copy / "graphs" / "other.toml")
        graph = copy / "graphs" / "other.toml"
        graph.write_text(graph.read_text().replace("[layers.tools]", "[layers.kit]"))
        assert _keys(copy) == {"other:kit": key}
        build(copy, "other:kit")
    finally:
        docker(None, "image", "rm", "--force", f"efabuild/tools:{key}", f"efabuild/kit:{key}", check=False)

    assert statuses == ["built", "exported", "built", "built"]
    assert len({b[0] for b in built}) == 1, "the same key gave different .sqsh bytes"
    # the commit is on each image and in each manifest, which is what show and the statement read:
    # the image's own, where an export from an image built before was made at a later commit
    assert [b[2]["org.opencontainers.image.revision"] for b in built] == [first, first, second, ""]
    assert [b[1].get("vcs") for b in built] == [
        {"revision": commit, "source": "https://git.example.com/team/training.git"}
        for commit in (first, first, second)] + [None]
    assert not any(b"org.opencontainers.image" in line for line in _cat_rc(built[0][0], tmp_path))
    rows = [next(line for line in text.splitlines() if line.startswith("revision")) for text, _ in shown]
    assert rows[0].split()[1:] == [first, "https://git.example.com/team/training.git"]
    assert rows[3].split()[1] == "-"
    workspace = [[d for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]
                  if d["name"] == "workspace"] for _, statement in shown]
    assert workspace[:3] == [[{"name": "workspace", "uri": "git+https://git.example.com/team/training.git",
                               "digest": {"gitCommit": commit}}] for commit in (first, first, second)]
    assert workspace[3] == []


def _cat_rc(sqsh: bytes, tmp_path: Path) -> list[bytes]:
    path = tmp_path / "rc-of.sqsh"
    path.write_bytes(sqsh)
    return _cat(path, "/etc/rc").splitlines()
