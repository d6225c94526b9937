"""Invariants that a plausible one-line slip would break without any other test noticing.

Each test names the slip it guards against. They go through the command line in-process
(`efabuild.cli.main`), so they hold however the code behind it is arranged.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from efabuild.cli import main
from tests.core.test_plan import SIMPLE_GRAPH, by_name, record_all
from tests.kits.wsfactory import BUILD_TOML, make_workspace

OLD = time.time() - 3600  # older than the hash cache's racy window


def plan(root: Path, capsys, monkeypatch) -> dict[str, dict]:
    monkeypatch.chdir(root)
    capsys.readouterr()
    assert main(["plan", "--offline", "--json"]) == 0
    return by_name(json.loads(capsys.readouterr().out))


def cached_workspace(tmp_path: Path, capsys, monkeypatch, **options) -> tuple[Path, dict[str, dict]]:
    """A workspace whose context is in the hash cache and whose layers are recorded as built."""
    root = make_workspace(tmp_path / "ws", **options)
    for path in (root / "app").rglob("*"):
        os.utime(path, (OLD, OLD))
    record_all(root)
    before = plan(root, capsys, monkeypatch)  # fills the hash cache
    assert {layer["state"] for layer in before.values()} == {"available"} or all(
        layer["reasons"] == ["the .sqsh is not in every store tier yet"] for layer in before.values()
        if layer["state"] != "available")
    return root, before


# ---- the hash cache --------------------------------------------------------------------------

def test_a_file_replaced_by_another_of_the_same_size_and_mtime_is_hashed_again(tmp_path, capsys, monkeypatch):
    """Slip: the cache matches (size, mtime) and ignores the inode. An editor that writes a new
    file and renames it over the old one, with the old mtime restored (rsync -t, tar x, cp -p),
    must still move the key."""
    root, before = cached_workspace(tmp_path, capsys, monkeypatch)
    train = root / "app" / "train.py"
    replacement = root / "app" / ".train.py.new"
    replacement.write_text(train.read_text().replace("train", "TRAIN"))  # same size
    os.utime(replacement, ns=(train.stat().st_atime_ns, train.stat().st_mtime_ns))
    os.replace(replacement, train)
    after = plan(root, capsys, monkeypatch)
    assert after["stack:user"]["key"] != before["stack:user"]["key"]
    assert after["stack:user"]["reasons"] == ["context app/train.py changed"]


def test_a_file_rewritten_in_place_to_another_size_with_mtime_restored_is_hashed_again(
        tmp_path, capsys, monkeypatch):
    """Slip: the cache matches (mtime, inode) and ignores the size."""
    root, before = cached_workspace(tmp_path, capsys, monkeypatch)
    train = root / "app" / "train.py"
    inode, mtime_ns = train.stat().st_ino, train.stat().st_mtime_ns
    with open(train, "r+") as handle:  # in place: same inode
        handle.write("print('a longer training script')\n")
    os.utime(train, ns=(mtime_ns, mtime_ns))
    assert train.stat().st_ino == inode
    after = plan(root, capsys, monkeypatch)
    assert after["stack:user"]["key"] != before["stack:user"]["key"]
    assert after["stack:user"]["reasons"] == ["context app/train.py changed"]


# ---- what enters a key, and the reasons a plan gives ------------------------------------------

def test_the_configured_platform_is_part_of_every_key(tmp_path, capsys, monkeypatch):
    """Slip: the key is computed with the default platform instead of [builder] platform."""
    root, before = cached_workspace(tmp_path, capsys, monkeypatch)
    (root / "BUILD.toml").write_text(BUILD_TOML + '\n[builder]\nplatform = "linux/arm64"\n')
    after = plan(root, capsys, monkeypatch)
    for name in before:
        assert after[name]["key"] != before[name]["key"], name
    assert after["stack:efa"]["reasons"] == ["platform linux/amd64 → linux/arm64"]


def test_a_mode_change_is_a_reason(tmp_path, capsys, monkeypatch):
    """Slip: the plan compares context digests only and loses a chmod +x."""
    root, before = cached_workspace(tmp_path, capsys, monkeypatch)
    (root / "app" / "train.py").chmod(0o755)
    after = plan(root, capsys, monkeypatch)
    assert after["stack:user"]["key"] != before["stack:user"]["key"]
    assert after["stack:user"]["reasons"] == ["context app/train.py mode 644 → 755"]


def test_a_base_digest_change_is_a_reason(tmp_path, capsys, monkeypatch):
    """Slip: the plan compares the base reference only and loses a new digest of the same tag."""
    old, new = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    graph = SIMPLE_GRAPH.replace('base = "example.com/pytorch:26.08-py3"\n',
                                 f'base = "example.com/pytorch:26.08-py3"\ndigest = "{old}"\n')
    root, before = cached_workspace(tmp_path, capsys, monkeypatch, graphs={"stack": graph})
    (root / "graphs" / "stack.toml").write_text(graph.replace(old, new))
    after = plan(root, capsys, monkeypatch)
    assert after["stack:efa"]["key"] != before["stack:efa"]["key"]
    assert after["stack:efa"]["reasons"] == ["base digest aaaaaaaaaaaa → bbbbbbbbbbbb"]
    assert after["stack:user"]["reasons"][0] == "parent deepep changed"


# ---- gc pins -------------------------------------------------------------------------------------

@pytest.mark.parametrize("form", ["full key", "key prefix", "name"])
def test_gc_keeps_a_pin_in_every_form(tmp_path, capsys, monkeypatch, form):
    """Slip: gc matches pins as prefixes or names and drops a pin written as a whole key."""
    from efabuild.host.digest import file_digest
    from efabuild.store.tiered import Store
    from efabuild.store.tiers.fs import FilesystemTier
    from efabuild.store.record import ArtifactRecord
    from tests.kits.storekit import key_for

    keys = [key_for(f"pinned-{i}") for i in range(3)]
    pin = {"full key": keys[0], "key prefix": keys[0][:10], "name": "demo:user"}[form]
    (tmp_path / "BUILD.toml").write_text(f'[store]\nlocal = "cache"\nkeep = 1\npins = ["{pin}"]\n')
    store = Store([FilesystemTier(tmp_path / "cache", "local")], show_progress=False)
    for day, key in enumerate(keys, start=1):
        sqsh = tmp_path / f"{day}.sqsh"
        sqsh.write_bytes(os.urandom(1024))
        store.publish(key, sqsh, ArtifactRecord.for_file(key, "demo:user", sqsh, file_digest(sqsh),
                                                         created=f"2026-11-{day:02d}T00:00:00.000000Z"))
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["gc", "--yes", "--json"]) == 0
    removed = {r["key"] for r in json.loads(capsys.readouterr().out)["removals"]}
    expected = set() if form == "name" else {keys[1]}
    assert removed == expected
    assert store.fs_tiers[0].has(keys[0]) and store.fs_tiers[0].has(keys[2])


# ---- audit ---------------------------------------------------------------------------------------

def test_audit_wants_efas_two_directories_in_order(tmp_path):
    """Slip: the LD_LIBRARY_PATH lead is compared as a set, so EFA's two directories swapped pass.
    The aws-ofi-nccl directory must come first."""
    from efabuild.provenance.audit import FAIL, PASS
    from tests.data.rootfs import mini_ngc as ngc
    from tests.provenance.test_audit import audit_tree

    tree = tmp_path / "root"
    env = ngc.full_image(tree)
    assert audit_tree(tree)["ld-library-path"].status == PASS
    rest = env["LD_LIBRARY_PATH"].split(":")[2:]
    swapped = ":".join(["/opt/amazon/efa/lib", "/opt/amazon/ofi-nccl/lib", *rest])
    ngc.write_config(tree, {**env, "LD_LIBRARY_PATH": swapped})
    check = audit_tree(tree)["ld-library-path"]
    assert check.status == FAIL and "is not led by /opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib" in check.message


# ---- export ------------------------------------------------------------------------------------

@pytest.mark.engine
def test_the_superblock_and_root_directory_carry_the_exports_epoch(busybox_image, tmp_path):
    """Slip: the export stops fixing the superblock's creation time, so two exports of one image a
    second apart differ (the determinism test exports twice within the same second)."""
    import struct
    import subprocess

    from efabuild.settings import ExportSettings
    from efabuild.export.squash import export_image

    epoch = 1_234_567_890
    out = tmp_path / "busybox.sqsh"
    export_image(busybox_image, out, options=ExportSettings(), epoch=epoch)
    with open(out, "rb") as handle:
        magic, _inodes, mkfs_time = struct.unpack("<III", handle.read(12))
    assert magic == 0x73717368  # "hsqs"
    assert mkfs_time == epoch
    listing = subprocess.run(["unsquashfs", "-lln", "-UTC", str(out)], capture_output=True, text=True,
                             check=True).stdout.splitlines()
    root = next(line for line in listing if line.rstrip().endswith("squashfs-root"))
    assert "2009-02-13 23:31" in root  # the epoch, as unsquashfs prints it in UTC


# ---- fetching ----------------------------------------------------------------------------------

@pytest.mark.s3
def test_four_nodes_looking_up_one_cold_key_download_it_once(tmp_path, moto_server, s3_bucket):
    """Slip: the cold fetch stops taking its per-key lock; four jobs starting at once on a cold
    shared store would then download the same 25 GB four times."""
    import subprocess
    import sys

    from efabuild.settings import S3Config
    from efabuild.store.tiers.s3 import S3Tier
    from tests.plugins.faultproxy import FaultProxy
    from tests.kits.storekit import REPO, make_sqsh

    settings = S3Config(bucket=s3_bucket, prefix="efabuild/", region="us-east-1", endpoint_url=moto_server)
    from efabuild.store.tiered import Store
    from efabuild.store.tiers.fs import FilesystemTier
    from tests.kits.storekit import key_for, record_for

    sqsh = make_sqsh(tmp_path, os.urandom(8 << 20), "cold")
    key = key_for("cold")
    builder = Store([FilesystemTier(tmp_path / "builder" / "cache", "local")], settings, show_progress=False,
                    s3_options={"chunking": (64 << 10, 256 << 10, 1 << 20)})
    builder.publish(key, sqsh, record_for(key, "demo:user", sqsh))
    proxy = FaultProxy(moto_server)  # counts the requests that pass
    shared = tmp_path / "fsx"
    shared.mkdir()
    config = (tmp_path / "builder" / "cache" / "store.toml").read_text()
    assert moto_server in config
    (shared / "store.toml").write_text(config.replace(moto_server, proxy.endpoint))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    jobs = [subprocess.Popen([sys.executable, "-m", "efabuild", "lookup", "--store", str(shared), key],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for _ in range(4)]
    outputs = [job.communicate(timeout=120) for job in jobs]
    assert [job.returncode for job in jobs] == [0] * 4, outputs
    assert {out for out, _err in outputs} == {f"{shared}/objects/{key[:2]}/{key}.sqsh\n"}
    proxy.close()
    assert proxy.gets(f"{key}.chunks.json") == 1, proxy.requests  # one fetch, assembled from chunks
    chunk_gets = sum(1 for method, path, _ in proxy.requests if method == "GET" and "/chunks/" in path)
    index = S3Tier(settings).chunk_index(key)
    assert index is not None and len(index.unique()) > 8
    assert chunk_gets == len(index.unique())
