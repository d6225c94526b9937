"""`efabuild lookup` as job scripts use it: one path on stdout, or one line and exit 1."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from efabuild.store.tiered import Store
from efabuild.store.tiers.fs import FilesystemTier
from tests.kits.storekit import efabuild, efabuild_process, key_for, make_sqsh, record_for

# two keys sharing their first 10 hex characters, and one apart
TWINS = ["0123456789" + "a" * 54, "0123456789" + "b" * 54]
LONER = "fedcba9876" + "c" * 54


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A workspace whose local store holds three artifacts (two names; one name twice)."""
    (tmp_path / "BUILD.toml").write_text('[store]\nlocal = "cache"\nkeep = 2\n')
    (tmp_path / "sub" / "dir").mkdir(parents=True)
    store = Store([FilesystemTier(tmp_path / "cache", "local")], show_progress=False)
    for index, (key, name) in enumerate([(TWINS[0], "ngc-efa:user"), (LONER, "ngc-efa:deepep"),
                                         (TWINS[1], "ngc-efa:user")]):
        directory = tmp_path / f"export{index}"
        directory.mkdir()
        sqsh = make_sqsh(directory, os.urandom(20_000))
        store.publish(key, sqsh, record_for(key, name, sqsh))
    return tmp_path


def sqsh_of(root: Path, key: str) -> str:
    return f"{root}/objects/{key[:2]}/{key}.sqsh\n"


def test_lookup_by_key_prefix_and_name_from_anywhere_in_the_workspace(workspace):
    cache = workspace / "cache"
    for ref, key in [(TWINS[0], TWINS[0]), (LONER[:8], LONER), ("0123456789b", TWINS[1]),
                     ("ngc-efa:user", TWINS[1]), ("ngc-efa:deepep", LONER), (LONER.upper(), LONER)]:
        result = efabuild("lookup", ref, cwd=workspace / "sub" / "dir")
        assert (result.returncode, result.stdout, result.stderr) == (0, sqsh_of(cache, key), ""), ref


def test_absent_and_ambiguous_refs_exit_1_with_one_line(workspace):
    cases = {
        "ngc-efa:nope": "efabuild: no artifact named ngc-efa:nope in local ",
        "0123456789": "efabuild: key prefix 0123456789 is ambiguous: 2 artifacts match (012345678",
        "abababab": "efabuild: no artifact with key prefix abababab in local ",
        "ab" * 32: "efabuild: artifact abababababab (" + "ab" * 32 + ") is in no tier of local ",
    }
    for ref, start in cases.items():
        result = efabuild("lookup", ref, cwd=workspace)
        assert result.returncode == 1, ref
        assert result.stdout == ""
        assert result.stderr.startswith(start), result.stderr
        assert result.stderr.count("\n") == 1


def test_malformed_refs_are_usage_errors(workspace):
    for ref, problem in [("0123", "too short: give at least 8 hex"), ("not a ref", "not a key, key prefix"),
                         ("ngc/efa:user", "not an artifact name")]:
        result = efabuild("lookup", ref, cwd=workspace)
        assert result.returncode == 2 and problem in result.stderr and result.stderr.count("\n") == 1


def test_store_path_from_option_or_environment_without_a_workspace(workspace, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("compute-node")
    cache = workspace / "cache"
    by_option = efabuild("lookup", "--store", str(cache), "ngc-efa:deepep", cwd=elsewhere)
    by_env = efabuild("lookup", "ngc-efa:deepep", cwd=elsewhere, env={"EFABUILD_STORE": str(cache)})
    assert by_option.stdout == by_env.stdout == sqsh_of(cache, LONER)
    # --store wins over the environment
    empty = tmp_path_factory.mktemp("empty-store")
    result = efabuild("lookup", "--store", str(empty), "ngc-efa:deepep", cwd=elsewhere,
                      env={"EFABUILD_STORE": str(cache)})
    assert result.returncode == 1
    none = efabuild("lookup", "ngc-efa:deepep", cwd=elsewhere, env={"EFABUILD_STORE": ""})
    assert none.returncode == 2 and "no store: give --store PATH, set EFABUILD_STORE" in none.stderr


def test_json_output_and_verify(workspace):
    result = efabuild("lookup", "--json", "--verify", "ngc-efa:deepep", cwd=workspace)
    data = json.loads(result.stdout)
    assert data["path"] == sqsh_of(workspace / "cache", LONER).strip()
    assert data["key"] == LONER and data["name"] == "ngc-efa:deepep"
    assert data["size"] == Path(data["path"]).stat().st_size and data["digest"].startswith("blake3:")

    path = Path(data["path"])
    os.chmod(path, 0o644)
    with open(path, "r+b") as handle:
        handle.seek(4096)
        handle.write(b"\0rot")
    assert efabuild("lookup", "ngc-efa:deepep", cwd=workspace).returncode == 0  # cheap: no re-hash
    result = efabuild("lookup", "--verify", "ngc-efa:deepep", cwd=workspace)
    assert result.returncode == 1 and result.stdout == ""
    assert "corrupt artifact: digest blake3:" in result.stderr


def test_a_local_hit_imports_neither_boto3_nor_python_on_whales(workspace):
    result = efabuild_process("lookup", "ngc-efa:user", env={"PYTHONPROFILEIMPORTTIME": "1"}, cwd=workspace)
    assert result.returncode == 0
    imported = {line.split("|")[-1].strip().split(".")[0] for line in result.stderr.splitlines()
                if line.startswith("import time:")}
    assert "efabuild" in imported  # the check sees our own imports, so it can see others
    assert not imported & {"boto3", "botocore", "python_on_whales", "s3transfer"}


def test_bad_store_settings_name_file_key_and_problem(workspace):
    (workspace / "BUILD.toml").write_text('[store]\nlocal = "cache"\nkeep = "three"\n')
    result = efabuild("lookup", "ngc-efa:user", cwd=workspace)
    assert result.returncode == 2
    assert result.stderr == (f"efabuild: {workspace / 'BUILD.toml'}: store.keep: must be a whole number ≥ 1, "
                             f"not 'three'\n")
    (workspace / "BUILD.toml").write_text('[store]\nshard = "/fsx"\n')
    result = efabuild("lookup", "ngc-efa:user", cwd=workspace)
    assert result.returncode == 2 and "store: unknown key 'shard'" in result.stderr


def test_no_fetch_on_a_miss_without_s3(workspace):
    result = efabuild("lookup", "--no-fetch", key_for("never built"), cwd=workspace)
    assert result.returncode == 1 and "is in no tier of local" in result.stderr


def test_lookup_of_a_layer_that_is_no_artifact_says_so(tmp_path: Path) -> None:
    from tests.kits.wsfactory import make_workspace

    root = make_workspace(tmp_path / "ws")
    result = efabuild("lookup", "stack:deepep", cwd=root / "app")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == ("efabuild: stack:deepep is a layer of graphs/stack.toml but not an artifact layer, "
                             "so it has no .sqsh (artifact layers of stack: stack:efa, stack:user; "
                             "`artifact = true` exports one)\n")
    # an artifact layer not built yet, and an unknown layer: the store's own answer
    for ref in ("stack:user", "stack:nothing"):
        result = efabuild("lookup", ref, cwd=root)
        assert result.returncode == 1 and "no artifact named" in result.stderr and "not an artifact layer" \
            not in result.stderr
    assert "did you mean" not in result.stderr
    typo = efabuild("lookup", "stack:usr", cwd=root)  # a name close to an artifact layer's
    assert typo.returncode == 1 and typo.stderr.count("\n") == 1
    assert "no artifact named stack:usr" in typo.stderr and typo.stderr.endswith("(did you mean 'stack:user'?)\n")


def test_the_importer_skips_only_the_very_file_its_fetch_checked(tmp_path, monkeypatch):
    """After a fetch the importer's verify does not hash the copy again, known by its inode: a file
    renamed over that name since (in a shared tier, by whoever may write it) is hashed and refused,
    and so is the same file once someone else could write it."""
    from efabuild.errors import EfabuildError
    from efabuild.pyxis.lookup import verify_tiers
    from efabuild.store import transfer
    from efabuild.store.config import locate

    root = tmp_path / "fsx"
    store = Store([FilesystemTier(root, "shared")], show_progress=False)
    sqsh = make_sqsh(tmp_path, os.urandom(20_000))
    key = key_for("fetched")
    store.publish(key, sqsh, record_for(key, "ngc-efa:user", sqsh))
    path = (root / "objects" / key[:2] / f"{key}.sqsh").absolute()
    info = path.stat()
    fetched = (path, (info.st_dev, info.st_ino))
    hashed = []
    real_digest = transfer.file_digest
    monkeypatch.setattr(transfer, "file_digest", lambda p: hashed.append(p) or real_digest(p))
    table = locate(str(root))
    verify_tiers(table, key, fetched=fetched)
    assert hashed == []
    path.chmod(0o666)
    verify_tiers(table, key, fetched=fetched)
    assert len(hashed) == 1
    path.chmod(0o444)
    damaged = bytearray(path.read_bytes())
    damaged[len(damaged) // 2] ^= 1
    (tmp_path / "planted").write_bytes(bytes(damaged))
    os.replace(tmp_path / "planted", path)
    with pytest.raises(EfabuildError, match="corrupt artifact: digest"):
        verify_tiers(table, key, fetched=fetched)


def test_key_prints_the_key_of_the_artifact_a_name_gives_and_that_key_looks_up_the_same_path(workspace):
    cache = workspace / "cache"
    by_name = efabuild("lookup", "--key", "ngc-efa:user", cwd=workspace)
    assert (by_name.returncode, by_name.stdout, by_name.stderr) == (0, TWINS[1] + "\n", "")
    # the job's second lookup, by that key, gives the path the name gave: nothing can move it
    by_key = efabuild("lookup", by_name.stdout.strip(), cwd=workspace)
    assert by_key.stdout == efabuild("lookup", "ngc-efa:user", cwd=workspace).stdout == sqsh_of(cache, TWINS[1])
    assert efabuild("lookup", "--key", LONER[:8], cwd=workspace).stdout == LONER + "\n"
    # the same checks as a path: absent is one line and exit 1, nothing on stdout
    missing = efabuild("lookup", "--key", "ngc-efa:nope", cwd=workspace)
    assert missing.returncode == 1 and missing.stdout == "" and missing.stderr.count("\n") == 1
    both = efabuild("lookup", "--key", "--json", "ngc-efa:user", cwd=workspace)
    assert both.returncode == 2 and both.stdout == "" and "not allowed with argument" in both.stderr


def test_verify_rehashes_even_a_copy_the_cache_holds_as_verified(workspace, monkeypatch):
    """`lookup --verify` is the check an operator runs when they doubt a copy: it reads the bytes,
    never an earlier answer (the importer's `verify = true` may take the cache's)."""
    from efabuild.signing import verifycache

    monkeypatch.setattr(verifycache, "is_verified", lambda *args, **kwargs: True)
    path = Path(efabuild("lookup", "ngc-efa:deepep", cwd=workspace).stdout.strip())
    os.chmod(path, 0o644)
    with open(path, "r+b") as handle:
        handle.seek(4096)
        handle.write(b"\0rot")
    result = efabuild("lookup", "--verify", "ngc-efa:deepep", cwd=workspace)
    assert result.returncode == 1 and "corrupt artifact: digest blake3:" in result.stderr
