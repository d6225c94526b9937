"""Hostile images and stored documents: what a Dockerfile can put into an image for the manifest
probe to read, and what whoever writes a shared tier can plant beside an artifact for `audit`,
`show` and `verify` to read. Each stays bounded and ends in one line or a check's message, never a
traceback or a hang.

Real .sqsh files (mksquashfs) in a real store directory, read by the CLI as a builder runs it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from efabuild.settings import AuditPolicy
from efabuild.provenance.stored import host_facts
from tests.data.rootfs import mini_ngc as ngc
from tests.kits.storekit import cache_dir
from tests.kits.fifos import without_blocking_on
from tests.kits.inprocess import run_efabuild

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


@pytest.mark.slow
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


@pytest.mark.slow
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
    from tests.kits.signkit import make_key, object_path, stored_artifact, trust_config

    private, public = make_key(tmp_path / "keys", "ed25519")
    store, key = stored_artifact(tmp_path, PemSigner(private))
    object_path(store, key, ".intoto.jsonl").write_text(DEEP + "\n")
    env = {**os.environ, "EFABUILD_TRUST_CONFIG": str(trust_config(tmp_path / "trust.toml", public)),
           "EFABUILD_VERIFY_CACHE": str(cache_dir(tmp_path / "verified")), "EFABUILD_STORE": str(store)}
    for argv in (["verify", key[:12]], ["lookup", "--require-signature", key[:12]]):
        proc = run_efabuild(argv, env=env, capture_output=True, text=True)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert "nested too deeply" in proc.stdout + proc.stderr


def test_the_host_s_efa_installer_file_is_never_waited_on_or_read_whole(tmp_path):
    """audit reads this host's /opt/amazon/efa_installed_packages: a FIFO or a huge file there
    must not hang it or fill its memory."""
    fifo = tmp_path / "efa_installed_packages"
    os.mkfifo(fifo)
    found = without_blocking_on(fifo, lambda: host_facts(None, AuditPolicy(), fifo),
                                "audit waited on a FIFO for the host's EFA installer version")
    assert found == host_facts(None, AuditPolicy(), tmp_path / "absent")
    huge = tmp_path / "huge"
    with open(huge, "wb") as f:
        f.seek(8 << 30)  # sparse: 8 GiB of nothing before the version line
        f.write(b"\n# EFA installer version: 1.50.0\n")
    assert host_facts(None, AuditPolicy(), huge).efa_installer is None


def test_a_dockerfile_exec_form_nested_deeply_is_linted_not_a_traceback(tmp_path):
    """The same deep JSON in the Dockerfile text itself (`RUN [[[[...`), read by lint's parser."""
    from tests.kits.wsfactory import SIMPLE_GRAPH, make_workspace

    graph = SIMPLE_GRAPH.replace("RUN echo deepep ${HYBRID_EP_COMMIT}", "RUN " + "[" * 5000 + "]" * 5000)
    root = make_workspace(tmp_path / "ws", {"stack": graph})
    proc = run_efabuild(["-C", str(root), "lint"], capture_output=True, text=True)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "lint: 0 errors" in proc.stdout


# ---- a farm export's tar stream ------------------------------------------------------------------
def _stream(path: Path, entries: list[tuple[str, bytes, dict]]) -> Path:
    import io
    import tarfile

    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, fields in entries:
            info = tarfile.TarInfo(name)
            for field, value in fields.items():
                setattr(info, field, value)
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def _export(tar: Path, out: Path):
    from efabuild.export.enroot import ImageConfig
    from efabuild.export.squash import export_tar_stream
    from efabuild.settings import ExportSettings

    # the farm's path: a builder's `--output type=tar` on a pipe, here `cat` of the planted stream
    return export_tar_stream(["cat", str(tar)], out, what="registry/efabuild/x@sha256:0", sha256=False,
                             config=ImageConfig.from_docker({}), created=[], options=ExportSettings())


@pytest.mark.parametrize(("name", "lands_at"), [("../escape", "/escape"), ("./../../x", "/x"),
                                               ("a/../../escape", None), ("a/./../b", None)])
def test_a_farm_stream_naming_a_path_above_the_root_stays_under_it_or_fails_in_one_line(tmp_path, name, lands_at):
    """Leading `../` is dropped, as tar drops it; `..` further in fails the export (mksquashfs
    refuses it): either way no entry of the .sqsh is outside its root."""
    import subprocess

    from efabuild.errors import EfabuildError

    tar = _stream(tmp_path / "in.tar", [("etc/ok", b"ok\n", {}), (name, b"out\n", {})])
    if lands_at is None:
        with pytest.raises(EfabuildError, match="mksquashfs failed: .*'\\.\\.'") as caught:
            _export(tar, tmp_path / "x.sqsh")
        assert "\n" not in str(caught.value) and not (tmp_path / "x.sqsh").exists()
        return
    _export(tar, tmp_path / "x.sqsh")
    out = subprocess.run(["unsquashfs", "-no-wildcards", "-cat", str(tmp_path / "x.sqsh"), lands_at],
                         capture_output=True, check=True).stdout
    assert out == b"out\n"


def test_a_farm_stream_s_absolute_names_links_and_devices_stay_inside_the_image(tmp_path):
    """Absolute names land under the image's root; a hard link to a file outside the stream (the
    host's /etc/shadow) is left out, never read from the host; a device node and a setuid bit are
    kept as `docker export` and Enroot keep them (Enroot runs containers without new privileges)."""
    import subprocess
    import tarfile

    secret = tmp_path / "host-secret"
    secret.write_text("host secret\n")
    tar = _stream(tmp_path / "in.tar", [
        ("etc", b"", {"type": tarfile.DIRTYPE, "mode": 0o755}),
        ("/abs/file", b"abs\n", {}),
        ("hard-up", b"", {"type": tarfile.LNKTYPE, "linkname": "../../" + str(secret).lstrip("/")}),
        ("hard-abs", b"", {"type": tarfile.LNKTYPE, "linkname": str(secret)}),
        ("null", b"", {"type": tarfile.CHRTYPE, "devmajor": 1, "devminor": 3, "mode": 0o666}),
        ("suid", b"#!/bin/sh\n", {"mode": 0o4755}),
        ("soft", b"", {"type": tarfile.SYMTYPE, "linkname": str(secret)}),
    ])
    _export(tar, tmp_path / "x.sqsh")
    listing = subprocess.run(["unsquashfs", "-lln", "-d", "", str(tmp_path / "x.sqsh")], capture_output=True,
                             text=True, check=True).stdout.splitlines()
    entries = {line.split(" ")[-1] if " -> " not in line else line.split(" -> ")[0].split(" ")[-1]: line
               for line in listing if line[:1] in "-dlcbps"}
    assert "/abs/file" in entries and "/hard-up" not in entries and "/hard-abs" not in entries
    assert entries["/null"].startswith("crw-rw-rw-") and entries["/suid"].startswith("-rwsr-xr-x")
    assert entries["/soft"].endswith(f"/soft -> {secret}")  # a link's text, resolved only inside a container
    files = [path for path, line in entries.items() if line.startswith("-")]
    contents = subprocess.run(["unsquashfs", "-no-wildcards", "-cat", str(tmp_path / "x.sqsh"), *files],
                              capture_output=True, check=True).stdout
    assert b"host secret" not in contents


@pytest.mark.slow
@pytest.mark.parametrize("tar_format", ["gnu", "posix"])
def test_a_farm_stream_with_a_10_gib_sparse_entry_fails_in_one_line_without_writing_it(tmp_path, tar_format):
    """Neither `docker export` nor BuildKit writes sparse entries; mksquashfs 4.6 cannot read them
    (old GNU sparse at all, PAX 1.0 sparse when an entry follows, as the filter's always do)."""
    import subprocess
    import time

    from efabuild.errors import EfabuildError

    tree = tmp_path / "tree"
    tree.mkdir()
    with open(tree / "big", "wb") as f:
        f.seek(10 << 30)
        f.write(b"end\n")
    tar = tmp_path / "in.tar"
    subprocess.run(["tar", "--sparse", f"--format={tar_format}", "-cf", str(tar), "-C", str(tree), "big"], check=True)
    started = time.monotonic()
    with pytest.raises(EfabuildError, match="mksquashfs failed") as caught:
        _export(tar, tmp_path / "x.sqsh")
    assert "\n" not in str(caught.value) and not (tmp_path / "x.sqsh").exists()
    assert time.monotonic() - started < 60


# ---- stored .sqsh files that are not what they claim -------------------------------------------
def _plant_over(store: Path, data_from: Path | bytes) -> None:
    """Replace the stored .sqsh and make its record agree, as whoever writes the tier can."""
    from efabuild.host.digest import file_digest

    sqsh = store / "objects" / KEY[:2] / f"{KEY}.sqsh"
    sqsh.unlink()
    if isinstance(data_from, bytes):
        sqsh.write_bytes(data_from)
    else:
        os.link(data_from, sqsh)
    record_path = store / "objects" / KEY[:2] / f"{KEY}.json"
    record = json.loads(record_path.read_text())
    record.update(size=sqsh.stat().st_size, digest=file_digest(sqsh))
    record_path.chmod(0o644)
    record_path.write_text(json.dumps(record))


@pytest.mark.slow
def test_a_stored_sqsh_that_is_not_squashfs_is_a_failed_check_not_a_traceback(store):
    _plant_over(store, b"MZ not a squashfs at all\n" * 1000)
    proc = audit(store, "--json")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    checks = {c["check"]: c for c in json.loads(proc.stdout)["artifacts"][0]["checks"]}
    assert any("unsquashfs failed" in c["message"] for c in checks.values()), checks


@pytest.fixture(scope="module")
def bomb(tmp_path_factory) -> Path:
    """24,000 hard links in a small .sqsh: each costs a few bytes there and hundreds once listed."""
    import subprocess

    tree = tmp_path_factory.mktemp("bomb") / "tree"
    tree.mkdir()
    for group in range(4):
        (tree / f"g{group}").touch()
        for i in range(6_000):
            os.link(tree / f"g{group}", tree / f"f{group}_{i}")
    out = tree.parent / "bomb.sqsh"
    subprocess.run(["mksquashfs", str(tree), str(out), "-noappend", "-quiet", "-no-progress", "-comp", "xz"],
                   check=True)
    assert out.stat().st_size < 1 << 20
    return out


# The limit is lowered in these tests so the bomb can be small: its real value, 2,000,000 entries,
# would take a bomb of 2 MB and minutes of mksquashfs on this machine.
@pytest.mark.slow
def test_a_squashfs_bomb_on_a_tier_is_refused_before_its_listing_fills_the_memory(store, bomb, monkeypatch):
    from efabuild.provenance import fsview

    monkeypatch.setattr(fsview, "MAX_ENTRIES", 10_000)
    _plant_over(store, bomb)
    proc = audit(store, "--json")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    messages = [c["message"] for c in json.loads(proc.stdout)["artifacts"][0]["checks"]]
    assert any("lists more than 10000 entries" in m for m in messages), messages


@pytest.mark.slow
def test_make_check_compares_no_squashfs_bomb_entry_by_entry(bomb, monkeypatch):
    from efabuild.errors import EfabuildError
    from efabuild.export import sqshdiff

    monkeypatch.setattr(sqshdiff, "MAX_ENTRIES", 10_000)
    with pytest.raises(EfabuildError, match="holds more than 10000 entries: not compared"):
        sqshdiff.read_sqsh(bomb)


@pytest.mark.slow
def test_an_image_path_that_is_not_utf8_is_measured_and_every_json_output_stays_strict(tmp_path):
    """A site directory named `python3\\xff` still matches `python3*`: the probe reads the torch
    in it, the manifest (UTF-8 JSON) names it with `\\xff`, and show and audit print JSON without
    lone surrogate escapes (which strict parsers such as Rust's serde_json refuse)."""
    store = published(tmp_path, lambda root: ngc.write(
        root, os.fsdecode(b"/usr/local/lib/python3\xff/dist-packages/torch/version.py"), "__version__ = '9.9.9'\n"))
    manifest = json.loads((store / "objects" / KEY[:2] / f"{KEY}.manifest.json").read_bytes())
    sources = json.dumps(manifest["measured"]["components"]["pytorch"])
    assert "/usr/local/lib/python3\\\\xff/dist-packages/torch/version.py" in sources
    for argv in (["show", KEY[:12], "--json"], ["audit", KEY[:12], "--json", "--host-efa", "1.50.0"]):
        proc = run_efabuild([*argv, "--store", str(store)], capture_output=True, text=True)
        assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr
        assert "\\ud" not in proc.stdout.lower()
        json.loads(proc.stdout)
