"""Hostile images and stored documents: what a Dockerfile can put into an image for the manifest
probe to read, and what whoever writes a shared tier can plant beside an artifact for `audit`,
`show` and `verify` to read. Each stays bounded and ends in one line or a check's message, never a
traceback or a hang.

Real .sqsh files (mksquashfs) in a real store directory, read by the CLI as a builder runs it.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from efabuild.model import AuditPolicy
from efabuild.provenance.stored import host_facts
from tests.data.rootfs import mini_ngc as ngc
from tests.inprocess import run_efabuild

KEY = "5a" * 32
DEEP = "[" * 200_000 + "]" * 200_000
INFO = f"{ngc.SITE}/deep_ep-1.1.0+{ngc.DEEPEP_COMMIT[:7]}.dist-info"


def audit(store: Path, *extra: str):
    return run_efabuild(["audit", KEY[:12], "--store", str(store), "--host-efa", "1.50.0", *extra],
                        capture_output=True, text=True)


def published(tmp_path: Path, plant) -> Path:  # noqa: ANN001 - plant(root) edits the image tree
    root = tmp_path / "image"
    ngc.full_image(root)
    plant(root)
    ngc.publish(tmp_path / "store", root, tmp_path / "work", KEY)
    return tmp_path / "store"


def _fifo(root: Path, path: str) -> None:
    target = root / path.lstrip("/")
    target.unlink(missing_ok=True)
    os.mkfifo(target)


def _link(root: Path, path: str, to: str) -> None:
    target = root / path.lstrip("/")
    target.unlink(missing_ok=True)
    os.symlink(to, target)


PLANTS = {
    "deep direct_url.json": lambda r: ngc.write(r, f"{INFO}/direct_url.json", DEEP),
    "direct_url.json a list": lambda r: ngc.write(r, f"{INFO}/direct_url.json", '["file:///opt/DeepEP"]'),
    "vcs_info a string": lambda r: ngc.write(r, f"{INFO}/direct_url.json", '{"vcs_info": "x", "url": 5}'),
    "deep cuda version.json": lambda r: ngc.write(r, "/usr/local/cuda/version.json", DEEP),
    "huge efa_installed_packages": lambda r: ngc.write(r, "/opt/amazon/efa_installed_packages",
                                                         b"# EFA installer version: 1.50.0\n" + b"x" * (64 << 20)),
    "efa_installed_packages a FIFO": lambda r: _fifo(r, "/opt/amazon/efa_installed_packages"),
    "dpkg status a link to /proc": lambda r: _link(r, "/var/lib/dpkg/status", "/proc/self/environ"),
    "os-release a link to the host's": lambda r: _link(r, "/etc/os-release", "../../../../../etc/shadow"),
    "METADATA a FIFO": lambda r: _fifo(r, f"{INFO}/METADATA"),
}


@pytest.mark.parametrize("plant", PLANTS.values(), ids=PLANTS.keys())
def test_what_an_image_holds_never_breaks_the_manifest_probe_or_the_audit(tmp_path, plant):
    store = published(tmp_path, plant)  # the probe a make runs on every artifact
    proc = audit(store, "--json")
    assert "Traceback" not in proc.stderr and proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)["artifacts"][0]
    assert {c["check"]: c["status"] for c in report["checks"]}["sqsh-integrity"] == "ok"
    manifest = (store / "objects" / KEY[:2] / f"{KEY}.manifest.json").read_text()
    assert "root:" not in manifest and "PATH=" not in manifest  # nothing of this host's files


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return published(tmp_path, lambda root: None)


def _plant(path: Path, data: bytes) -> None:
    path.chmod(0o644)
    path.write_bytes(data)


@pytest.mark.parametrize("command", [["audit", "--json"], ["show"], ["doctor-manifest"]])
def test_a_deeply_nested_manifest_planted_on_a_tier_is_one_line(store, command, tmp_path):
    manifest = store / "objects" / KEY[:2] / f"{KEY}.manifest.json"
    _plant(manifest, DEEP.encode())
    if command == ["audit", "--json"]:
        proc = audit(store, "--json")
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        checks = {c["check"]: c for c in json.loads(proc.stdout)["artifacts"][0]["checks"]}
        assert checks["manifest-integrity"]["status"] == "FAIL"
        return
    if command == ["show"]:
        argv = ["show", KEY[:12], "--store", str(store)]
    else:  # a manifest file handed to doctor by hand
        planted = tmp_path / "manifest.json"
        planted.write_text(DEEP)
        argv = ["doctor", "--manifest", str(planted), str(_nccl_log(tmp_path))]
    proc = run_efabuild(argv, capture_output=True, text=True)
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def _nccl_log(tmp_path: Path) -> Path:
    log = tmp_path / "slurm-1.out"
    log.write_text("node1:1:1 [0] NCCL INFO NET/OFI Selected provider is efa\n")
    return log


def test_a_deeply_nested_signed_statement_planted_on_a_tier_is_a_failure_not_a_traceback(tmp_path):
    from efabuild.signing.keys import PemSigner
    from tests.signkit import make_key, object_path, stored_artifact, trust_config

    private, public = make_key(tmp_path / "keys", "ed25519")
    store, key = stored_artifact(tmp_path, PemSigner(private))
    object_path(store, key, ".intoto.jsonl").write_text(DEEP + "\n")
    env = {**os.environ, "EFABUILD_TRUST_CONFIG": str(trust_config(tmp_path / "trust.toml", public)),
           "EFABUILD_VERIFY_CACHE": str(tmp_path / "verified"), "EFABUILD_STORE": str(store)}
    for argv in (["verify", key[:12]], ["lookup", "--require-signature", key[:12]]):
        proc = run_efabuild(argv, env=env, capture_output=True, text=True)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert "nested too deeply" in proc.stdout + proc.stderr


def test_the_host_s_efa_installer_file_is_never_waited_on_or_read_whole(tmp_path):
    """audit reads this host's /opt/amazon/efa_installed_packages: a FIFO or a huge file there
    must not hang it or fill its memory."""
    fifo = tmp_path / "efa_installed_packages"
    os.mkfifo(fifo)
    found: list = []
    reader = threading.Thread(target=lambda: found.append(host_facts(None, AuditPolicy(), fifo)), daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():
        with open(fifo, "wb"):
            pass
        reader.join(5)
        pytest.fail("audit waited on a FIFO for the host's EFA installer version")
    assert found == [host_facts(None, AuditPolicy(), tmp_path / "absent")]
    huge = tmp_path / "huge"
    with open(huge, "wb") as f:
        f.seek(8 << 30)  # sparse: 8 GiB of nothing before the version line
        f.write(b"\n# EFA installer version: 1.50.0\n")
    assert host_facts(None, AuditPolicy(), huge).efa_installer is None


def test_a_dockerfile_exec_form_nested_deeply_is_linted_not_a_traceback(tmp_path):
    """The same deep JSON in the Dockerfile text itself (`RUN [[[[...`), read by lint's parser."""
    from tests.wsfactory import SIMPLE_GRAPH, make_workspace

    graph = SIMPLE_GRAPH.replace("RUN echo deepep ${HYBRID_EP_COMMIT}", "RUN " + "[" * 5000 + "]" * 5000)
    root = make_workspace(tmp_path / "ws", {"stack": graph})
    proc = run_efabuild(["-C", str(root), "lint"], capture_output=True, text=True)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "lint: 0 errors" in proc.stdout
