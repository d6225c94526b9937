"""A real S3 protocol server on loopback: moto's server over HTTP, for the S3 tier's tests.

boto3 talks to it like to AWS (HTTP requests, multipart, conditional writes); nothing of boto3 is
mocked in-process. Dummy credentials are set in the environment for the test session only, so
boto3's standard chain finds them (and child processes inherit them).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing-access-key",
    "AWS_SECRET_ACCESS_KEY": "testing-secret-key-never-printed",
    "AWS_DEFAULT_REGION": "us-east-1",
    # keep a developer's own AWS set-up out of the tests
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """Endpoint URL (http://127.0.0.1:PORT) of a moto S3 server running for the session."""
    from moto.server import ThreadedMotoServer

    saved = {name: os.environ.get(name) for name in DUMMY_CREDENTIALS}
    os.environ.update(DUMMY_CREDENTIALS)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def s3_bucket(moto_server: str) -> str:
    """A fresh, empty bucket on the moto server (one per test: no state leaks between tests)."""
    import boto3

    name = f"efabuild-test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1").create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_client(moto_server: str):  # noqa: ANN201 - a boto3 S3 client
    """A plain boto3 client for the test itself (to inspect or damage what the tier stored)."""
    import boto3

    return boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1")


@pytest.fixture
def settings(moto_server: str, s3_bucket: str):  # noqa: ANN201 - efabuild.settings.S3Config
    """A store's S3 settings: the test's fresh bucket, under images/ (a module may define its own)."""
    from efabuild.settings import S3Config

    return S3Config(bucket=s3_bucket, prefix="images/", region="us-east-1", endpoint_url=moto_server)
