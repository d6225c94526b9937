"""The S3 tier against a real S3 protocol server (moto's, over HTTP on loopback)."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from efabuild.host.digest import file_digest
from efabuild.errors import EfabuildError, NotFound
from efabuild.settings import S3Config
from efabuild.store.tiered import Store
from efabuild.store.tiers.fs import PUBLISHED, REUSED, FilesystemTier
from efabuild.store.gc.sweep import find_debris, remove_debris
from efabuild.store.tiers.s3 import S3Tier
from efabuild.store.s3client import part_size_for
from tests.plugins.s3server import DUMMY_CREDENTIALS
from tests.kits.storekit import (
    collect_warnings,
    efabuild,
    key_for,
    kill_publisher_at,
    make_sqsh,
    race_publishers,
    record_for,
    start_publisher,
)

pytestmark = pytest.mark.s3
MiB = 1024 * 1024
# This module covers whole-object artifacts, as efabuild published them before the chunked tier
# (tests/store/test_store_chunked.py) and still reads them: multipart uploads of S3's minimum part size,
# so a 12 MiB file has three parts.
SMALL_PARTS = {"part_size": 5 * MiB, "chunked": False}


@pytest.fixture
def settings(moto_server: str, s3_bucket: str) -> S3Config:
    return S3Config(bucket=s3_bucket, prefix="efabuild/", region="us-east-1", endpoint_url=moto_server)


@pytest.fixture(scope="module")
def big_sqsh(tmp_path_factory) -> Path:
    return make_sqsh(tmp_path_factory.mktemp("big"), os.urandom(12 * MiB), "big")


def builder_store(base: Path, settings: S3Config) -> Store:
    return Store([FilesystemTier(base / "cache", "local")], settings, show_progress=False, s3_options=SMALL_PARTS)


def published(base: Path, settings: S3Config, sqsh: Path, name: str = "ngc-efa:user",
              manifest: bytes | None = b'{"m": 1}') -> str:
    key = key_for(name + str(sqsh))
    results = builder_store(base, settings).publish(key, sqsh, record_for(key, name, sqsh), manifest)
    assert results == {"local": PUBLISHED, "s3": PUBLISHED}
    return key


def test_multipart_upload_with_checksums_digest_metadata_record_and_ref(tmp_path, settings, big_sqsh, s3_client):
    key = published(tmp_path, settings, big_sqsh)
    objects = f"efabuild/objects/{key[:2]}/{key}"
    head = s3_client.head_object(Bucket=settings.bucket, Key=objects + ".sqsh", ChecksumMode="ENABLED")
    assert head["ContentLength"] == big_sqsh.stat().st_size
    assert head["Metadata"]["blake3"] == file_digest(big_sqsh).removeprefix("blake3:")
    assert head["ChecksumCRC32"]  # parts were sent with CRC32 checksums for the server to check
    record = json.loads(s3_client.get_object(Bucket=settings.bucket, Key=objects + ".json")["Body"].read())
    assert record["key"] == key and record["name"] == "ngc-efa:user"
    assert s3_client.get_object(Bucket=settings.bucket, Key=objects + ".manifest.json")["Body"].read() == b'{"m": 1}'
    refs = s3_client.list_objects_v2(Bucket=settings.bucket, Prefix="efabuild/refs/ngc-efa/user/")["Contents"]
    assert [r["Key"].rsplit(".", 1)[1] for r in refs] == [key]
    # no multipart upload left open
    assert not s3_client.list_multipart_uploads(Bucket=settings.bucket).get("Uploads")


def test_compute_node_fetches_into_the_shared_store_once_and_verified(tmp_path, settings, big_sqsh):
    key = published(tmp_path / "builder", settings, big_sqsh)
    shared = tmp_path / "fsx"
    # a builder's publish leaves store.toml in its filesystem tiers; the cluster's store gets a copy
    (shared).mkdir()
    (shared / "store.toml").write_text((tmp_path / "builder" / "cache" / "store.toml").read_text())
    store = Store.at(shared, show_progress=False)
    path = store.lookup("ngc-efa:user")  # name via S3's refs, then a verified fetch
    assert path == shared / "objects" / key[:2] / f"{key}.sqsh"
    assert file_digest(path) == file_digest(big_sqsh)
    assert store.manifest(key) == b'{"m": 1}'
    assert os.listdir(shared / "tmp") == []
    # the CLI finds it warm, by prefix, without S3
    result = efabuild("lookup", "--no-fetch", "--store", str(shared), key[:10], check=True)
    assert result.stdout == f"{path}\n"


def test_a_name_a_node_copied_from_s3_follows_s3_when_a_builder_moves_it(tmp_path, settings, big_sqsh,
                                                                          monkeypatch):
    """`efabuild lookup`'s fast path and Store.resolve share one local resolver: a name the node's
    store only copied from S3 at a fetch is S3's to answer (a make may have moved it since), and
    when S3 cannot be reached the last fetched key stands, with a warning."""
    first = published(tmp_path / "builder", settings, big_sqsh)
    shared = tmp_path / "fsx"
    shared.mkdir()
    (shared / "store.toml").write_text((tmp_path / "builder" / "cache" / "store.toml").read_text())
    path = efabuild("lookup", "--store", str(shared), "ngc-efa:user", check=True).stdout.strip()
    assert path == f"{shared}/objects/{first[:2]}/{first}.sqsh"
    newer = make_sqsh(tmp_path / "v2", os.urandom(MiB), "v2")
    second = published(tmp_path / "builder", settings, newer)  # the builder moves the name
    assert Store.at(shared, show_progress=False).resolve("ngc-efa:user") == second
    assert efabuild("lookup", "--store", str(shared), "ngc-efa:user", check=True).stdout == \
        f"{shared}/objects/{second[:2]}/{second}.sqsh\n"
    warnings = collect_warnings(monkeypatch)
    gone = S3Config(bucket=settings.bucket, prefix=settings.prefix, region="us-east-1",
                    endpoint_url="http://127.0.0.1:9")  # nothing listens on the discard port
    offline = Store([FilesystemTier(shared, "shared")], gone, show_progress=False)
    assert offline.resolve("ngc-efa:user") == second
    assert [w.split(":", 1)[0] for w in warnings] == ["S3 not reachable, ngc-efa"], warnings


def test_store_toml_and_output_hold_no_credentials(tmp_path, settings, big_sqsh):
    published(tmp_path, settings, big_sqsh)
    text = (tmp_path / "cache" / "store.toml").read_text()
    assert settings.bucket in text and settings.endpoint_url in text
    secret = DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"]
    access = DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"]
    for args in (["ls"], ["gc"], ["lookup", "ngc-efa:user"], ["lookup", "--json", "ngc-efa:user"]):
        result = efabuild(*args, "--store", str(tmp_path / "cache"))
        assert result.returncode == 0, result.stderr
        assert secret not in result.stdout + result.stderr and access not in result.stdout + result.stderr
    assert secret not in text and access not in text


def test_a_corrupted_s3_object_is_refused_and_nothing_becomes_visible(tmp_path, settings, big_sqsh, s3_client):
    key = published(tmp_path / "builder", settings, big_sqsh)
    sqsh_object = f"efabuild/objects/{key[:2]}/{key}.sqsh"
    body = bytearray(big_sqsh.read_bytes())
    body[len(body) // 2] ^= 0xFF  # same size, one byte flipped
    s3_client.put_object(Bucket=settings.bucket, Key=sqsh_object, Body=bytes(body),
                         Metadata={"blake3": file_digest(big_sqsh).removeprefix("blake3:")})
    shared = tmp_path / "fsx"
    store = Store([FilesystemTier(shared, "shared")], settings, show_progress=False, s3_options=SMALL_PARTS)
    with pytest.raises(EfabuildError, match="corrupt artifact: digest"):
        store.lookup(key)
    assert not store.fs_tiers[0].has(key)
    assert os.listdir(shared / "tmp") == []
    # the CLI says it in one line, exit 1
    (shared / "store.toml").write_text((tmp_path / "builder" / "cache" / "store.toml").read_text())
    result = efabuild("lookup", "--store", str(shared), key)
    assert result.returncode == 1 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and "corrupt" in result.stderr


def test_a_publisher_that_lost_the_upload_race_reuses_the_winners_object(tmp_path, settings, big_sqsh, s3_client):
    key = key_for("race-lost")
    tier = S3Tier(settings, show_progress=False, **SMALL_PARTS)
    winner = make_sqsh(tmp_path, os.urandom(1 * MiB), "winner")
    # The winner completed its .sqsh but has not written the record yet.
    s3_client.put_object(Bucket=settings.bucket, Key=tier.sqsh_object(key), Body=winner.read_bytes(),
                         Metadata={"blake3": file_digest(winner).removeprefix("blake3:")})
    loser = make_sqsh(tmp_path, os.urandom(1 * MiB), "loser")
    assert tier.publish(key, loser, record_for(key, "g:l", loser)) == REUSED
    assert tier.record(key).digest == file_digest(winner)  # the record describes the stored bytes
    fetched = tmp_path / "fetched.sqsh"
    tier.download(key, fetched, tier.record(key))
    assert file_digest(fetched) == file_digest(winner)


def test_four_processes_publishing_one_key_to_s3(tmp_path, settings, big_sqsh):
    key = key_for("s3-race")
    go = tmp_path / "go"
    plans = [{"tiers": [["local", str(tmp_path / f"builder{index}")]], "key": key, "name": "g:l",
              "sqsh": str(big_sqsh), "go": str(go), "s3": {
                  "bucket": settings.bucket, "prefix": settings.prefix, "region": settings.region,
                  "endpoint_url": settings.endpoint_url}} for index in range(4)]
    outcomes = [outcome["s3"] for outcome in race_publishers(plans, go, tmp_path, timeout=300)]
    assert sorted(outcomes) == [PUBLISHED, REUSED, REUSED, REUSED]
    tier = S3Tier(settings, show_progress=False)
    fetched = tmp_path / "fetched.sqsh"
    tier.download(key, fetched, tier.record(key))
    assert file_digest(fetched) == file_digest(big_sqsh)


@pytest.mark.parametrize("point", ["s3-mid-upload", "s3-before-record"])
def test_kill_9_during_an_s3_publish_leaves_nothing_visible(tmp_path, settings, big_sqsh, point, s3_client):
    key = key_for("s3-killed")
    s3 = {"bucket": settings.bucket, "prefix": settings.prefix, "region": settings.region,
          "endpoint_url": settings.endpoint_url}
    plan = {"tiers": [["local", str(tmp_path / "cache")]], "key": key, "name": "g:l", "sqsh": str(big_sqsh),
            "pause": point, "s3": s3, "s3_options": SMALL_PARTS}
    kill_publisher_at(plan, tmp_path / "plan.json")
    tier = S3Tier(settings, show_progress=False)
    assert not tier.has(key) and tier.list() == []
    other = Store([FilesystemTier(tmp_path / "node", "shared")], settings, show_progress=False)
    with pytest.raises(NotFound):
        other.lookup(key)
    if point == "s3-mid-upload":  # an open multipart upload, never visible; gc aborts it a day later
        later = datetime.now(timezone.utc) + timedelta(days=2)
        debris = find_debris(tier, now=later.timestamp())
        assert len(debris) == 1 and "?uploadId=" in debris[0]
        remove_debris(tier, debris[0])
        assert not s3_client.list_multipart_uploads(Bucket=settings.bucket).get("Uploads")
    rerun = start_publisher({**plan, "pause": None}, tmp_path / "plan2.json")
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err
    assert file_digest(other.lookup(key)) == file_digest(big_sqsh)


def test_no_fetch_and_missing_credentials_are_one_line_errors(tmp_path, settings, big_sqsh):
    key = published(tmp_path / "builder", settings, big_sqsh)
    shared = tmp_path / "fsx"
    shared.mkdir()
    (shared / "store.toml").write_text((tmp_path / "builder" / "cache" / "store.toml").read_text())
    result = efabuild("lookup", "--no-fetch", "--store", str(shared), key)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip() == (f"efabuild: artifact {key[:12]} ({key}) is not on store "
                                     f"(--no-fetch: S3 not asked)")
    fetched = efabuild("lookup", "--store", str(shared), key)
    assert fetched.returncode == 0, fetched.stderr
    assert fetched.stdout == f"{shared}/objects/{key[:2]}/{key}.sqsh\n"
    assert file_digest(Path(fetched.stdout.strip())) == file_digest(big_sqsh)
    no_creds = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}
    shared = tmp_path / "fsx2"
    shared.mkdir()
    (shared / "store.toml").write_text((tmp_path / "builder" / "cache" / "store.toml").read_text())
    result = efabuild("lookup", "--store", str(shared), key, env=no_creds)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "no AWS credentials" in result.stderr and "Traceback" not in result.stderr


def test_part_size_grows_for_huge_files():
    assert part_size_for(25 * 1024**3) == 16 * MiB  # 1600 parts
    assert part_size_for(400 * 1024**3) == 41 * MiB  # stays under 10,000 parts
    assert part_size_for(1) == 16 * MiB


def test_has_where_and_complete_fill_the_tiers_that_lack_an_artifact(tmp_path, settings, big_sqsh):
    local_only = Store([FilesystemTier(tmp_path / "cache", "local")], show_progress=False)
    key = key_for("complete")
    local_only.publish(key, big_sqsh, record_for(key, "g:l", big_sqsh))
    store = Store([FilesystemTier(tmp_path / "fsx", "shared"), FilesystemTier(tmp_path / "cache", "local")],
                  settings, show_progress=False, s3_options=SMALL_PARTS)
    assert store.where(key) == ("local",) and not store.has(key)
    assert store.complete(key) == {"local": REUSED, "shared": PUBLISHED, "s3": PUBLISHED}
    assert store.where(key) == ("shared", "local", "s3") and store.has(key)
    assert store.complete(key_for("never exported")) is None


def test_gc_on_a_nodes_bare_store_leaves_s3_alone_unless_asked(tmp_path, settings, s3_client):
    from efabuild.host.digest import file_digest
    from efabuild.store.record import ArtifactRecord

    builder = builder_store(tmp_path / "builder", settings)
    keys = [key_for(f"user{i}") for i in range(3)]
    for day, key in enumerate(keys, start=1):
        sqsh = make_sqsh(tmp_path, os.urandom(4096), f"user{day}")
        builder.publish(key, sqsh, ArtifactRecord.for_file(key, "ngc-efa:user", sqsh, file_digest(sqsh),
                                                           created=f"2026-11-0{day}T00:00:00.000000Z"))
    node = tmp_path / "node"
    node.mkdir()
    (node / "store.toml").write_text((tmp_path / "builder" / "cache" / "store.toml").read_text())

    def s3_sqshes() -> int:
        listing = s3_client.list_objects_v2(Bucket=settings.bucket, Prefix="efabuild/objects/")
        return sum(item["Key"].endswith(".sqsh") for item in listing.get("Contents", []))

    result = efabuild("gc", "--yes", "--keep", "1", "--store", str(node), check=True)
    assert s3_sqshes() == 3
    for key in keys[:2]:
        assert f"would delete with --s3  s3  {key[:12]}  ngc-efa:user" in result.stdout
    assert "S3 left alone (2 objects, give --s3 to delete them there too)" in result.stdout
    result = efabuild("gc", "--yes", "--s3", "--keep", "1", "--store", str(node), check=True)
    assert s3_sqshes() == 1 and f"deleted  s3  {keys[0][:12]}" in result.stdout


def test_ls_of_whole_objects_reads_no_chunk_index(tmp_path, s3_bucket, fault_proxy):
    """A whole-object artifact has no chunk index, and the listing ls reads already says so: its
    S3 bytes are the object's size, with no GET that finds no index (counted at a proxy)."""
    proxied = S3Config(bucket=s3_bucket, prefix="efabuild/", region="us-east-1", endpoint_url=fault_proxy.endpoint)
    sizes = {}
    for number in range(3):
        sqsh = make_sqsh(tmp_path, os.urandom(4096 * (number + 1)), f"whole{number}")
        sizes[published(tmp_path / "builder", proxied, sqsh, name=f"ngc-efa:user{number}")] = sqsh.stat().st_size
    listed = json.loads(efabuild("ls", "--json", "--store", str(tmp_path / "builder" / "cache"), check=True).stdout)
    assert {item["key"]: (item["s3_stored"], item["s3_unique"]) for item in listed["artifacts"]} == {
        key: (size, size) for key, size in sizes.items()}
    assert fault_proxy.gets(".chunks.json") == 0
