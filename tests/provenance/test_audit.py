"""`efabuild audit`: a clean artifact passes; each known way an image goes wrong is caught.

Most variants run the pure checks on a generated tree; the integrity and tampering cases and the
command line use real .sqsh files (mksquashfs) in a real store directory.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from efabuild.cli import main
from efabuild.settings import AuditPolicy
from efabuild.provenance import manifest as manifests
from efabuild.provenance.audit import FAIL, PASS, WARN, FileFacts, HostFacts, audit
from efabuild.provenance.fsview import DirView
from efabuild.provenance.probe import probe_tree
from efabuild.provenance.stored import host_facts
from efabuild.store import ArtifactRecord
from tests.data.rootfs import mini_ngc as ngc

KEY = "7c" * 32
SQSH_DIGEST = "blake3:" + "1d" * 32
POLICY = AuditPolicy(  # as in the demo BUILD.toml
    host_efa_installer="1.50.0",
    min_versions=(("aws-ofi-nccl", "1.19.0"), ("libfabric", "2.4.0")),
    known_bad=(("nccl", ">=2.19", "efa-installer", "<1.29",
                "NCCL 2.19+ needs aws-ofi-nccl from EFA installer 1.29 or newer"),),
)
HOST = HostFacts("1.50.0", "--host-efa")


def audit_tree(root: Path, *, policy: AuditPolicy = POLICY, host: HostFacts = HOST, chain: list | None = None,
               base: dict | None = None) -> dict:
    """Run every check on a tree as if it were a stored artifact whose manifest describes it."""
    measured = probe_tree(DirView(root))
    data = manifests.encode(manifests.build_manifest(
        key=KEY, name="ngc-efa:deepep", sqsh_digest=SQSH_DIGEST, sqsh_size=4096, export_options={},
        base=base if base is not None else {"ref": ngc.BASE_REF, "digest": ngc.BASE_DIGEST},
        chain=chain if chain is not None else ngc.chain_for(KEY), measured=measured, builder={}, times={},
    ))
    record = ArtifactRecord(key=KEY, name="ngc-efa:deepep", size=4096, digest=SQSH_DIGEST,
                            created="2026-11-30T04:00:00Z", manifest_digest=manifests.digest(data))
    checks = audit(record=record, manifest_bytes=data, sqsh=FileFacts(4096, SQSH_DIGEST), measured=measured,
                   policy=policy, host=host)
    names = [c.name for c in checks]
    assert len(names) == len(set(names)), names
    return {c.name: c for c in checks}


def failures(checks: dict) -> dict[str, str]:
    return {name: c.message for name, c in checks.items() if c.status == FAIL}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return tmp_path / "root"


def test_clean_artifact_passes_every_check(tree: Path) -> None:
    ngc.full_image(tree)
    checks = audit_tree(tree)
    assert {name: c.status for name, c in checks.items() if c.status != PASS} == {}
    assert set(checks) >= {
        "sqsh-integrity", "manifest-integrity", "manifest-vs-image", "declared:EFA_INSTALLER_VERSION",
        "declared:HYBRID_EP_COMMIT", "host-efa", "net-plugin", "ld-library-path", "openmpi", "infiniband-env",
        "ofi-plugin", "policy-min:aws-ofi-nccl", "policy-min:libfabric", "policy-known-bad",
    }


def test_installer_older_than_declared(tree: Path) -> None:
    ngc.full_image(tree, version="1.49.0")
    bad = failures(audit_tree(tree))
    assert bad["declared:EFA_INSTALLER_VERSION"] == (
        "EFA_INSTALLER_VERSION=1.50.0 declared in ngc-efa:efa, but efa-installer 1.49.0 is installed "
        "(/opt/amazon/efa_installed_packages)")
    assert "image has EFA installer 1.49.0, host has 1.50.0" in bad["host-efa"]


def test_deepep_built_from_another_commit(tree: Path) -> None:
    ngc.full_image(tree)
    other = "0123456789abcdef0123456789abcdef01234567"
    bad = failures(audit_tree(tree, chain=ngc.chain_for(KEY, commit=other)))
    assert bad["declared:HYBRID_EP_COMMIT"].startswith("HYBRID_EP_COMMIT=0123456789ab declared in ngc-efa:deepep, "
                                                       "but deepep was built from 94a9f8f6b146")


def test_old_plugin_first_on_ld_library_path(tree: Path) -> None:
    env = ngc.full_image(tree)
    ngc.ofi_plugin(tree, "/opt/amazon/aws-ofi-nccl/lib/libnccl-net-ofi.so", "1.13.2-aws")
    ngc.write_config(tree, {**env, "LD_LIBRARY_PATH": "/opt/amazon/aws-ofi-nccl/lib:" + env["LD_LIBRARY_PATH"]})
    bad = failures(audit_tree(tree))
    assert bad["library-shadowing:aws-ofi-nccl"] == (
        "aws-ofi-nccl 1.13.2-aws at /opt/amazon/aws-ofi-nccl/lib/libnccl-net-ofi.so loads first "
        "(/opt/amazon/aws-ofi-nccl/lib from env:LD_LIBRARY_PATH); the newer 1.21.1 at "
        "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so is shadowed")
    assert "policy-min:aws-ofi-nccl" in bad and "ld-library-path" in bad


def test_old_libfabric_first_in_ld_so_conf(tree: Path) -> None:
    env = ngc.write_base(tree)
    env = ngc.add_deepep(tree, ngc.add_efa_installer(tree, env, ld_path=False))
    ngc.write_config(tree, env, ngc.base_labels())
    ngc.libfabric_files(tree, "/usr/local", "1.22.0", "1.24.0")
    ngc.write(tree, "/etc/ld.so.conf.d/00-local.conf", "/usr/local/lib\n")
    bad = failures(audit_tree(tree))
    assert "libfabric 1.22.0 at /usr/local/lib/libfabric.so.1 loads first (/usr/local/lib from " \
           "/etc/ld.so.conf.d/00-local.conf); the newer 2.6.0" in bad["library-shadowing:libfabric"]
    assert bad["ld-library-path"].endswith("is not led by /opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib: "
                                           "the base's older EFA libraries may win")
    assert "libfabric 1.22.0 is older than the policy minimum 2.4.0" == bad["policy-min:libfabric"]


def test_older_nccl_first_only_warns(tree: Path) -> None:
    ngc.full_image(tree)
    ngc.write(tree, "/usr/local/cuda/lib64/libnccl.so.2.29.3", ngc.fake_elf("NCCL"))
    ngc.link(tree, "/usr/local/cuda/lib64/libnccl.so.2", "libnccl.so.2.29.3")
    checks = audit_tree(tree)
    assert checks["library-shadowing:nccl"].status == WARN
    assert checks["library-shadowing:nccl"].message == (
        "nccl 2.29.3 at /usr/local/cuda/lib64/libnccl.so.2 loads first (/usr/local/cuda/lib64 from "
        "env:LD_LIBRARY_PATH); the newer 2.30.7 at /usr/lib/x86_64-linux-gnu/libnccl.so.2 is shadowed")


def test_two_copies_with_the_newest_first_only_warn(tree: Path) -> None:
    env = ngc.full_image(tree)
    ngc.ofi_plugin(tree, "/opt/amazon/aws-ofi-nccl/lib/libnccl-net-ofi.so", "1.13.2-aws")
    assert "library-shadowing:aws-ofi-nccl" not in audit_tree(tree)  # off the loader's path: inert
    ngc.write_config(tree, {**env, "LD_LIBRARY_PATH": env["LD_LIBRARY_PATH"] + ":/opt/amazon/aws-ofi-nccl/lib"})
    checks = audit_tree(tree)
    assert checks["library-shadowing:aws-ofi-nccl"].status == WARN
    assert failures(checks) == {}


@pytest.mark.parametrize("change, check, words", [
    ({"NCCL_NET_PLUGIN": None}, "net-plugin", "NCCL_NET_PLUGIN not set: NCCL loads the default libnccl-net.so"),
    ({"NCCL_NET_PLUGIN": "ib"}, "net-plugin", "NCCL_NET_PLUGIN is 'ib'"),
    ({"NCCL_IB_HCA": "mlx5_0"}, "infiniband-env", "push NCCL off EFA: NCCL_IB_HCA=mlx5_0"),
    ({"NCCL_NET": "IB"}, "infiniband-env", "NCCL_NET=IB"),
    ({"NCCL_SHARP_DISABLE": "0"}, "infiniband-env", "NCCL_SHARP_DISABLE=0"),
    ({"NCCL_COLLNET_ENABLE": "1"}, "infiniband-env", "NCCL_COLLNET_ENABLE=1"),
    ({"LD_LIBRARY_PATH": "/usr/local/cuda/lib64:/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib"}, "ld-library-path",
     "is not led by /opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib"),
])
def test_env_pitfalls(tree: Path, change: dict, check: str, words: str) -> None:
    env = ngc.full_image(tree)
    env.update(change)
    ngc.write_config(tree, {k: v for k, v in env.items() if v is not None})
    bad = failures(audit_tree(tree))
    assert words in bad[check]


def test_ib_disable_is_not_an_infiniband_setting(tree: Path) -> None:
    env = ngc.full_image(tree)
    ngc.write_config(tree, {**env, "NCCL_IB_DISABLE": "1"})
    assert audit_tree(tree)["infiniband-env"].status == PASS


def test_second_open_mpi(tree: Path) -> None:
    ngc.full_image(tree)
    ngc.write(tree, "/opt/amazon/openmpi5/include/mpi.h",
              "#define OMPI_MAJOR_VERSION 5\n#define OMPI_MINOR_VERSION 0\n#define OMPI_RELEASE_VERSION 6\n")
    ngc.write(tree, "/opt/amazon/openmpi5/bin/mpirun", "#!/bin/sh\n")
    # as the EFA installer leaves it: present, but on no loader path, so nothing mixes them
    idle = audit_tree(tree)["openmpi"]
    assert idle.status == WARN and "also present, on no loader path or OPAL_PREFIX: /opt/amazon/openmpi5" in idle.message
    # once the loader is pointed into it, programs mix the two
    ngc.write(tree, "/etc/ld.so.conf.d/zz-openmpi.conf", "/opt/amazon/openmpi5/lib\n")
    bad = failures(audit_tree(tree))
    assert bad["openmpi"].startswith("2 Open MPI installations in use: /usr/local/mpi -> /opt/hpcx/ompi (5.0.7); "
                                     "/opt/amazon/openmpi5 (5.0.6)")


@pytest.mark.parametrize("records", [True, False], ids=["with-dpkg-records", "files-only"])
def test_debian_s_runtime_open_mpi_beside_the_base_s_is_two_in_use(tree: Path, records: bool) -> None:
    """The guide's pitfall as apt makes it: `apt-get install libopenmpi3` puts libmpi.so.40 on the
    loader's default path, where HPC-X's is in use too."""
    ngc.full_image(tree)
    ngc.add_debian_openmpi(tree, records=records)
    bad = failures(audit_tree(tree))
    assert bad["openmpi"].startswith("2 Open MPI installations in use: /usr/lib/x86_64-linux-gnu (4.1.4); "
                                     "/usr/local/mpi -> /opt/hpcx/ompi (5.0.7)")


def test_the_open_mpi_policy_reads_the_installation_in_use(tree: Path) -> None:
    """min_versions.openmpi is about the Open MPI programs use: NGC's, not the EFA installer's
    left beside it; with Debian's in use too, no one release is the image's."""
    ngc.full_image(tree)
    ngc.write(tree, "/opt/amazon/openmpi/include/mpi.h",
              "#define OMPI_MAJOR_VERSION 4\n#define OMPI_MINOR_VERSION 1\n#define OMPI_RELEASE_VERSION 8\n")
    policy = AuditPolicy(min_versions=(("openmpi", "5.0.0"),))
    assert audit_tree(tree, policy=policy)["policy-min:openmpi"].message == "openmpi 5.0.7 >= 5.0.0"
    ngc.add_debian_openmpi(tree)
    assert failures(audit_tree(tree, policy=policy))["policy-min:openmpi"] == (
        "openmpi version unknown; policy requires >= 5.0.0")


def test_a_manifest_made_before_cublas_and_triton_were_probed_still_describes_its_image(tree: Path) -> None:
    from efabuild.provenance.audit import manifest_vs_image
    from efabuild.provenance.measured import Measured

    ngc.full_image(tree)
    image = probe_tree(DirView(tree))
    data = image.to_dict()
    older = {**data, "components": {k: v for k, v in data["components"].items() if k not in ("cublas", "triton")}}
    assert manifest_vs_image(Measured.from_dict(older), image).status == PASS
    changed = {**data, "components": {**data["components"], "cublas": {"version": "12.0.0.1", "source": "x"}}}
    assert manifest_vs_image(Measured.from_dict(changed), image).status == FAIL


def test_ofi_plugin_missing(tree: Path) -> None:
    ngc.full_image(tree)
    (tree / "opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so").unlink()
    bad = failures(audit_tree(tree))
    assert bad["ofi-plugin"] == "no aws-ofi-nccl plugin (libnccl-net-ofi.so) in the image"
    assert bad["policy-min:aws-ofi-nccl"] == "aws-ofi-nccl version unknown; policy requires >= 1.19.0"


def test_ofi_plugin_off_the_library_path(tree: Path) -> None:
    env = ngc.full_image(tree)
    shutil.move(tree / "opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so", tree / "opt/plugin-elsewhere.so")
    ngc.ofi_plugin(tree, "/opt/amazon/aws-ofi-nccl/lib/libnccl-net-ofi.so", ngc.OFI)  # not searched
    ngc.write_config(tree, env)
    bad = failures(audit_tree(tree))
    assert "installed (/opt/amazon/aws-ofi-nccl/lib/libnccl-net-ofi.so) but NCCL would not load it" in bad["ofi-plugin"]


def test_missing_etc_environment(tree: Path) -> None:
    ngc.full_image(tree)
    (tree / "etc/environment").unlink()
    checks = audit_tree(tree)
    assert "Enroot/Pyxis would start it without its ENV" in checks["environment"].message
    assert checks["environment"].status == FAIL and checks["net-plugin"].status == "skip"


def test_stale_base_declaration_warns(tree: Path) -> None:
    env = ngc.full_image(tree)
    ngc.write_config(tree, {**env, "NCCL_VERSION": "2.29.3"})
    checks = audit_tree(tree)
    assert checks["base-declared:NCCL_VERSION"].status == WARN
    assert "env:NCCL_VERSION=2.29.3, but nccl 2.30.7 is installed" in checks["base-declared:NCCL_VERSION"].message


def test_policy_known_bad_combination_and_pins(tree: Path) -> None:
    ngc.full_image(tree, version="1.28.0")
    policy = AuditPolicy(known_bad=POLICY.known_bad, required_pins=("base-digest", "deepep-commit", "arg:MISSING"))
    bad = failures(audit_tree(tree, policy=policy, host=HostFacts(), base={"ref": ngc.BASE_REF, "digest": None}))
    assert bad["policy-known-bad"] == (
        "nccl 2.30.7 with efa-installer 1.28.0: NCCL 2.19+ needs aws-ofi-nccl from EFA installer 1.29 or newer")
    assert bad["policy-pin:base-digest"] == f"base {ngc.BASE_REF} is not pinned by digest"
    assert bad["policy-pin:arg:MISSING"] == "build arg MISSING is not set in the layer chain"
    assert "policy-pin:deepep-commit" not in bad


def test_host_efa_comes_from_flag_then_host_file_then_policy(tmp_path: Path) -> None:
    host_file = tmp_path / "efa_installed_packages"
    assert host_facts(None, POLICY, host_file) == HostFacts("1.50.0", "BUILD.toml [audit] host_efa_installer")
    host_file.write_text("# EFA installer version: 1.47.0\n# Debug packages installed: no\n")
    assert host_facts(None, POLICY, host_file) == HostFacts("1.47.0", str(host_file))
    assert host_facts("1.49.0", POLICY, host_file) == HostFacts("1.49.0", "--host-efa")
    assert host_facts(None, AuditPolicy(), tmp_path / "absent") == HostFacts()


# ---- the artifact's machine -------------------------------------------------------------------
ARM64_OFI = "/opt/amazon/ofi-nccl/lib/aarch64-linux-gnu/libnccl-net-ofi.so"


def arm64_tree(tree: Path) -> None:
    ngc.full_image(tree, machine="aarch64", triplet_dir=True)


def test_clean_arm64_artifact_passes_every_check(tree: Path) -> None:
    arm64_tree(tree)
    checks = audit_tree(tree, chain=ngc.chain_for(KEY, platform="linux/arm64"))
    # the base's plugin in /opt/amazon/ofi-nccl/lib stays beside the installer's per-triplet one
    assert {name: c.status for name, c in checks.items() if c.status != PASS} == {
        "library-shadowing:aws-ofi-nccl": WARN}
    assert checks["elf-machine"].message.endswith("programs, libraries and plugins are aarch64")
    assert checks["ld-library-path"].message == "led by /opt/amazon/ofi-nccl/lib/aarch64-linux-gnu:/opt/amazon/efa/lib"


@pytest.mark.parametrize("foreign", [
    ARM64_OFI,  # the network plugin NCCL loads
    "/opt/amazon/ofi-nccl/lib/aarch64-linux-gnu/libnccl-tuner-ofi.so",  # a tuner plugin on the path
    "/opt/amazon/efa/lib/libfabric/libefa-fi.so",  # a libfabric provider
    "/usr/lib/aarch64-linux-gnu/libnccl.so.2.30.7",  # NCCL itself
])
def test_arm64_image_carrying_an_x86_64_file_fails_naming_it(tree: Path, foreign: str) -> None:
    arm64_tree(tree)
    ngc.write(tree, foreign, ngc.fake_elf("aws-ofi-nccl 1.21.1", machine=ngc.EM_X86_64))
    bad = failures(audit_tree(tree, chain=ngc.chain_for(KEY, platform="linux/arm64")))
    assert bad["elf-machine"].startswith(f"{foreign} is x86_64: not aarch64 as the artifact's platform linux/arm64")
    assert "1 x86_64" in bad["elf-machine"]


def test_x86_64_image_published_as_arm64_fails_and_mixed_image_without_platform_fails(tree: Path) -> None:
    ngc.full_image(tree)
    bad = failures(audit_tree(tree, chain=ngc.chain_for(KEY, platform="linux/arm64")))
    assert "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so is x86_64" in bad["elf-machine"]
    assert "not aarch64 as the artifact's platform linux/arm64" in bad["elf-machine"]
    # no platform in the chain (made by hand): the image's majority is the reference
    ngc.write(tree, "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so", ngc.fake_elf(machine=ngc.EM_AARCH64))
    chain = ngc.chain_for(KEY)
    del chain[-1]["inputs"]["platform"]
    bad = failures(audit_tree(tree, chain=chain))
    assert bad["elf-machine"].startswith("/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so is aarch64: not x86_64 as "
                                         "most of the image's files (ELF headers)")


def test_x86_64_only_plugin_directory_first_in_an_arm64_image_fails_ld_library_path(tree: Path) -> None:
    arm64_tree(tree)
    env = ngc.parse_env(tree)
    env["LD_LIBRARY_PATH"] = env["LD_LIBRARY_PATH"].replace("aarch64-linux-gnu", "x86_64-linux-gnu")
    ngc.write_config(tree, env)
    bad = failures(audit_tree(tree, chain=ngc.chain_for(KEY, platform="linux/arm64")))
    assert "is not led by /opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib" in bad["ld-library-path"]


# ---- real .sqsh files in a real store ----------------------------------------------------------
@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "clean"
    ngc.full_image(root)
    ngc.publish(tmp_path / "store", root, tmp_path / "work", KEY)
    return tmp_path / "store"


def run_audit(capsys, *argv: str) -> tuple[int, list]:
    code = main(["audit", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)["artifacts"]


def statuses(report: list) -> dict[str, str]:
    return {c["check"]: c["status"] for c in report[0]["checks"]}


@pytest.mark.slow
def test_stored_clean_artifact_passes_from_a_bare_store(store: Path, capsys) -> None:
    code, report = run_audit(capsys, "ngc-efa:deepep", "--store", str(store), "--host-efa", "1.50.0")
    assert code == 0 and report[0]["ok"] is True and report[0]["key"] == KEY
    assert set(statuses(report).values()) == {PASS}


@pytest.mark.slow
def test_stored_arm64_artifact_with_an_x86_64_plugin_fails_audit_naming_it(tmp_path: Path, capsys) -> None:
    root = tmp_path / "arm64"
    arm64_tree(root)
    ngc.write(root, ARM64_OFI, ngc.fake_elf("aws-ofi-nccl 1.21.1", machine=ngc.EM_X86_64))
    ngc.publish(tmp_path / "store", root, tmp_path / "work", KEY, chain=ngc.chain_for(KEY, platform="linux/arm64"))
    code, report = run_audit(capsys, KEY[:12], "--store", str(tmp_path / "store"), "--host-efa", "1.50.0")
    checks = {c["check"]: c for c in report[0]["checks"]}
    assert code == 1 and checks["elf-machine"]["status"] == FAIL
    assert checks["elf-machine"]["message"].startswith(f"{ARM64_OFI} is x86_64: not aarch64")
    # measured again as make measured it: the manifest describes the image
    assert checks["manifest-vs-image"]["status"] == PASS
    manifest = json.loads((tmp_path / "store" / "objects" / KEY[:2] / f"{KEY}.manifest.json").read_text())
    assert manifest["measured"]["machine"] == {"name": "aarch64", "architecture": "arm64",
                                               "source": "platform linux/arm64"}
    assert manifest["measured"]["elf"][ARM64_OFI] == "x86_64"


@pytest.mark.slow
def test_flipped_byte_in_the_sqsh_is_caught(store: Path, capsys) -> None:
    sqsh = store / "objects" / KEY[:2] / f"{KEY}.sqsh"
    data = bytearray(sqsh.read_bytes())
    data[len(data) // 2] ^= 0x01
    sqsh.chmod(0o644)
    sqsh.write_bytes(bytes(data))
    code, report = run_audit(capsys, KEY[:12], "--store", str(store))
    assert code == 1
    message = next(c["message"] for c in report[0]["checks"] if c["check"] == "sqsh-integrity")
    assert message.startswith(f"store tier: the .sqsh was altered or damaged: digest blake3:")
    assert "but the record says" in message


@pytest.mark.slow
def test_a_truncated_sqsh_is_audited_as_it_stands_and_named(store: Path, capsys) -> None:
    """The copy a lookup refuses to hand out (its size is not its record's) is still audited."""
    sqsh = store / "objects" / KEY[:2] / f"{KEY}.sqsh"
    size = sqsh.stat().st_size
    sqsh.chmod(0o644)
    os.truncate(sqsh, size // 2)
    code, report = run_audit(capsys, KEY[:12], "--store", str(store))
    integrity = next(c for c in report[0]["checks"] if c["check"] == "sqsh-integrity")
    assert code == 1 and integrity["status"] == FAIL
    assert integrity["message"].startswith("store tier: ") and str(size // 2) in integrity["message"], integrity


@pytest.mark.slow
def test_every_tier_holding_the_artifact_is_checked_and_the_damaged_one_named(
        store: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    shared = tmp_path / "fsx"
    shutil.copytree(store, shared)
    ngc.write(tmp_path / "ws", "/BUILD.toml", f'[store]\nlocal = "{store}"\nshared = "{shared}"\n')
    ngc.write(tmp_path / "ws", "/graphs/demo.toml", '[layers.base]\nbase = "busybox:1.36"\ndockerfile = "RUN true"\n')
    monkeypatch.delenv("EFABUILD_STORE", raising=False)
    monkeypatch.chdir(tmp_path / "ws")
    code, report = run_audit(capsys, KEY[:12], "--host-efa", "1.50.0")
    integrity = next(c for c in report[0]["checks"] if c["check"] == "sqsh-integrity")
    assert code == 0 and integrity["message"].endswith("as recorded, on shared, local")
    local = store / "objects" / KEY[:2] / f"{KEY}.sqsh"  # the copy lookup does not hand out
    data = bytearray(local.read_bytes())
    data[len(data) // 2] ^= 0x01
    local.unlink()
    local.write_bytes(bytes(data))
    code, report = run_audit(capsys, KEY[:12], "--host-efa", "1.50.0")
    integrity = next(c for c in report[0]["checks"] if c["check"] == "sqsh-integrity")
    assert code == 1 and integrity["status"] == FAIL
    assert integrity["message"].startswith("local tier: the .sqsh was altered or damaged: digest blake3:")
    assert "shared tier" not in integrity["message"]


@pytest.mark.slow
def test_audit_all_on_a_node_fails_for_an_artifact_it_cannot_read(store: Path, tmp_path: Path, capsys,
                                                                  monkeypatch) -> None:
    other = "ab" * 32
    objects = store / "objects" / other[:2]
    objects.mkdir(parents=True, exist_ok=True)
    shutil.copy(store / "objects" / KEY[:2] / f"{KEY}.sqsh", objects / f"{other}.sqsh")
    (objects / f"{other}.json").write_text("{not json")
    monkeypatch.setenv("EFABUILD_STORE", str(store))  # a bare store, as on a compute node
    monkeypatch.chdir(tmp_path)
    code = main(["audit", "--all", "--host-efa", "1.50.0", "--json"])
    report = json.loads(capsys.readouterr().out)["artifacts"]
    assert code == 1
    assert {r["key"]: r["ok"] for r in report} == {KEY: True, other: False}
    failed = next(r for r in report if r["key"] == other)["checks"][0]
    assert failed["status"] == FAIL and failed["message"].startswith(f"store tier: unreadable: {objects / other}.json")


@pytest.mark.slow
def test_edited_manifest_is_caught(store: Path, capsys) -> None:
    path = store / "objects" / KEY[:2] / f"{KEY}.manifest.json"
    path.chmod(0o644)
    path.write_bytes(path.read_bytes().replace(b'"1.21.1"', b'"1.22.0"'))
    code, report = run_audit(capsys, "ngc-efa:deepep", "--store", str(store))
    assert code == 1
    assert statuses(report)["manifest-integrity"] == FAIL
    message = next(c["message"] for c in report[0]["checks"] if c["check"] == "manifest-integrity")
    assert message.startswith("the manifest was edited: digest blake3:")


@pytest.mark.slow
def test_manifest_rewritten_with_its_record_is_caught_by_measuring_again(store: Path, capsys) -> None:
    # whoever edits the manifest and its recorded digest together still cannot hide a drift
    obj = store / "objects" / KEY[:2]
    manifest = json.loads((obj / f"{KEY}.manifest.json").read_bytes())
    manifest["measured"]["components"]["aws-ofi-nccl"]["version"] = "1.22.0"
    data = manifests.encode(manifest)
    record = json.loads((obj / f"{KEY}.json").read_text())
    record["manifest_digest"] = manifests.digest(data)
    for name, content in ((f"{KEY}.manifest.json", data), (f"{KEY}.json", json.dumps(record).encode())):
        (obj / name).chmod(0o644)
        (obj / name).write_bytes(content)
    code, report = run_audit(capsys, "ngc-efa:deepep", "--store", str(store))
    assert code == 1
    by_name = {c["check"]: c for c in report[0]["checks"]}
    assert by_name["manifest-integrity"]["status"] == PASS
    assert by_name["manifest-vs-image"]["message"] == (
        "the manifest does not describe this image: aws-ofi-nccl version: manifest 1.22.0, image 1.21.1")


@pytest.mark.slow
def test_table_output_and_exit_status(store: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("EFABUILD_STORE", str(store))  # a bare store, as on a compute node
    monkeypatch.chdir(tmp_path)
    assert main(["audit", "--all", "--host-efa", "1.49.0"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"ngc-efa:deepep {KEY[:12]}"
    assert "host-efa" in out and "image has EFA installer 1.50.0, host has 1.49.0 (--host-efa)" in out
    assert out.rstrip().endswith("1 failed, 0 warnings, 12 checks")


@pytest.mark.slow
def test_policy_comes_from_the_workspace(store: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    ws = tmp_path / "ws"
    ngc.write(ws, "/BUILD.toml", f'[store]\nlocal = "{store}"\n\n[audit]\nhost_efa_installer = "1.50.0"\n'
                                 'min_versions = { "aws-ofi-nccl" = "1.22.0" }\n')
    ngc.write(ws, "/graphs/demo.toml", '[layers.base]\nbase = "busybox:1.36"\ndockerfile = "RUN true"\n')
    monkeypatch.delenv("EFABUILD_STORE", raising=False)
    monkeypatch.chdir(ws)
    code, report = run_audit(capsys, "ngc-efa:deepep")
    by_name = {c["check"]: c for c in report[0]["checks"]}
    assert code == 1
    assert by_name["policy-min:aws-ofi-nccl"]["message"] == \
        "aws-ofi-nccl 1.21.1 is older than the policy minimum 1.22.0"
    assert by_name["host-efa"]["status"] == PASS


@pytest.mark.slow
def test_unknown_ref_and_bad_usage(store: Path, capsys) -> None:
    code, report = run_audit(capsys, "ngc-efa:nope", "--store", str(store))
    assert code == 1 and report[0]["checks"][0]["message"].startswith("no artifact named ngc-efa:nope")
    assert main(["audit", "--store", str(store)]) == 2
    assert "give one or more REF" in capsys.readouterr().err


# ---- end to end through the real engine and exporter -------------------------------------------
@pytest.mark.engine
def test_image_built_and_exported_by_the_engine_audits_clean(docker_engine, tmp_path: Path, capsys) -> None:
    """The image config's ENV and LABELs reach the .sqsh as Enroot files, and the probe reads them."""
    import os
    import subprocess
    import uuid
    from datetime import datetime, timezone

    from efabuild.settings import ExportSettings
    from efabuild.provenance.stored import describe_sqsh
    from efabuild.export.squash import export_image
    from efabuild.store import ArtifactRecord, Store

    context = tmp_path / "context"
    env = ngc.full_image(context / "root")
    for written_by_export in ("etc/environment", "etc/rc"):
        (context / "root" / written_by_export).unlink()
    lines = ["FROM scratch", "COPY root/ /"]
    lines += [f'ENV {name}="{value}"' for name, value in env.items()]
    lines += [f'LABEL {name}="{value}"' for name, value in ngc.base_labels().items()]
    (context / "Dockerfile").write_text("\n".join(lines) + "\n")
    tag = f"efabuild-test/provenance:{uuid.uuid4().hex[:12]}"
    subprocess.run(["docker", "build", "-q", "-t", tag, str(context)], check=True, capture_output=True,
                   env={**os.environ, "DOCKER_BUILDKIT": "1"})
    try:
        result = export_image(tag, tmp_path / "out.sqsh", options=ExportSettings())
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)
    manifest = describe_sqsh(
        result.path, key=KEY, name="ngc-efa:deepep", sqsh_digest=result.digest,
        export_options={"mksquashfs": list(result.options)},
        base={"ref": ngc.BASE_REF, "digest": ngc.BASE_DIGEST}, chain=ngc.chain_for(KEY),
        builder={"buildkit": "engine"}, times={"finished": datetime.now(timezone.utc)},
    )
    measured = json.loads(manifest)["measured"]
    assert measured["env"]["source"] == "/etc/environment"
    assert measured["env"]["vars"]["NCCL_NET_PLUGIN"] == "ofi"
    assert measured["declared_by_base"]["com.nvidia.nccl.version"]["source"] == "label:com.nvidia.nccl.version"
    store = Store.at(tmp_path / "store", show_progress=False)
    store.publish(KEY, result.path, ArtifactRecord.for_file(KEY, "ngc-efa:deepep", result.path, result.digest),
                  manifest)
    code, report = run_audit(capsys, KEY, "--store", str(tmp_path / "store"), "--host-efa", ngc.INSTALLER)
    assert (code, {c["status"] for c in report[0]["checks"]}) == (0, {PASS})


# ---- the demo graph's real layers on the offline mini NGC base ---------------------------------
REPO = Path(__file__).resolve().parents[2]


class DemoBuilds:
    """Builds the demo graph's layers (and variants on top) with the engine, exports them like
    `efabuild make` and publishes them with their manifests into one store."""

    def __init__(self, work: Path) -> None:
        from python_on_whales import docker

        from efabuild.workspace import load_workspace

        self.docker, self.work, self.tags = docker, work, []
        self.layers = load_workspace(REPO).layers
        self.store = work / "store"

    def build(self, parent: str, text: str, args: dict[str, str] | None = None) -> str:
        import uuid

        tag = f"efabuild-test/provenance:{uuid.uuid4().hex[:12]}"
        dockerfile = self.work / f"{tag.rsplit(':', 1)[1]}.Dockerfile"
        dockerfile.write_text(f"FROM {parent}\n{text}")
        self.tags.append(tag)
        self.docker.buildx.build(REPO, file=dockerfile, tags=[tag], build_args=args or {}, load=True,
                                 progress=False)
        return tag

    def layer(self, parent: str, qualname: str) -> str:
        layer = self.layers[qualname]
        return self.build(parent, layer.dockerfile, layer.args_dict)

    def publish(self, tag: str, name: str, chain: list[tuple[str, str, dict]]) -> str:
        """Export `tag` and publish it; chain: (qualname, Dockerfile text, args) from the base up."""
        from datetime import datetime, timezone

        from efabuild.host.digest import bytes_digest
        from efabuild.settings import ExportSettings
        from efabuild.provenance.stored import describe_sqsh
        from efabuild.export.squash import export_image
        from efabuild.store import ArtifactRecord, Store

        key = bytes_digest(tag.encode()).split(":")[1]
        result = export_image(tag, self.work / f"{key}.sqsh", options=ExportSettings())
        manifest = describe_sqsh(
            result.path, key=key, name=name, sqsh_digest=result.digest,
            export_options={"mksquashfs": list(result.options)},
            base={"ref": "efabuild-fixtures/pytorch:26.08-py3", "digest": None},
            chain=[{"layer": q, "key": bytes_digest(f"{key}{q}".encode()).split(":")[1],
                    "inputs": {"dockerfile": text, "args": args}} for q, text, args in chain],
            builder={"buildkit": "engine"}, times={"finished": datetime.now(timezone.utc)},
        )
        Store.at(self.store, show_progress=False).publish(
            key, result.path, ArtifactRecord.for_file(key, name, result.path, result.digest), manifest)
        result.path.unlink()
        return key

    def close(self) -> None:
        for tag in self.tags:
            self.docker.image.remove(tag, force=True)


@pytest.fixture(scope="module")
def demo(docker_engine, tmp_path_factory):
    from fixtures.builder import MINI_NGC_TAG, build_fixtures

    build_fixtures()
    builds = DemoBuilds(tmp_path_factory.mktemp("demo"))
    efa = builds.layer(MINI_NGC_TAG, "demo:efa")
    deepep = builds.layer(efa, "demo:deepep")
    builds.efa, builds.deepep = efa, deepep
    builds.chain = [(q, builds.layers[q].dockerfile, builds.layers[q].args_dict)
                    for q in ("demo:efa", "demo:deepep")]
    builds.clean = builds.publish(deepep, "demo:deepep", builds.chain)
    yield builds
    builds.close()


def audit_demo(demo: DemoBuilds, capsys, key: str, *flags: str) -> dict:
    code = main(["-C", str(REPO), "audit", key, "--store", str(demo.store), "--json", *flags])
    report = json.loads(capsys.readouterr().out)["artifacts"][0]
    assert code == (0 if report["ok"] else 1)
    return {c["check"]: c for c in report["checks"]}


@pytest.mark.engine
def test_demo_artifact_is_measured_as_the_fixture_installs_it(demo: DemoBuilds) -> None:
    from efabuild.provenance.stored import load_manifest
    from efabuild.store import Store

    m = load_manifest(Store.at(demo.store), demo.clean).manifest["measured"]
    versions = {name: c["version"] for name, c in m["components"].items()}
    assert versions == {
        "ngc-release": "26.08", "cuda": "13.4.1", "nccl": "2.30.7", "cudnn": None, "cublas": None,
        "pytorch": "2.14.0a0+5bcb2a8", "triton": None, "libfabric": "2.6.0", "aws-ofi-nccl": "1.21.1",
        "efa-installer": "1.50.0", "deepep": "1.2.1+94a9f8f",
    }
    assert m["components"]["deepep"]["commit"] == ngc.DEEPEP_COMMIT
    # the base's libfabric file stays beside the new one, unreachable by its name
    assert sorted((c["path"], c["version"]) for c in m["components"]["libfabric"]["copies"]) == [
        ("/opt/amazon/efa/lib/libfabric.so.1.28.0", "2.4.0"), ("/opt/amazon/efa/lib/libfabric.so.1.30.0", "2.6.0")]
    # the installer's own Open MPI 4 and 5 beside NGC's, as the real installer leaves them
    assert sorted((o["path"], o["version"]) for o in m["openmpi"]) == [
        ("/opt/amazon/openmpi", "4.1.8"), ("/opt/amazon/openmpi5", "5.0.8"), ("/usr/local/mpi", "5.0.7")]
    assert m["env"]["vars"]["LD_LIBRARY_PATH"].startswith("/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:")


@pytest.mark.engine
def test_demo_artifact_audits_clean_with_the_workspace_policy(demo: DemoBuilds, capsys) -> None:
    checks = audit_demo(demo, capsys, demo.clean)
    # the one warning: the installer's Open MPI is there, merely present (pitfall 4 needs it in use)
    assert {n: (c["status"], c["message"]) for n, c in checks.items() if c["status"] != PASS} == {
        "openmpi": (WARN, "/usr/local/mpi -> /opt/hpcx/ompi (5.0.7) in use; also present, on no loader path or "
                          "OPAL_PREFIX: /opt/amazon/openmpi (4.1.8); /opt/amazon/openmpi5 (5.0.8) (keep them off PATH too)")}
    assert checks["host-efa"]["message"] == "EFA installer 1.50.0 on image and host " \
                                            "(BUILD.toml [audit] host_efa_installer)"
    assert "policy-known-bad" in checks and "policy-min:aws-ofi-nccl" in checks
    other_host = audit_demo(demo, capsys, demo.clean, "--host-efa", "1.49.0")
    assert other_host["host-efa"]["status"] == FAIL


INSTALL_1_49 = """\
RUN apt-get update && cd /tmp \\
 && curl -fsSL -O https://efa-installer.amazonaws.com/aws-efa-installer-1.49.0.tar.gz \\
 && tar -xf aws-efa-installer-1.49.0.tar.gz && cd aws-efa-installer \\
 && ./efa_installer.sh -y -g --skip-kmod --skip-limit-conf --no-verify \\
 && cd / && rm -rf /tmp/aws-efa-installer* /var/lib/apt/lists/*
"""


@pytest.mark.engine
@pytest.mark.parametrize("variant, check, words", [
    (INSTALL_1_49, "declared:EFA_INSTALLER_VERSION",
     "EFA_INSTALLER_VERSION=1.50.0 declared in demo:efa, but efa-installer 1.49.0 is installed"),
    ("ENV LD_LIBRARY_PATH=${LD_LIBRARY_PATH}:/opt/amazon/openmpi/lib\n", "openmpi",
     "2 Open MPI installations in use: /usr/local/mpi -> /opt/hpcx/ompi (5.0.7); /opt/amazon/openmpi (4.1.8)"),
    ("ENV OPAL_PREFIX=/opt/amazon/openmpi5\n", "openmpi",
     "2 Open MPI installations in use: /usr/local/mpi -> /opt/hpcx/ompi (5.0.7); /opt/amazon/openmpi5 (5.0.8)"),
    ("ENV NCCL_NET_PLUGIN=socket\n", "net-plugin", "NCCL_NET_PLUGIN is 'socket'"),
    ("ENV LD_LIBRARY_PATH=/host/opt/amazon/efa/lib:${LD_LIBRARY_PATH}\n", "ld-library-path",
     "LD_LIBRARY_PATH=/host/opt/amazon/efa/lib:/opt/amazon/ofi-nccl/lib:"),
    ("ENV NCCL_IB_HCA=mlx5_0 NCCL_IB_GID_INDEX=3\n", "infiniband-env", "NCCL_IB_GID_INDEX=3, NCCL_IB_HCA=mlx5_0"),
    ("RUN rm /opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so\n", "ofi-plugin",
     "no aws-ofi-nccl plugin (libnccl-net-ofi.so) in the image"),
    ("RUN mkdir -p /opt/aws-ofi-nccl/lib "
     "&& printf 'aws-ofi-nccl 1.13.2-aws\\n' > /opt/aws-ofi-nccl/lib/libnccl-net-ofi.so\n"
     "ENV LD_LIBRARY_PATH=/opt/aws-ofi-nccl/lib:${LD_LIBRARY_PATH}\n", "library-shadowing:aws-ofi-nccl",
     "aws-ofi-nccl 1.13.2-aws at /opt/aws-ofi-nccl/lib/libnccl-net-ofi.so loads first (/opt/aws-ofi-nccl/lib from "
     "env:LD_LIBRARY_PATH); the newer 1.21.1 at /opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so is shadowed"),
], ids=["installer-drift", "second-openmpi", "opal-prefix", "net-plugin", "host-lib-path", "infiniband-env", "no-ofi-plugin",
        "shadowed-plugin"])
def test_demo_variants_are_caught(demo: DemoBuilds, capsys, variant: str, check: str, words: str) -> None:
    tag = demo.build(demo.deepep, variant)
    key = demo.publish(tag, "demo:variant", demo.chain + [("demo:variant", variant, {})])
    checks = audit_demo(demo, capsys, key)
    assert checks[check]["status"] == FAIL and words in checks[check]["message"]


def test_elf_machine_skips_an_image_without_elf_files(tree: Path) -> None:
    ngc.write(tree, "/usr/lib/x86_64-linux-gnu/libnccl.so.2.30.7", "fixture shared library stand-in\n")
    checks = audit_tree(tree)
    assert checks["elf-machine"].status == "skip"
    assert checks["elf-machine"].message.startswith("no ELF program, library or plugin read")


def test_elf_machine_names_the_first_foreign_files_and_counts_the_rest(tree: Path) -> None:
    arm64_tree(tree)
    for number in range(12):
        ngc.write(tree, f"/opt/amazon/efa/lib/libfabric/libprov{number:02}-fi.so", ngc.fake_elf(machine=ngc.EM_X86_64))
    message = failures(audit_tree(tree, chain=ngc.chain_for(KEY, platform="linux/arm64")))["elf-machine"]
    assert message.count(" is x86_64") == 8 and "; and 4 more: not aarch64" in message
    assert "files read: " in message and "12 x86_64" in message
