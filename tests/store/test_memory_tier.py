"""One contract for every tier: the filesystem tier, the S3 tier (moto's server over HTTP) and a
tier held in memory (tests/store/memorytier.py) written against the object and names interfaces
alone. Then a store made of the memory tier publishes, looks up, fetches and collects as it does
with S3, and `efabuild make` runs on it: a new kind of object store needs nothing but these
interfaces."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from efabuild.errors import EfabuildError
from efabuild.host.digest import bytes_digest, file_digest
from efabuild.platforms import index_bytes, index_digest
from efabuild.settings import S3Config
from efabuild.store.layout import ENVELOPE_SUFFIX, MANIFEST_SUFFIX
from efabuild.store.names import platform_index
from efabuild.store.tiered import Store
from efabuild.store.tiers.base import PUBLISHED, REUSED, RemoteTier
from efabuild.store.tiers.fs import FilesystemTier
from efabuild.store.transfer import DamagedCopy, verified_copy
from tests.kits.inprocess import run_efabuild
from tests.kits.storekit import key_for, make_sqsh, record_for
from tests.make.test_make import demo_ws, mini_ngc  # noqa: F401 - the demo workspace and its base image
from tests.store.memorytier import MemoryTier

KINDS = ["filesystem", pytest.param("s3", marks=pytest.mark.s3), "memory"]


@pytest.fixture(scope="module")
def sqsh(tmp_path_factory) -> Path:
    return make_sqsh(tmp_path_factory.mktemp("contract"), os.urandom(256 * 1024), "contract")


@pytest.fixture(params=KINDS)
def tier(request, tmp_path):  # noqa: ANN201 - a Tier of each kind
    if request.param == "filesystem":
        return FilesystemTier(tmp_path / "fs", "shared")
    if request.param == "memory":
        return MemoryTier()
    from efabuild.store.tiers.s3 import S3Tier

    moto, bucket = request.getfixturevalue("moto_server"), request.getfixturevalue("s3_bucket")
    # whole objects, so that a test can damage one in place (chunks have a contract test of their own)
    return S3Tier(S3Config(bucket=bucket, prefix=f"contract-{tmp_path.name}/", region="us-east-1",
                           endpoint_url=moto), show_progress=False, chunked=False)


def _record(key: str, sqsh: Path, manifest: bytes | None = None):  # noqa: ANN202 - an ArtifactRecord
    """The record a store's publish hands a tier: naming its manifest's digest, when it has one."""
    record = record_for(key, "demo:user", sqsh)
    return record if manifest is None else record._replace(manifest_digest=bytes_digest(manifest))


def _damage(tier, key: str, sqsh: Path) -> None:  # noqa: ANN001
    """The stored bytes of `key` replaced by others of the same size, behind the tier's back."""
    other = bytes(b ^ 0xFF for b in sqsh.read_bytes()[:64]) + sqsh.read_bytes()[64:]
    if isinstance(tier, FilesystemTier):
        path = tier.sqsh_path(key)
        path.chmod(0o644)
        path.write_bytes(other)
    elif isinstance(tier, MemoryTier):
        tier.objects[key][".sqsh"] = other
    else:
        tier.client.put_object(Bucket=tier.bucket, Key=tier.sqsh_object(key), Body=other)


def test_a_published_artifact_reads_back_as_it_was_given(tier, sqsh):
    key = key_for(f"contract-{tier.name}")
    record = _record(key, sqsh, b'{"m": 1}')
    assert not tier.has(key) and tier.record(key) is None and tier.sidecar(key, MANIFEST_SUFFIX) is None
    assert tier.publish(key, sqsh, record, b'{"m": 1}', envelope=b'{"signed": 1}\n') == PUBLISHED
    assert tier.has(key) and tier.record(key) == record
    assert tier.sidecar(key, MANIFEST_SUFFIX) == b'{"m": 1}'
    assert tier.sidecar(key, ENVELOPE_SUFFIX) == b'{"signed": 1}\n'
    assert tier.list() == [record] and tier.list(key[:8]) == [record]
    assert tier.list("0" * 8 if not key.startswith("0" * 8) else "f" * 8) == []
    assert key in tier.describe(key)
    assert tier.publish(key, sqsh, record, b'{"m": 1}') == REUSED  # a second writer keeps the first's


def test_only_the_signed_statement_is_ever_rewritten(tier, sqsh):
    key = key_for(f"resign-{tier.name}")
    tier.publish(key, sqsh, _record(key, sqsh, b'{"m": 1}'), b'{"m": 1}')
    tier.write_sidecar(key, ENVELOPE_SUFFIX, b'{"signed": 2}\n')
    assert tier.sidecar(key, ENVELOPE_SUFFIX) == b'{"signed": 2}\n'
    with pytest.raises(ValueError, match="never rewritten"):
        tier.write_sidecar(key, MANIFEST_SUFFIX, b'{"m": "forged"}')
    assert tier.sidecar(key, MANIFEST_SUFFIX) == b'{"m": 1}'
    with pytest.raises(EfabuildError, match="no artifact"):
        tier.write_sidecar(key_for("absent"), ENVELOPE_SUFFIX, b"{}\n")


def test_delete_takes_the_artifact_and_what_travels_with_it(tier, sqsh):
    key = key_for(f"delete-{tier.name}")
    tier.publish(key, sqsh, _record(key, sqsh, b'{"m": 1}'), b'{"m": 1}', envelope=b"{}\n")
    tier.delete(key)
    assert not tier.has(key) and tier.record(key) is None and tier.list() == []
    assert tier.sidecar(key, MANIFEST_SUFFIX) is None and tier.sidecar(key, ENVELOPE_SUFFIX) is None


def test_a_publish_refuses_a_file_its_record_does_not_describe(tier, sqsh, tmp_path):
    key = key_for(f"refused-{tier.name}")
    longer = tmp_path / "longer.sqsh"
    longer.write_bytes(sqsh.read_bytes() + b"\0")
    with pytest.raises(EfabuildError, match="its record says"):
        tier.publish(key, longer, record_for(key, "demo:user", sqsh))
    with pytest.raises(EfabuildError, match="record is for"):
        tier.publish(key_for("another"), sqsh, record_for(key, "demo:user", sqsh))
    assert not tier.has(key) and tier.list() == []


def test_a_copy_is_checked_against_its_record_before_a_byte_of_it_is_used(tier, sqsh, tmp_path):
    key = key_for(f"damaged-{tier.name}")
    tier.publish(key, sqsh, record_for(key, "demo:user", sqsh))
    staging = FilesystemTier(tmp_path / "staging", "local")
    with verified_copy(key, tier, staging) as copy:
        assert file_digest(copy.sqsh) == copy.record.digest
    _damage(tier, key, sqsh)
    with pytest.raises(DamagedCopy, match="corrupt artifact"):
        with verified_copy(key, tier, staging):
            pytest.fail("a damaged copy was handed on")
    assert not list(staging.layout.tmp_dir.glob("*.sqsh")), "a refused download left its file"


def test_names_keep_a_history_and_the_platform_indexes_it_points_at(tier):
    first, second = key_for("first"), key_for("second")
    assert tier.names.read("demo:user") == [] and tier.names.tips() == {}
    assert tier.names.append("demo:user", first) and tier.names.append("demo:user", second)
    assert [entry["key"] for entry in tier.names.read("demo:user")] == [first, second]
    data = index_bytes("demo:user", {"linux/amd64": first, "linux/arm64": second}, "2026-12-05T00:00:00Z")
    digest = index_digest(data)
    tier.names.write_index(digest, data, b'{"signed": 1}\n')
    tier.names.append("demo:user", first, index=digest)
    assert tier.names.tips() == {"demo:user": (first, digest)}
    index, envelope = platform_index(tier.names, digest)
    assert index["platforms"] == {"linux/amd64": first, "linux/arm64": second} and envelope == b'{"signed": 1}\n'
    tier.names.drop("demo:user", {second})
    assert [entry["key"] for entry in tier.names.read("demo:user")] == [first, first]
    assert platform_index(tier.names, "0" * 64) == (None, None)


def test_the_memory_tier_implements_the_remote_interface_and_nothing_else():
    """What the store calls on a remote tier is the interface's: the memory tier defines no other
    public method (its two dicts aside), so the store tests below hold for any object store."""
    public = {name for name, value in vars(MemoryTier).items() if callable(value) and not name.startswith("_")}
    interface = {name for cls in RemoteTier.__mro__ for name, value in vars(cls).items()
                 if callable(value) and not name.startswith("_")}
    assert public <= interface, public - interface


# -- a store made of it ---------------------------------------------------------------------------

def _store(base: Path, remote: MemoryTier) -> Store:
    return Store([FilesystemTier(base / "cache", "local")], remote=remote, show_progress=False)


def test_a_store_made_of_a_memory_tier_publishes_looks_up_fetches_and_collects(tmp_path, sqsh):
    remote = MemoryTier()
    builder = _store(tmp_path / "builder", remote)
    versions = [make_sqsh(tmp_path, os.urandom(64 * 1024), f"v{n}") for n in range(3)]
    keys = []
    for n, version in enumerate(versions):
        key = key_for(f"v{n}")
        assert builder.publish(key, version, record_for(key, "demo:user", version)) == {
            "local": PUBLISHED, "memory": PUBLISHED}
        keys.append(key)
    assert builder.tier_names == ("local", "memory") and builder.where(keys[-1]) == ("local", "memory")

    node = _store(tmp_path / "node", remote)  # a node holding nothing: the name and bytes from the remote
    path = node.lookup("demo:user")
    assert path.is_relative_to(tmp_path / "node") and file_digest(path) == file_digest(versions[-1])
    assert node.lookup(keys[0][:12]) .is_file() and node.resolve("demo:user") == keys[-1]

    report = builder.gc(keep=1, dry_run=False)
    assert {(r.tier, r.record.key) for r in report.removals} == {
        (tier, key) for tier in ("local", "memory") for key in keys[:2]}
    assert [record.key for record in remote.list()] == [keys[-1]]
    assert [entry["key"] for entry in remote.names.read("demo:user")] == [keys[-1]]


def test_a_store_made_of_a_memory_tier_never_hands_out_a_damaged_copy(tmp_path, sqsh):
    remote = MemoryTier()
    builder = _store(tmp_path / "builder", remote)
    key = key_for("damaged")
    builder.publish(key, sqsh, record_for(key, "demo:user", sqsh))
    _damage(remote, key, sqsh)
    node = _store(tmp_path / "node", remote)
    with pytest.raises(DamagedCopy, match="memory tier: .*corrupt artifact"):
        node.lookup("demo:user")
    assert not node.fs_tiers[0].has(key) and not list((tmp_path / "node").rglob("*.sqsh"))
    found = dict(builder.verify(key))  # `efabuild verify`: every tier's copy re-hashed
    assert found["local"] is None and isinstance(found["memory"], DamagedCopy)


def test_make_lookup_and_gc_run_on_a_store_made_of_a_memory_tier(demo_ws, monkeypatch):
    """The real make of the demo graph (the engine, the export) publishing to a workspace store
    whose remote tier is the memory tier; a lookup with the local objects gone fetches from it;
    gc deletes from it. The store is given its remote where the CLI builds it from the workspace's
    [store] table: only the tier is new, nothing else is stubbed."""
    remote = MemoryTier()

    def from_config(config, **options):  # noqa: ANN001, ANN202 - a StoreConfig; a Store
        tiers = [FilesystemTier(path, name) for name, path in config.roots()]
        return Store(tiers, remote=remote, keep=config.keep, pins=config.pins, bare=config.bare, **options)

    monkeypatch.setattr(Store, "from_config", staticmethod(from_config))
    made = run_efabuild(["make", "demo"], cwd=demo_ws)
    assert made.returncode == 0, made.stderr
    first = {record.name: record for record in remote.list()}
    assert {"demo:efa", "demo:user"} <= set(first)

    (demo_ws / "app" / "train.py").write_text((demo_ws / "app" / "train.py").read_text() + "\n# v2\n")
    assert run_efabuild(["make", "demo"], cwd=demo_ws).returncode == 0
    second = remote.names.read("demo:user")[-1]["key"]
    assert second != first["demo:user"].key and remote.has(second)

    shutil.rmtree(demo_ws / "cache" / "objects")  # this node holds no artifact any more
    found = run_efabuild(["lookup", "demo:user"], cwd=demo_ws)
    assert found.returncode == 0, found.stderr
    assert file_digest(Path(found.stdout.strip())) == remote.record(second).digest

    swept = run_efabuild(["gc", "--keep", "1", "--yes"], cwd=demo_ws)
    assert swept.returncode == 0, swept.stderr
    assert not remote.has(first["demo:user"].key) and remote.has(second) and remote.has(first["demo:efa"].key)
