"""The S3 tier over a flaky network: connections reset by a fault-injecting proxy on loopback, in
front of the S3 server. Transfers retry (bounded, with backoff) and never leave a partial file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from efabuild.host.digest import file_digest
from efabuild.settings import S3Config
from efabuild.store.tiered import Store
from efabuild.store.tiers.fs import PUBLISHED, FilesystemTier
from tests.kits.storekit import efabuild, key_for, make_sqsh, record_for

pytestmark = pytest.mark.s3
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def big_sqsh(tmp_path_factory) -> Path:
    return make_sqsh(tmp_path_factory.mktemp("big"), os.urandom(12 * MiB), "big")


def s3_store(base: Path, endpoint: str, bucket: str, **options) -> Store:
    """A builder's store; whole objects (multipart uploads, ranged GETs) unless chunked=True."""
    settings = S3Config(bucket=bucket, prefix="efabuild", region="us-east-1", endpoint_url=endpoint)
    return Store([FilesystemTier(base, "local")], settings, show_progress=False,
                 s3_options={"part_size": 5 * MiB, "chunked": False, **options})


def node_store(base: Path, endpoint: str, bucket: str) -> Path:
    """A compute node's store directory: empty but for where S3 is (through the proxy)."""
    base.mkdir(parents=True)
    (base / "store.toml").write_text(f'[s3]\nbucket = "{bucket}"\nprefix = "efabuild"\nregion = "us-east-1"\n'
                                     f'endpoint_url = "{endpoint}"\n')
    return base


def test_a_ranged_get_reset_mid_body_is_retried(tmp_path, big_sqsh, moto_server, s3_bucket, fault_proxy):
    key = key_for("flaky fetch")
    s3_store(tmp_path / "builder", moto_server, s3_bucket).publish(key, big_sqsh,
                                                                   record_for(key, "ngc-efa:user", big_sqsh))
    node = node_store(tmp_path / "node", fault_proxy.endpoint, s3_bucket)
    cut = fault_proxy.reset_response(f"GET /{s3_bucket}/efabuild/objects/{key[:2]}/{key}.sqsh".encode(),
                                     after=1 * MiB, times=2)
    result = efabuild("lookup", "--store", str(node), key)
    assert result.returncode == 0, result.stderr
    assert cut.fired == 2  # two parts were cut mid-body and fetched again
    assert "Traceback" not in result.stderr
    assert file_digest(Path(result.stdout.strip())) == file_digest(big_sqsh)


def test_a_ranged_get_that_keeps_failing_gives_up_in_one_line(tmp_path, big_sqsh, moto_server, s3_bucket,
                                                              fault_proxy):
    key = key_for("dead fetch")
    s3_store(tmp_path / "builder", moto_server, s3_bucket).publish(key, big_sqsh,
                                                                   record_for(key, "ngc-efa:user", big_sqsh))
    node = node_store(tmp_path / "node", fault_proxy.endpoint, s3_bucket)
    fault_proxy.reset_response(f"GET /{s3_bucket}/efabuild/objects/{key[:2]}/{key}.sqsh".encode(),
                               after=64 * 1024, times=1000)
    result = efabuild("lookup", "--store", str(node), key)
    assert result.returncode == 1 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"efabuild: s3://{s3_bucket}/efabuild/objects/{key[:2]}/{key}.sqsh: ")
    assert "gave up after" in result.stderr
    assert not list((node / "tmp").glob("*")) if (node / "tmp").exists() else True  # no partial file left
    assert not (node / "objects").exists() or not list((node / "objects").rglob("*.sqsh"))


def test_a_part_upload_reset_is_retried_before_the_publish_fails(tmp_path, big_sqsh, s3_bucket, fault_proxy,
                                                                 s3_client):
    key = key_for("flaky upload")
    store = s3_store(tmp_path / "builder", fault_proxy.endpoint, s3_bucket)
    cut = fault_proxy.reset_request(b"partNumber=2 HTTP/1.1", times=5)  # one part, five times in a row
    assert store.publish(key, big_sqsh, record_for(key, "ngc-efa:user", big_sqsh)) == \
        {"local": PUBLISHED, "s3": PUBLISHED}
    assert cut.fired == 5
    body = s3_client.get_object(Bucket=s3_bucket, Key=f"efabuild/objects/{key[:2]}/{key}.sqsh")["Body"].read()
    assert len(body) == big_sqsh.stat().st_size and body == big_sqsh.read_bytes()


# ---- the chunked tier: chunk objects go through the same kinds of faults -----------------------

def test_chunk_gets_cut_mid_body_are_retried(tmp_path, big_sqsh, moto_server, s3_bucket, fault_proxy):
    key = key_for("flaky chunked fetch")
    s3_store(tmp_path / "builder", moto_server, s3_bucket, chunked=True).publish(
        key, big_sqsh, record_for(key, "ngc-efa:user", big_sqsh))
    node = node_store(tmp_path / "node", fault_proxy.endpoint, s3_bucket)
    cut = fault_proxy.reset_response(f"GET /{s3_bucket}/efabuild/chunks/".encode(), after=64 * 1024, times=3)
    result = efabuild("lookup", "--store", str(node), key)
    assert result.returncode == 0, result.stderr
    assert cut.fired == 3 and "Traceback" not in result.stderr
    assert file_digest(Path(result.stdout.strip())) == file_digest(big_sqsh)


def test_chunk_puts_reset_are_retried_before_the_publish_fails(tmp_path, big_sqsh, s3_bucket, fault_proxy):
    key = key_for("flaky chunked upload")
    store = s3_store(tmp_path / "builder", fault_proxy.endpoint, s3_bucket, chunked=True)
    cut = fault_proxy.reset_request(f"PUT /{s3_bucket}/efabuild/chunks/".encode(), times=3)
    assert store.publish(key, big_sqsh, record_for(key, "ngc-efa:user", big_sqsh)) == \
        {"local": PUBLISHED, "s3": PUBLISHED}
    assert cut.fired == 3
    node = node_store(tmp_path / "node", store.s3_settings.endpoint_url, s3_bucket)
    fetched = efabuild("lookup", "--store", str(node), key)
    assert fetched.returncode == 0, fetched.stderr
    assert file_digest(Path(fetched.stdout.strip())) == file_digest(big_sqsh)
