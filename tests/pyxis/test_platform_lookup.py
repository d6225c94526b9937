"""One job script for both partitions: `efabuild lookup NAME` and `efabuild://NAME` in the Pyxis
importer give each node the artifact of its own platform, `--require-signature` trusts a name's
platform index only when a trusted key signed it, and `diff NAME@a NAME@b` says whether the
platforms agree.

This machine has one architecture: "the other" node is the CLI run with os.uname's machine
replaced (tests/kits/platformkit.py), which is all efabuild reads of the host to pick a platform.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest

from efabuild.platforms import index_bytes
from efabuild.signing.keys import PemSigner
from efabuild.store.tiered import Store
from efabuild.store.tiers.fs import FilesystemTier
from tests.kits.storekit import cache_dir
from tests.kits.inprocess import run_efabuild
from tests.kits.platformkit import NAME, as_machine, index_of, publish_platforms, rewrite_index
from tests.kits.signkit import make_key, trust_config
from tests.kits.storekit import key_for

ARM_NODE, X86_NODE = "aarch64", "x86_64"


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "fsx"


def lookup(*args: str, env: dict | None = None, cwd: Path) -> tuple[int, str, str]:
    environ = {k: v for k, v in os.environ.items() if k != "EFABUILD_PLATFORM"}
    result = run_efabuild(["lookup", *args], env={**environ, **(env or {})}, cwd=cwd)
    return result.returncode, result.stdout, result.stderr


def sqsh(root: Path, key: str) -> str:
    return f"{root}/objects/{key[:2]}/{key}.sqsh\n"


def test_the_same_lookup_line_gives_each_node_its_platforms_artifact(store_dir, tmp_path, monkeypatch):
    keys = publish_platforms(Store([FilesystemTier(store_dir, "shared")], show_progress=False), tmp_path)
    for machine, platform in ((ARM_NODE, "linux/arm64"), (X86_NODE, "linux/amd64")):
        as_machine(monkeypatch, machine)
        assert lookup("--store", str(store_dir), NAME, cwd=tmp_path) == (0, sqsh(store_dir, keys[platform]), "")
    # $EFABUILD_PLATFORM, --platform and NAME@os/arch say it on any node
    as_machine(monkeypatch, X86_NODE)
    arm = (0, sqsh(store_dir, keys["linux/arm64"]), "")
    assert lookup("--store", str(store_dir), NAME, env={"EFABUILD_PLATFORM": "linux/arm64"}, cwd=tmp_path) == arm
    assert lookup("--store", str(store_dir), "--platform", "linux/arm64", NAME, cwd=tmp_path) == arm
    assert lookup("--store", str(store_dir), f"{NAME}@linux/arm64", cwd=tmp_path) == arm
    code, out, _ = lookup("--store", str(store_dir), "--json", f"{NAME}@linux/arm64", cwd=tmp_path)
    assert code == 0 and json.loads(out)["platform"] == "linux/arm64" and json.loads(out)["key"] == keys["linux/arm64"]
    # the key a job names its container by is the node's platform's, as the path is
    assert lookup("--store", str(store_dir), "--key", NAME, cwd=tmp_path) == (0, keys["linux/amd64"] + "\n", "")
    for asked in (["--platform", "linux/arm64", NAME], [f"{NAME}@linux/arm64"]):
        assert lookup("--store", str(store_dir), "--key", *asked, cwd=tmp_path) == (0, keys["linux/arm64"] + "\n", "")
    as_machine(monkeypatch, ARM_NODE)
    assert lookup("--store", str(store_dir), "--key", NAME, cwd=tmp_path) == (0, keys["linux/arm64"] + "\n", "")


def test_a_name_without_the_nodes_platform_is_one_line_and_exit_1(store_dir, tmp_path, monkeypatch):
    publish_platforms(Store([FilesystemTier(store_dir, "shared")], show_progress=False), tmp_path,
                      platforms=("linux/amd64",))
    as_machine(monkeypatch, ARM_NODE)
    assert lookup("--store", str(store_dir), NAME, cwd=tmp_path) == (
        1, "", "efabuild: demo:train has no linux/arm64 artifact (it has linux/amd64); build it with [builder] "
               "platforms or set EFABUILD_PLATFORM\n")
    # where $EFABUILD_PLATFORM asked for it, the line says so rather than suggesting to set it
    assert lookup("--store", str(store_dir), NAME, env={"EFABUILD_PLATFORM": "linux/riscv64"}, cwd=tmp_path) == (
        1, "", "efabuild: demo:train has no linux/riscv64 artifact (it has linux/amd64); EFABUILD_PLATFORM chose "
               "linux/riscv64: unset it for this node's platform, or build linux/riscv64 with [builder] platforms\n")


def test_bad_platforms_are_one_line_usage_errors(store_dir, tmp_path, monkeypatch):
    keys = publish_platforms(Store([FilesystemTier(store_dir, "shared")], show_progress=False), tmp_path)
    for args, env, says in [
        ([NAME], {"EFABUILD_PLATFORM": "linux/amd64;$(reboot)"},
         "efabuild: EFABUILD_PLATFORM: must be os/arch[/variant], like linux/amd64 or linux/arm64, not "
         "'linux/amd64;$(reboot)'\n"),
        ([f"{NAME}@arm64"], {}, "efabuild: demo:train@arm64: must be os/arch[/variant], like linux/amd64 or "
                                "linux/arm64, not 'arm64'\n"),
        ([f"{keys['linux/arm64']}@linux/arm64"], {}, "a key names one artifact of one platform"),
        (["--platform", "linux/amd64", f"{NAME}@linux/arm64"], {}, "--platform says linux/amd64: give one"),
        # a platform string has a length: one line, never the value whole
        (["--platform", "linux/" + "a" * 5000, "nope:absent"], {}, "efabuild: --platform: must be os/arch"),
        ([NAME], {"EFABUILD_PLATFORM": "linux/" + "a" * 5000}, "efabuild: EFABUILD_PLATFORM: must be os/arch"),
    ]:
        code, out, err = lookup("--store", str(store_dir), *args, env=env, cwd=tmp_path)
        assert (code, out, err.count("\n")) == (2, "", 1) and says in err and len(err) < 300, err


def test_a_key_names_its_artifact_on_either_node_with_a_warning(store_dir, tmp_path, monkeypatch):
    keys = publish_platforms(Store([FilesystemTier(store_dir, "shared")], show_progress=False), tmp_path)
    as_machine(monkeypatch, X86_NODE)
    code, out, err = lookup("--store", str(store_dir), keys["linux/arm64"][:12], cwd=tmp_path)
    assert (code, out) == (0, sqsh(store_dir, keys["linux/arm64"]))
    assert err == f"efabuild: warning: {keys['linux/arm64'][:12]} is a linux/arm64 artifact, this node is linux/amd64\n"


def test_an_old_store_name_resolves_as_before(store_dir, tmp_path, monkeypatch):
    from tests.kits.storekit import make_sqsh, record_for

    store = Store([FilesystemTier(store_dir, "shared")], show_progress=False)
    key = key_for("old")
    artifact = make_sqsh(tmp_path, os.urandom(20_000))
    store.publish(key, artifact, record_for(key, NAME, artifact))
    for machine in (ARM_NODE, X86_NODE):
        as_machine(monkeypatch, machine)
        assert lookup("--store", str(store_dir), NAME, cwd=tmp_path) == (0, sqsh(store_dir, key), "")
        code, out, _ = lookup("--store", str(store_dir), "--json", NAME, cwd=tmp_path)
        assert json.loads(out)["platform"] is None


# ---- the importer
def importer_get(uri: str, env: dict, cwd: Path):  # noqa: ANN201
    from efabuild.cli import pyxis_importer_main

    environ = {k: v for k, v in os.environ.items() if k != "EFABUILD_PLATFORM"}
    return run_efabuild(["get", uri], env={**environ, **env}, cwd=cwd, entry=pyxis_importer_main)


def test_the_importer_picks_the_jobs_platform_and_refuses_a_hostile_value(store_dir, tmp_path, monkeypatch):
    keys = publish_platforms(Store([FilesystemTier(store_dir, "shared")], show_progress=False), tmp_path)
    env = {"EFABUILD_STORE": str(store_dir), "EFABUILD_PYXIS_CONFIG": ""}
    as_machine(monkeypatch, ARM_NODE)
    got = importer_get(f"docker://efabuild://{NAME}", env, tmp_path)
    assert (got.returncode, got.stdout) == (0, sqsh(store_dir, keys["linux/arm64"])), got.stderr
    as_machine(monkeypatch, X86_NODE)
    got = importer_get(f"docker://efabuild://{NAME}", env, tmp_path)
    assert (got.returncode, got.stdout) == (0, sqsh(store_dir, keys["linux/amd64"]))
    got = importer_get(f"docker://efabuild://{NAME}", {**env, "EFABUILD_PLATFORM": "linux/arm64"}, tmp_path)
    assert (got.returncode, got.stdout) == (0, sqsh(store_dir, keys["linux/arm64"]))
    got = importer_get(f"docker://efabuild://{NAME}@linux/arm64", env, tmp_path)
    assert (got.returncode, got.stdout) == (0, sqsh(store_dir, keys["linux/arm64"]))
    # a platform the job's $EFABUILD_PLATFORM asked for and the name lacks: the line says who chose it
    got = importer_get(f"docker://efabuild://{NAME}", {**env, "EFABUILD_PLATFORM": "linux/riscv64"}, tmp_path)
    assert (got.returncode, got.stdout) == (1, ""), got.stderr
    assert got.stderr == (f"efabuild: {NAME} has no linux/riscv64 artifact (it has linux/amd64, linux/arm64); "
                          "EFABUILD_PLATFORM chose linux/riscv64: unset it for this node's platform, or build "
                          "linux/riscv64 with [builder] platforms\n")
    hostile = "../../x" + "A" * 5000
    got = importer_get(f"docker://efabuild://{NAME}", {**env, "EFABUILD_PLATFORM": hostile}, tmp_path)
    assert (got.returncode, got.stdout, got.stderr.count("\n")) == (2, "", 1)
    assert got.stderr.startswith("efabuild: EFABUILD_PLATFORM: must be os/arch[/variant]") and len(got.stderr) < 200


# ---- trust
@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    base = tmp_path_factory.mktemp("keys")
    return {"release": make_key(base / "a", "ec"), "other": make_key(base / "b", "ec")}


def signed_store(tmp_path: Path, signer, index_signer=None) -> tuple[Path, dict[str, str]]:  # noqa: ANN001
    """Both platforms of NAME, each artifact signed by `signer`, the index by `index_signer`."""
    from efabuild.signing.attest import signed_index
    from efabuild.store.record import utc_now

    store = Store.at(tmp_path / "store", show_progress=False)
    found = _publish_signed_artifacts(store, tmp_path, signer, "signed", 50_000)
    data = index_bytes(NAME, found, utc_now())
    # as make publishes it: `sign` makes the envelope over the index's bytes
    store.publish_index(NAME, found, data=data,
                        sign=None if index_signer is None else functools.partial(signed_index, signer=index_signer))
    return tmp_path / "store", found


def node_env(tmp_path: Path, store: Path, public: Path) -> dict[str, str]:
    pyxis = tmp_path / "pyxis.toml"
    pyxis.write_text(f'store = "{store}"\nrequire_signature = true\n')
    return {"EFABUILD_TRUST_CONFIG": str(trust_config(tmp_path / "trust.toml", public)),
            "EFABUILD_VERIFY_CACHE": str(cache_dir(tmp_path / "verified")), "EFABUILD_PYXIS_CONFIG": str(pyxis),
            "EFABUILD_STORE": str(store)}


def test_a_signed_index_verifies_under_the_trust_policy_on_both_routes(tmp_path, keys, monkeypatch):
    release = PemSigner(keys["release"][0])
    store, found = signed_store(tmp_path, release, release)
    env = node_env(tmp_path, store, keys["release"][1])
    for machine, platform in ((ARM_NODE, "linux/arm64"), (X86_NODE, "linux/amd64")):
        as_machine(monkeypatch, machine)
        for _ in range(2):  # the second start answers the artifact from the verification cache
            assert lookup("--require-signature", NAME, env=env, cwd=tmp_path) == (0, sqsh(store, found[platform]), "")
            got = importer_get(f"docker://efabuild://{NAME}", env, tmp_path)
            assert (got.returncode, got.stdout) == (0, sqsh(store, found[platform])), got.stderr


@pytest.mark.slow
def test_a_verified_index_costs_the_next_start_no_signature_check(tmp_path, keys):
    from tests.signing.test_sign import cached_lookup  # the lookup process, its clock past the racy window

    release = PemSigner(keys["release"][0])
    store, found = signed_store(tmp_path, release, release)
    env = {**node_env(tmp_path, store, keys["release"][1]), "EFABUILD_PLATFORM": "linux/arm64"}
    code, _, modules = cached_lookup(NAME, env)
    assert code == 0 and "cryptography" in modules  # the index and the artifact verified in full
    code, out, modules = cached_lookup(NAME, env)
    assert (code, out) == (0, sqsh(store, found["linux/arm64"]))
    assert modules == []  # the index's answer from the cache too: no cryptography, no blake3


@pytest.mark.slow
@pytest.mark.parametrize("how", ["unsigned", "signed by another key", "rewritten after signing"])
def test_an_index_not_signed_by_a_trusted_key_is_refused_under_require_signature(tmp_path, keys, monkeypatch, how):
    release, other = PemSigner(keys["release"][0]), PemSigner(keys["other"][0])
    store, found = signed_store(tmp_path, release, {"unsigned": None, "signed by another key": other,
                                                    "rewritten after signing": release}[how])
    if how == "rewritten after signing":  # the envelope kept, the index bytes beside it replaced
        path, _ = index_of(store)
        data = path.read_bytes().replace(found["linux/arm64"].encode(), key_for("foreign").encode())
        new = rewrite_index(store, data)
        envelope = path.with_name(path.name[:-5] + ".dsse.json")
        new.with_name(new.name[:-5] + ".dsse.json").write_bytes(envelope.read_bytes())
    env = node_env(tmp_path, store, keys["release"][1])
    as_machine(monkeypatch, ARM_NODE)
    says = {"unsigned": "unsigned platform index", "signed by another key": "none by a key trusted by",
            "rewritten after signing": "signs other bytes than the platform index beside it"}[how]
    for code, out, err in [lookup("--require-signature", NAME, env=env, cwd=tmp_path),
                           (lambda r: (r.returncode, r.stdout, r.stderr))(
                               importer_get(f"docker://efabuild://{NAME}", env, tmp_path))]:
        assert (code, out, err.count("\n")) == (1, "", 1), err
        assert err.startswith(f"efabuild: refusing {NAME}: ") and says in err, err
    # without --require-signature the same store still serves (the artifacts agree with the index)
    if how != "rewritten after signing":
        assert lookup("--store", str(store), NAME, cwd=tmp_path)[0] == 0


def test_a_forged_entry_pointing_arm64_at_the_amd64_key_is_refused_without_signatures(
        store_dir, tmp_path, monkeypatch):
    keys = publish_platforms(Store([FilesystemTier(store_dir, "shared")], show_progress=False), tmp_path)
    rewrite_index(store_dir, index_bytes(NAME, {**keys, "linux/arm64": keys["linux/amd64"]}, "2030-01-01T00:00:00Z"))
    as_machine(monkeypatch, ARM_NODE)
    code, out, err = lookup("--store", str(store_dir), NAME, cwd=tmp_path)
    assert (code, out) == (1, "")
    assert err == (f"efabuild: refusing demo:train@linux/arm64: its platform index names {keys['linux/amd64'][:12]}, "
                   f"whose record is for linux/amd64, not linux/arm64 (a rewritten index?)\n")


# ---- diff across platforms
@pytest.mark.slow
def test_diff_of_two_platforms_says_which_components_differ(tmp_path, monkeypatch):
    from efabuild.host.digest import file_digest
    from efabuild.provenance.stored import describe_sqsh
    from efabuild.store.record import ArtifactRecord
    from tests.data.rootfs import mini_ngc as ngc

    store = Store.at(tmp_path / "store", show_progress=False)
    found = {}
    for platform, machine, nccl in (("linux/amd64", "x86_64", ngc.NCCL), ("linux/arm64", "aarch64", "2.29.2")):
        monkeypatch.setattr(ngc, "NCCL", nccl)
        ngc.full_image(tmp_path / machine, machine=machine)
        key = key_for(f"ngc {platform}")
        artifact = ngc.make_sqsh(tmp_path / machine, tmp_path / f"{machine}.sqsh")
        digest = file_digest(artifact)
        manifest = describe_sqsh(artifact, key=key, name=NAME, sqsh_digest=digest, export_options={},
                                 base=None, chain=ngc.chain_for(key, platform=platform), builder={},
                                 platform=platform, times={})
        store.publish(key, artifact, ArtifactRecord.for_file(key, NAME, artifact, digest, platform=platform), manifest)
        found[platform] = key
    store.publish_index(NAME, found)
    result = run_efabuild(["diff", "--store", str(tmp_path / "store"), f"{NAME}@linux/amd64", f"{NAME}@linux/arm64"],
                          env=dict(os.environ), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"A  {NAME} {found['linux/amd64'][:12]} linux/amd64"
    row = next(line.split() for line in lines if line.startswith("nccl "))
    assert row == ["nccl", "2.30.7", "2.29.2", "NO"]
    assert next(line.split() for line in lines if line.startswith("libfabric "))[-1] == "yes"
    assert lines[-1] == "differ across platforms: nccl 2.30.7 on linux/amd64, 2.29.2 on linux/arm64"
    # the differences table compares the two sides, not one side with itself
    assert next(line.split() for line in lines if line.startswith("measured  machine")) == [
        "measured", "machine", "x86_64", "aarch64"]
    assert ["measured", "nccl", "2.30.7", "2.29.2"] in [line.split() for line in lines]
    as_json = run_efabuild(["diff", "--json", "--store", str(tmp_path / "store"), f"{NAME}@linux/amd64",
                            f"{NAME}@linux/arm64"], env=dict(os.environ), cwd=tmp_path)
    across = json.loads(as_json.stdout)["across_platforms"]
    assert across["agree"] is False
    assert {c["component"]: c["agree"] for c in across["components"]} == {
        "nccl": False, "libfabric": True, "aws-ofi-nccl": True, "pytorch": True, "cuda": True}
    exit_code = run_efabuild(["diff", "--exit-code", "--store", str(tmp_path / "store"), f"{NAME}@linux/amd64",
                              f"{NAME}@linux/arm64"], env=dict(os.environ), cwd=tmp_path)
    assert exit_code.returncode == 1


@pytest.mark.slow
def test_verify_of_a_name_checks_its_platform_index_too(tmp_path, keys, monkeypatch):
    release, other = PemSigner(keys["release"][0]), PemSigner(keys["other"][0])
    env = {"EFABUILD_TRUST_CONFIG": str(trust_config(tmp_path / "trust.toml", keys["release"][1])),
           "EFABUILD_VERIFY_CACHE": str(cache_dir(tmp_path / "verified")), "EFABUILD_PLATFORM": "linux/arm64"}
    good, found = signed_store(tmp_path / "good", release, release)
    ok = run_efabuild(["verify", "--store", str(good), NAME], env={**os.environ, **env}, cwd=tmp_path)
    assert (ok.returncode, ok.stdout) == (0, f"ok    {found['linux/arm64'][:12]} store\n"), ok.stderr
    bad, found = signed_store(tmp_path / "bad", release, other)
    failed = run_efabuild(["verify", "--store", str(bad), NAME], env={**os.environ, **env}, cwd=tmp_path)
    assert failed.returncode == 1
    assert failed.stdout.startswith(f"FAIL  {found['linux/arm64'][:12]} platform index: ")
    assert "none by a key trusted by" in failed.stdout and f"ok    {found['linux/arm64'][:12]} store\n" in failed.stdout


def test_a_local_hit_of_an_indexed_name_loads_nothing_heavy(store_dir, tmp_path):
    """lookup's fast path reads the index with stdlib json: no boto3, attrs, blake3 or cryptography."""
    from tests.kits.storekit import efabuild_process

    keys = publish_platforms(Store([FilesystemTier(store_dir, "shared")], show_progress=False), tmp_path)
    result = efabuild_process("lookup", "--store", str(store_dir), NAME,
                              env={"PYTHONPROFILEIMPORTTIME": "1", "EFABUILD_PLATFORM": "linux/arm64"}, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (0, sqsh(store_dir, keys["linux/arm64"]))
    imported = {line.split("|")[-1].strip().split(".")[0] for line in result.stderr.splitlines()
                if line.startswith("import time:")}
    assert "efabuild" in imported
    assert not imported & {"boto3", "botocore", "python_on_whales", "attrs", "blake3", "cryptography"}


def test_a_hostile_history_entry_naming_no_index_is_one_line(store_dir, tmp_path):
    publish_platforms(Store([FilesystemTier(store_dir, "shared")], show_progress=False), tmp_path)
    refs = store_dir / "refs" / "demo" / "train.json"
    for planted in ("../../../etc/passwd", 12, ["a" * 64]):
        document = json.loads(refs.read_text())
        document["history"][-1]["index"] = planted
        refs.write_text(json.dumps(document))
        code, out, err = lookup("--store", str(store_dir), NAME, cwd=tmp_path)
        assert (code, out, err.count("\n")) == (1, "", 1) and "not 64 hex characters" in err, err


@pytest.mark.s3
@pytest.mark.parametrize("index_signed", [True, False])
def test_a_cold_node_checks_the_s3_index_signature_before_it_fetches(tmp_path, keys, settings, monkeypatch,
                                                                     index_signed):
    import shutil

    from efabuild.signing.attest import signed_index
    from tests.kits.storekit import CHUNKED

    release = PemSigner(keys["release"][0])
    builder = Store([FilesystemTier(tmp_path / "cache", "local")], settings, show_progress=False, s3_options=CHUNKED)
    found = _publish_signed_artifacts(builder, tmp_path, release, "s3 signed", 60_000)
    builder.publish_index(NAME, found, sign=functools.partial(signed_index, signer=release) if index_signed else None)
    node_store = tmp_path / "fsx"
    node_store.mkdir()
    shutil.copy(tmp_path / "cache" / "store.toml", node_store / "store.toml")
    env = node_env(tmp_path, node_store, keys["release"][1])
    as_machine(monkeypatch, ARM_NODE)
    got = importer_get(f"docker://efabuild://{NAME}", env, tmp_path)
    if index_signed:
        assert (got.returncode, got.stdout) == (0, sqsh(node_store, found["linux/arm64"])), got.stderr
        assert not (node_store / "objects" / found["linux/amd64"][:2]).exists()  # only its own platform fetched
    else:
        assert (got.returncode, got.stdout, got.stderr.count("\n")) == (1, "", 1)
        assert got.stderr.startswith(f"efabuild: refusing {NAME}: s3://") and "unsigned platform index" in got.stderr
        assert not (node_store / "objects").exists() or not list((node_store / "objects").rglob("*.sqsh"))


def _publish_signed_artifacts(store, directory: Path, signer, label: str, size: int) -> dict[str, str]:  # noqa: ANN001
    """{platform: key} of NAME's artifact for amd64 and arm64, each published with its manifest
    signed by `signer` (the index is the caller's)."""
    from efabuild.host.digest import file_digests
    from efabuild.provenance.stored import describe_sqsh
    from efabuild.signing.attest import signed
    from efabuild.store.record import ArtifactRecord
    from tests.kits.storekit import make_sqsh

    found = {}
    for platform in ("linux/amd64", "linux/arm64"):
        where = directory / platform.replace("/", "-")
        where.mkdir(parents=True)
        artifact = make_sqsh(where, os.urandom(size))
        key = key_for(f"{label} {platform}")
        blake3, sha256 = file_digests(artifact)
        manifest = describe_sqsh(artifact, key=key, name=NAME, sqsh_digest=blake3, sqsh_sha256=sha256,
                                 export_options={}, base=None, chain=[], builder={}, times={})
        record = ArtifactRecord.for_file(key, NAME, artifact, blake3, sha256=sha256, platform=platform)
        store.publish(key, artifact, record, manifest, envelope=signed(manifest, signer))
        found[platform] = key
    return found


def _append_plain_entry(store: Path, name: str, key: str) -> None:
    """A history entry without an index, as a co-tenant who can write the store appends one."""
    refs = store / "refs" / Path(*name.split(":")).with_suffix(".json")
    document = json.loads(refs.read_text())
    document["history"].append({"key": key, "time": "2099-01-01T00:00:00Z"})
    refs.write_text(json.dumps(document))


def test_a_plain_history_entry_naming_another_platforms_artifact_is_refused(store_dir, tmp_path, monkeypatch):
    """Appending {"key": <arm64 key>} (no index) to the name's history handed the arm64 .sqsh to
    an x86_64 node with only a warning: a name's record must be of the platform the node wants."""
    keys = publish_platforms(Store([FilesystemTier(store_dir, "shared")], show_progress=False), tmp_path)
    _append_plain_entry(store_dir, NAME, keys["linux/arm64"])
    as_machine(monkeypatch, X86_NODE)
    refused = (1, "", "efabuild: demo:train has no linux/amd64 artifact (it has linux/arm64); build it with "
                      "[builder] platforms or set EFABUILD_PLATFORM\n")
    assert lookup("--store", str(store_dir), NAME, cwd=tmp_path) == refused
    assert lookup("--store", str(store_dir), "--key", NAME, cwd=tmp_path) == refused
    got = importer_get(f"docker://efabuild://{NAME}", {"EFABUILD_STORE": str(store_dir), "EFABUILD_PYXIS_CONFIG": ""},
                       tmp_path)
    assert (got.returncode, got.stdout) == (1, "") and "has no linux/amd64 artifact" in got.stderr
    # the node it was built for gets it; a key still names its one artifact anywhere
    as_machine(monkeypatch, ARM_NODE)
    assert lookup("--store", str(store_dir), NAME, cwd=tmp_path) == (0, sqsh(store_dir, keys["linux/arm64"]), "")
    as_machine(monkeypatch, X86_NODE)
    code, out, err = lookup("--store", str(store_dir), keys["linux/arm64"], cwd=tmp_path)
    assert (code, out) == (0, sqsh(store_dir, keys["linux/arm64"])) and "is a linux/arm64 artifact" in err


def test_a_plain_history_entry_naming_another_names_artifact_is_refused_where_signatures_are_required(
        tmp_path, keys, monkeypatch):
    """Appending another name's key to a name's history handed out that name's .sqsh without a
    word. Where signatures are required it is refused (the other artifact is signed too); without,
    it is handed out with a warning: identical inputs in two graphs share one key and one record."""
    release = PemSigner(keys["release"][0])
    store, found = signed_store(tmp_path, release, release)
    other = Store.at(store, show_progress=False)
    where = tmp_path / "other"
    where.mkdir()
    from efabuild.host.digest import file_digests
    from efabuild.provenance.stored import describe_sqsh
    from efabuild.signing.attest import signed
    from efabuild.store.record import ArtifactRecord
    from tests.kits.storekit import make_sqsh

    artifact = make_sqsh(where, os.urandom(30_000))
    key = key_for("demo:efa amd64")
    blake3, sha256 = file_digests(artifact)
    manifest = describe_sqsh(artifact, key=key, name="demo:efa", sqsh_digest=blake3, sqsh_sha256=sha256,
                             export_options={}, base=None, chain=[], builder={}, times={})
    other.publish(key, artifact, ArtifactRecord.for_file(key, "demo:efa", artifact, blake3, sha256=sha256,
                                                          platform="linux/amd64"), manifest,
                  envelope=signed(manifest, release))
    _append_plain_entry(store, NAME, key)
    as_machine(monkeypatch, X86_NODE)
    env = node_env(tmp_path, store, keys["release"][1])
    code, out, err = lookup("--require-signature", NAME, env=env, cwd=tmp_path)
    assert (code, out) == (1, "") and err.count("\n") == 1
    assert f"refusing {NAME}: its history names {key[:12]}, whose record is demo:efa's" in err
    got = importer_get(f"docker://efabuild://{NAME}", env, tmp_path)  # the node's config: require_signature
    assert (got.returncode, got.stdout) == (1, "") and "whose record is demo:efa's" in got.stderr
    code, out, err = lookup("--store", str(store), NAME, env={"EFABUILD_STORE": ""}, cwd=tmp_path)
    assert (code, out) == (0, sqsh(store, key))
    assert err == (f"efabuild: warning: {NAME} ({key[:12]}) is recorded as demo:efa: the same inputs, or a "
                   "rewritten history (--require-signature refuses it)\n")


def test_a_forged_local_index_is_named_where_it_was_read(tmp_path, monkeypatch):
    """With a shared and a local tier, an index read from the local one is the local file in the
    line that refuses it (it named the shared tier's, where no such file is)."""
    shared, local = tmp_path / "fsx", tmp_path / "ws" / "cache"
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "BUILD.toml").write_text(f'[store]\nlocal = "cache"\nshared = "{shared}"\n')
    store = Store([FilesystemTier(local, "local"), FilesystemTier(shared, "shared")], show_progress=False)
    publish_platforms(store, tmp_path)
    path, _ = index_of(local)
    (shared / path.relative_to(local)).unlink()  # the shared tier lacks it: the local copy is read
    path.chmod(0o644)
    path.write_bytes(path.read_bytes().replace(b"linux/arm64", b"linux/arm65"))
    as_machine(monkeypatch, X86_NODE)
    code, out, err = lookup(NAME, cwd=tmp_path / "ws")
    assert (code, out) == (1, "") and str(path) in err and str(shared) not in err, err
