"""`efabuild make --check`: rebuild a stored layer without the build cache and compare, on the real
engine with the offline fixture base (pinned by digest in the loopback registry)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from efabuild.export.sqshdiff import FileFacts, compare
from tests.kits.wsfactory import TOOLS_LAYER

# make --check rebuilds without the cache
pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(600)]

GRAPH = TOOLS_LAYER + """
[layers.stamp]
parent = "tools"
dockerfile = '''
RUN mkdir -p /opt/stamp && echo 'X = 1' > /opt/stamp/mod.py \\
 && python3 -c 'import sys; sys.path.insert(0, "/opt/stamp"); import mod' \\
 && date > /stamp
'''
artifact = true
"""


def workspace(root: Path, base: str) -> Path:
    """Two layers on the pinned fixture base; a run-unique ARG keeps BuildKit's cache cold."""
    ref, digest = base.split("@")
    (root / "graphs").mkdir(parents=True)
    (root / "graphs" / "g.toml").write_text(GRAPH.format(base=f"{ref}:26.08-py3", digest=digest, run=uuid.uuid4().hex))
    (root / "BUILD.toml").write_text('[workspace]\ngraphs = ["graphs/*.toml"]\n')
    return root


def efabuild(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "efabuild", "-C", str(root), *args], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL)


def test_compare_names_each_kind_of_difference():
    f = FileFacts("file", 0o644, "0/0", 100, 3, "aa")
    stored = {"/a": f, "/b": f, "/c": f, "/gone": f, "/l": FileFacts("symlink", 0o777, "0/0", 1, 0, "x")}
    rebuilt = {"/a": FileFacts("file", 0o644, "0/0", 100, 3, "bb"), "/b": FileFacts("file", 0o755, "0/0", 100, 3, "aa"),
               "/c": FileFacts("file", 0o644, "1/1", 200, 3, "aa"), "/new": f,
               "/l": FileFacts("symlink", 0o777, "0/0", 1, 0, "y")}
    got = [(d.path, d.kind) for d in compare(stored, rebuilt)]
    assert got == [("/a", "content"), ("/b", "mode"), ("/c", "owner"), ("/c", "time"), ("/gone", "removed"),
                   ("/l", "content"), ("/new", "added")]
    assert compare(stored, dict(stored)) == []


def _stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2] == "T"


def _export_containers_into(directory: Path) -> list[str]:
    listed = subprocess.run(["docker", "container", "ls", "--all", "--filter", "label=org.efabuild.export",
                             "--format", '{{.Names}}\t{{.Label "org.efabuild.export"}}'],
                            capture_output=True, text=True, check=True).stdout
    return [line.split("\t")[0] for line in listed.splitlines() if f"\t{directory}/" in line]


def _check_images(layer: str, key: str) -> list[str]:
    """Tags of make --check's rebuilds of `key` in the engine."""
    listed = subprocess.run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}",
                             f"efabuild-check/{layer}"], capture_output=True, text=True, check=True).stdout.split()
    return [tag for tag in listed if tag.split(":")[1].startswith(key[:12] + "-")]


def _killed_at_export(root: Path, layer: str) -> tuple[subprocess.Popen, list[Path]]:
    """A make --check stopped where its export begins, then killed -9; what it left in cache/tmp/."""
    killed = subprocess.Popen([sys.executable, "-m", "efabuild", "-C", str(root), "make", "--check", layer],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                              env={**os.environ, "EFABUILD_STOP_AT": "export"})
    deadline = time.monotonic() + 300
    while killed.poll() is None and not _stopped(killed.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert killed.poll() is None and _stopped(killed.pid), "the check did not reach its export"
    left = [p for p in (root / "cache" / "tmp").iterdir() if p.name.startswith("check-")]
    killed.kill()
    killed.wait()
    return killed, left


def test_check_finds_a_time_stamp_and_passes_a_reproducible_layer(pinned_fixture_base, tmp_path):
    root = workspace(tmp_path / "ws", pinned_fixture_base)
    made = efabuild(root, "make", "g")
    assert made.returncode == 0, made.stderr
    keys = {layer["name"]: layer["key"] for layer in json.loads(efabuild(root, "plan", "--json").stdout)["layers"]}
    stored = Path(efabuild(root, "lookup", "g:stamp").stdout.strip())
    before = stored.read_bytes()
    time.sleep(1.1)  # `date` prints seconds
    try:
        checked = efabuild(root, "make", "--check", "g:stamp")
        assert checked.returncode == 1, checked.stderr
        out = checked.stdout
        assert "g:stamp" in out and "differs" in out
        assert "content  /stamp" in out
        # a plain import writes a timestamp-checked .pyc: it records its source's build-time mtime
        assert "content  /opt/stamp/__pycache__/mod.cpython-311.pyc" in out
        assert "network fetches" in out
        assert stored.read_bytes() == before  # the stored artifact is left as it was
        # a layer without such steps rebuilds to the same bytes
        same = efabuild(root, "make", "--check", "--json", "g:tools")
        assert same.returncode == 0, same.stdout + same.stderr
        [result] = json.loads(same.stdout)["checks"]
        assert result["identical"] and result["differences"] == [] and result["packing"] == []
        assert result["rebuilt_digest"] == result["stored_digest"] == json.loads(
            Path(efabuild(root, "lookup", "g:tools").stdout.strip()).with_suffix(".json").read_text())["digest"]
        assert _check_images("stamp", keys["g:stamp"]) == []  # the rebuild's image went after its export
        # killed while exporting the rebuild: its directory, export container and image are left, named
        # by the dead process, to gc (listed on a dry run, removed with --yes) and to the next make
        for cleaner in (("gc", "--yes"), ("make", "g")):
            killed, left = _killed_at_export(root, "g:tools")
            images = _check_images("tools", keys["g:tools"])
            assert len(images) == 1 and f".{killed.pid}." in images[0], images
            assert len(left) == 1 and left[0].is_dir() and _export_containers_into(left[0])
            if cleaner[0] == "gc":
                listed = json.loads(efabuild(root, "gc", "--json").stdout)["debris"]
                assert {"tier": "engine", "item": f"image {images[0]}"} in listed, listed
                assert {"tier": "local", "item": str(left[0])} in listed, listed
            assert efabuild(root, *cleaner).returncode == 0
            assert not left[0].exists() and not _export_containers_into(left[0]), cleaner
            assert _check_images("tools", keys["g:tools"]) == [], cleaner
        # a graph instead of a layer, an unknown layer: one line, exit 2
        for wrong in ("g", "g:nope"):
            bad = efabuild(root, "make", "--check", wrong)
            assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    finally:
        tags = [f"efabuild/{name.split(':')[1]}:{key}" for name, key in keys.items()]
        tags += [tag for name, key in keys.items() for tag in _check_images(name.split(":")[1], key)]
        subprocess.run(["docker", "image", "rm", "--force", *tags], capture_output=True)


def test_check_fails_on_a_damaged_stored_artifact_and_names_it(pinned_fixture_base, tmp_path):
    root = workspace(tmp_path / "ws", pinned_fixture_base)
    made = efabuild(root, "make", "g:tools")
    assert made.returncode == 0, made.stderr
    [key] = [layer["key"] for layer in json.loads(efabuild(root, "plan", "--json").stdout)["layers"]
             if layer["name"] == "g:tools"]
    stored = Path(efabuild(root, "lookup", "g:tools").stdout.strip())
    try:
        # 4 bytes changed in place: same size, same record; only the bytes say it is not the artifact
        stored.chmod(0o644)
        with open(stored, "r+b") as f:
            f.seek(stored.stat().st_size // 2)
            old = f.read(4)
            f.seek(-4, 1)
            f.write(bytes(b ^ 0xFF for b in old))
        checked = efabuild(root, "make", "--check", "g:tools")
        assert checked.returncode == 1, checked.stdout + checked.stderr
        first = checked.stdout.splitlines()[0]
        assert first.startswith(f"g:tools ({key[:12]}): the stored artifact is damaged: local tier: {stored}")
        assert "identical" not in first
        assert f"delete {stored} and run `efabuild make g:tools`" in checked.stdout
        as_json = efabuild(root, "make", "--check", "--json", "g:tools")
        [result] = json.loads(as_json.stdout)["checks"]
        assert as_json.returncode == 1 and not result["identical"] and str(stored) in result["damaged"]
        # as it says: deleted and made again, the artifact is whole and checks identical
        stored.unlink()
        assert efabuild(root, "make", "g:tools").returncode == 0
        again = efabuild(root, "make", "--check", "g:tools")
        assert again.returncode == 0 and "identical to the stored artifact" in again.stdout, again.stdout
    finally:
        subprocess.run(["docker", "image", "rm", "--force", f"efabuild/tools:{key}"], capture_output=True)


def _with_labels_in_rc(stored: Path, out: Path, labels: dict[str, str], options: list[str]) -> None:
    """`stored` packed again as an export before labels were keyed wrote it: `labels` among the
    comment lines of /etc/rc, sorted as Enroot sorts them."""
    import io
    import tarfile

    source = subprocess.Popen(["sqfs2tar", "--no-xattr", "--root-becomes", ".", str(stored)], stdout=subprocess.PIPE)
    sink = subprocess.Popen(["mksquashfs", "-", str(out), *options], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    with tarfile.open(fileobj=source.stdout, mode="r|") as tin, tarfile.open(fileobj=sink.stdin, mode="w|") as tout:
        for member in tin:
            body = tin.extractfile(member) if member.isfile() else None
            if member.name.removeprefix("./") == "etc/rc":
                head, _, rest = body.read().decode().partition("\n\n")
                lines = sorted([*head.splitlines(), *(f"# {k} {v}" for k, v in labels.items())])
                data = ("\n".join(lines) + "\n\n" + rest).encode()
                member.size, body = len(data), io.BytesIO(data)
            tout.addfile(member, body)
    sink.stdin.close()
    assert source.wait() == 0 and sink.wait() == 0


def test_check_of_an_artifact_exported_with_its_labels_in_etc_rc_says_so(pinned_fixture_base, tmp_path):
    from efabuild.host.digest import file_digest

    root = workspace(tmp_path / "ws", pinned_fixture_base)
    assert efabuild(root, "make", "g:tools").returncode == 0
    [key] = [layer["key"] for layer in json.loads(efabuild(root, "plan", "--json").stdout)["layers"]
             if layer["name"] == "g:tools"]
    stored = Path(efabuild(root, "lookup", "g:tools").stdout.strip())
    record_path = stored.with_suffix(".json")
    record = json.loads(record_path.read_text())
    assert record["export"]["rc_labels"] == "keyed"
    try:
        # the artifact as an efabuild before this export option stored it: title, graph, layer in /etc/rc
        legacy = tmp_path / "legacy.sqsh"
        _with_labels_in_rc(stored, legacy, {"org.efabuild.graph": "g", "org.efabuild.layer": "tools",
                                            "org.opencontainers.image.title": "g:tools"}, record["export"]["mksquashfs"])
        del record["export"]["rc_labels"]
        record.update(digest=file_digest(legacy), size=legacy.stat().st_size)
        for path in (stored, record_path):
            path.chmod(0o644)
        stored.write_bytes(legacy.read_bytes())
        record_path.write_text(json.dumps(record, sort_keys=True, indent=1) + "\n")
        checked = efabuild(root, "make", "--check", "g:tools")
        assert checked.returncode == 1, checked.stdout + checked.stderr
        assert "damaged" not in checked.stdout
        assert "content  /etc/rc" in checked.stdout
        assert ("stored with export option rc_labels = absent (exported with the layer's name and git commit "
                "in /etc/rc), rebuilt with keyed") in checked.stdout, checked.stdout
    finally:
        subprocess.run(["docker", "image", "rm", "--force", f"efabuild/tools:{key}"], capture_output=True)
