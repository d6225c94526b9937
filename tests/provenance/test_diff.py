"""`efabuild diff` and `efabuild show` on stored artifacts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from efabuild.cli import main
from efabuild.provenance.diff import INPUTS, MEASURED, diff_manifests
from efabuild.provenance.stored import load_manifest
from efabuild.store import Store
from tests.data.rootfs import mini_ngc as ngc

KEY_A = "a0" * 32
KEY_B = "b0" * 32


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two builds of ngc-efa:deepep: the second asked for installer 1.51.0 and got it."""
    tmp = tmp_path_factory.mktemp("diff")
    ngc.full_image(tmp / "a")
    ngc.full_image(tmp / "b", version="1.51.0", libfabric="2.7.0", ofi="1.22.0")
    ngc.publish(tmp / "store", tmp / "a", tmp / "work", KEY_A, chain=ngc.chain_for(KEY_A))
    ngc.publish(tmp / "store", tmp / "b", tmp / "work", KEY_B, chain=ngc.chain_for(KEY_B, installer="1.51.0"))
    return tmp / "store"


@pytest.mark.slow
def test_differences_name_the_inputs_and_versions_that_changed(store: Path) -> None:
    s = Store.at(store, show_progress=False)
    a, b = load_manifest(s, KEY_A).manifest, load_manifest(s, KEY_B).manifest
    found = {(d.kind, d.what): (d.a, d.b) for d in diff_manifests(a, b)}
    assert found[(INPUTS, "ngc-efa:efa arg EFA_INSTALLER_VERSION")] == ("1.50.0", "1.51.0")
    assert found[(INPUTS, "ngc-efa:deepep key")] == (KEY_A, KEY_B)
    assert found[(MEASURED, "efa-installer")] == ("1.50.0", "1.51.0")
    assert found[(MEASURED, "aws-ofi-nccl")] == ("1.21.1", "1.22.0")
    assert found[(MEASURED, "libfabric")] == ("2.6.0", "2.7.0")
    # what did not change is not listed
    assert (MEASURED, "nccl") not in found and (INPUTS, "base digest") not in found
    assert diff_manifests(a, a) == []


@pytest.mark.slow
def test_diff_of_an_arm64_and_an_amd64_build_shows_the_machine_and_the_paths(tmp_path: Path) -> None:
    ngc.full_image(tmp_path / "amd64")
    ngc.full_image(tmp_path / "arm64", machine="aarch64")
    ngc.publish(tmp_path / "store", tmp_path / "amd64", tmp_path / "work", KEY_A, chain=ngc.chain_for(KEY_A))
    ngc.publish(tmp_path / "store", tmp_path / "arm64", tmp_path / "work", KEY_B,
                chain=ngc.chain_for(KEY_B, platform="linux/arm64"))
    s = Store.at(tmp_path / "store", show_progress=False)
    found = {(d.kind, d.what): (d.a, d.b) for d in
             diff_manifests(load_manifest(s, KEY_A).manifest, load_manifest(s, KEY_B).manifest)}
    assert found[(MEASURED, "machine")] == ("x86_64", "aarch64")
    assert found[(INPUTS, "ngc-efa:deepep platform")] == ("linux/amd64", "linux/arm64")
    assert found[(MEASURED, "nccl loads")] == ("/usr/lib/x86_64-linux-gnu/libnccl.so.2",
                                               "/usr/lib/aarch64-linux-gnu/libnccl.so.2")
    assert (MEASURED, "nccl") not in found and (MEASURED, "aws-ofi-nccl") not in found  # same versions


@pytest.mark.slow
def test_diff_command(store: Path, capsys) -> None:
    assert main(["diff", "ngc-efa:deepep", KEY_A[:12], "--store", str(store)]) == 0  # the name is B now
    out = capsys.readouterr().out
    assert out.splitlines()[:2] == [f"A  ngc-efa:deepep {KEY_B[:12]}", f"B  ngc-efa:deepep {KEY_A[:12]}"]
    row = next(line for line in out.splitlines() if "arg EFA_INSTALLER_VERSION" in line).split()
    assert row == ["input", "ngc-efa:efa", "arg", "EFA_INSTALLER_VERSION", "1.51.0", "1.50.0"]
    assert main(["diff", KEY_A[:12], KEY_B[:12], "--store", str(store), "--exit-code"]) == 1
    capsys.readouterr()
    assert main(["diff", KEY_A[:12], KEY_A, "--store", str(store), "--exit-code", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["differences"] == []


def test_show_table_and_json(store: Path, capsys) -> None:
    assert main(["show", KEY_A[:10], "--store", str(store)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["name", "ngc-efa:deepep"]
    assert "manifest  verified against the record" in out
    assert "machine   x86_64 (amd64), from platform linux/amd64" in lines
    component_rows = {line.split()[0]: line.split()[1:] for line in lines if line.split()[:1] and
                      line.split()[0] in ("nccl", "aws-ofi-nccl", "efa-installer", "deepep")}
    assert component_rows["aws-ofi-nccl"] == ["1.21.1", "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so"]
    assert component_rows["deepep"][:3] == [f"1.1.0+{ngc.DEEPEP_COMMIT[:7]}", "@", ngc.DEEPEP_COMMIT[:12]]
    assert "  NCCL_NET_PLUGIN=ofi" in lines
    assert main(["show", KEY_A, "--store", str(store), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["verified"] is True and shown["manifest"]["key"] == KEY_A
    assert main(["show", KEY_A, "--store", str(store), "--intoto"]) == 0
    statement = json.loads(capsys.readouterr().out)
    assert statement["subject"][0]["name"] == f"{KEY_A}.sqsh"


def test_show_of_an_unknown_ref_is_one_line(store: Path, capsys) -> None:
    assert main(["show", "ngc-efa:nothing", "--store", str(store)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("efabuild: no artifact named ngc-efa:nothing") and err.count("\n") == 1


@pytest.mark.slow
def test_show_gives_the_declared_version_of_a_component_no_file_tells(tmp_path: Path, capsys) -> None:
    """An image whose base declares CUDNN_VERSION but holds no cuDNN header or library: the cudnn
    row says what the base declares and that it is declared, not a bare 'unknown'."""
    ngc.full_image(tmp_path / "tree")
    (tmp_path / "tree/usr/include/x86_64-linux-gnu/cudnn_version.h").unlink()
    ngc.publish(tmp_path / "store", tmp_path / "tree", tmp_path / "work", KEY_A)
    assert main(["show", KEY_A, "--store", str(tmp_path / "store")]) == 0
    cudnn = next(line.split()[1:] for line in capsys.readouterr().out.splitlines() if line.startswith("cudnn "))
    assert cudnn[:3] == [ngc.CUDNN, "(declared)", "env:CUDNN_VERSION;"]
