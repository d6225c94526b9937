"""A damaged filesystem copy (truncated, or grown) is never the path handed to a job, on any
route: `lookup` by key, prefix or name, with --verify or --require-signature, and the Pyxis
importer with and without verify. When S3 holds the artifact, the lookup fetches it over the
damaged copy (as it does for a missing one); when nothing can, it fails with one line naming it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from efabuild.settings import S3Config
from efabuild.signing.keys import PemSigner
from efabuild.host.digest import file_digest
from efabuild.store.tiers.fs import FilesystemTier
from efabuild.store.tiered import Store
from tests.kits.storekit import cache_dir
from tests.kits.signkit import NAME, make_key, object_path, stored_artifact, trust_config
from tests.kits.storekit import efabuild

pytestmark = pytest.mark.s3


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> tuple[Path, Path]:
    return make_key(tmp_path_factory.mktemp("keys"), "ec")


@pytest.fixture
def node(tmp_path, keys, moto_server, s3_bucket) -> dict:
    """A signed artifact in S3, and a compute node's store that fetched it once: its copy, the
    record beside it, and the environment of a job there."""
    builder_store, key = stored_artifact(tmp_path / "builder", PemSigner(keys[0]))
    s3 = S3Config(bucket=s3_bucket, prefix="images", region="us-east-1", endpoint_url=moto_server)
    builder = Store([FilesystemTier(builder_store, "local")], s3, show_progress=False)
    assert builder.complete(key) == {"local": "reused", "s3": "published"}
    store = tmp_path / "fsx"
    store.mkdir()
    shutil.copy(builder_store / "store.toml", store / "store.toml")
    pyxis = tmp_path / "pyxis.toml"
    env = {"EFABUILD_STORE": str(store), "EFABUILD_PYXIS_CONFIG": str(pyxis),
           "EFABUILD_TRUST_CONFIG": str(trust_config(tmp_path / "trust.toml", keys[1])),
           "EFABUILD_VERIFY_CACHE": str(cache_dir(tmp_path / "verified"))}
    assert efabuild("lookup", NAME, env=env).returncode == 0  # fetched, and its name noted
    good = object_path(store, key, ".sqsh")
    return {"key": key, "store": store, "env": env, "pyxis": pyxis, "size": good.stat().st_size,
            "digest": file_digest(good), "s3": builder.s3}


def damage(path: Path, how: str) -> None:
    os.chmod(path, 0o644)
    with open(path, "r+b") as handle:
        if how == "truncated":
            handle.truncate(path.stat().st_size // 2)
        else:
            handle.seek(0, os.SEEK_END)
            handle.write(b"\0" * 4096)


def route(name: str, node: dict) -> tuple[str, ...]:
    """The argv of one way a job gets a path (the importer's config set as that way needs)."""
    key = node["key"]
    node["pyxis"].write_text("verify = true\n" if name == "importer --verify" else "")
    return {
        "key": ("lookup", key),
        "prefix": ("lookup", key[:12]),
        "name": ("lookup", NAME),
        "--verify": ("lookup", "--verify", key),
        "--require-signature": ("lookup", "--require-signature", key),
        "--json": ("lookup", "--json", key),
        "importer": ("pyxis-importer", "get", f"docker://efabuild://{key}"),
        "importer --verify": ("pyxis-importer", "get", f"efabuild://{key[:12]}"),
        "importer name": ("pyxis-importer", "get", f"docker://efabuild://{NAME}"),
    }[name]


ROUTES = ["key", "prefix", "name", "--verify", "--require-signature", "--json", "importer", "importer --verify",
          "importer name"]


@pytest.mark.parametrize("how", ["truncated", "grown"])
@pytest.mark.parametrize("way", ROUTES)
def test_a_damaged_copy_is_fetched_again_from_s3_never_handed_out(node, way, how):
    sqsh = object_path(node["store"], node["key"], ".sqsh")
    damage(sqsh, how)
    result = efabuild(*route(way, node), env=node["env"])
    assert result.returncode == 0, result.stderr
    printed = Path(result.stdout.strip()) if way != "--json" else Path(result.stdout.split('"path": "')[1].split('"')[0])
    assert printed == sqsh
    assert (printed.stat().st_size, file_digest(printed)) == (node["size"], node["digest"])
    assert "corrupt artifact" in result.stderr and "replacing it" in result.stderr  # said, once repaired


@pytest.mark.parametrize("how", ["truncated", "grown"])
@pytest.mark.parametrize("way", ROUTES)
def test_a_damaged_copy_that_s3_cannot_replace_is_one_line_and_no_path(node, way, how):
    node["s3"].delete(node["key"])
    sqsh = object_path(node["store"], node["key"], ".sqsh")
    damage(sqsh, how)
    damaged_size = sqsh.stat().st_size
    result = efabuild(*route(way, node), env=node["env"])
    assert (result.returncode, result.stdout) == (1, ""), result.stderr
    assert result.stderr.splitlines()[-1] == (f"efabuild: {sqsh}: corrupt artifact: {damaged_size} bytes, "
                                              f"its record says {node['size']}"), result.stderr
    no_fetch = efabuild("lookup", "--no-fetch", node["key"], env=node["env"])
    assert (no_fetch.returncode, no_fetch.stdout) == (1, "") and "corrupt artifact" in no_fetch.stderr


def test_a_damaged_copy_on_one_tier_is_passed_over_for_another_tiers_intact_one(node, tmp_path):
    """Two filesystem tiers and S3 (a workspace's): the shared copy damaged, the local one
    intact: the local one is handed out."""
    key, shared = node["key"], node["store"]
    local = tmp_path / "ws" / "cache"
    local.parent.mkdir()
    shutil.copytree(shared, local)
    s3 = (shared / "store.toml").read_text().replace("[s3]", "[store.s3]")
    (tmp_path / "ws" / "BUILD.toml").write_text(f'[store]\nshared = "{shared}"\nlocal = "cache"\n\n{s3}')
    damage(object_path(shared, key, ".sqsh"), "truncated")
    env = {name: value for name, value in node["env"].items() if name != "EFABUILD_STORE"}
    result = efabuild("lookup", key, env=env, cwd=tmp_path / "ws")
    assert (result.returncode, result.stdout) == (0, f"{object_path(local, key, '.sqsh')}\n"), result.stderr


def test_without_an_s3_tier_a_damaged_copy_is_one_line_on_every_route(node):
    (node["store"] / "store.toml").unlink()
    sqsh = object_path(node["store"], node["key"], ".sqsh")
    for how in ("truncated", "grown"):
        damage(sqsh, how)
        for way in ROUTES:
            result = efabuild(*route(way, node), env=node["env"])
            assert (result.returncode, result.stdout) == (1, ""), (way, how, result.stderr)
            assert result.stderr == (f"efabuild: {sqsh}: corrupt artifact: {sqsh.stat().st_size} bytes, "
                                     f"its record says {node['size']}\n"), (way, how)
        sqsh.write_bytes(b"")  # then the other damage, from a truncated file
