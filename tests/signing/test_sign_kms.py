"""Signing with an AWS KMS key, against moto's KMS server on loopback (the same server process as
the S3 tests: moto serves every service).

What moto cannot show, and how the tests cope: moto's Sign ignores `MessageType` and signs
whatever `Message` it gets as a raw message. efabuild sends real KMS the SHA-256 of the DSSE PAE
with `MessageType=DIGEST` (KMS refuses RAW messages over 4 KiB). So:
- the end-to-end test signs in RAW mode, with a PAE under 4 KiB, and checks that the signature
  verifies with the public key the trust policy resolved from the ARN;
- a loopback proxy in front of moto records the production (DIGEST) request and asserts its shape:
  the 32-byte SHA-256 of exactly the PAE, MessageType DIGEST, ECDSA_SHA_256, the key's ARN. The
  signature moto returns for it (over the digest taken as a message) is not a valid DSSE signature,
  which is moto's behaviour, not efabuild's.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import threading
import urllib.request

import pytest

from efabuild.signing import dsse
from efabuild.signing.attest import sign_stored
from efabuild.signing.keys import KMS_RAW_LIMIT, KmsSigner
from efabuild.store.tiered import Store
from tests.kits.storekit import cache_dir
from tests.kits.signkit import NAME, object_path, stored_artifact
from tests.kits.storekit import efabuild

pytestmark = [pytest.mark.s3]


@pytest.fixture
def kms_key(moto_server: str) -> str:
    import boto3

    kms = boto3.client("kms", endpoint_url=moto_server, region_name="us-east-1")
    return kms.create_key(KeySpec="ECC_NIST_P256", KeyUsage="SIGN_VERIFY")["KeyMetadata"]["Arn"]


def test_kms_signed_artifact_verifies_with_the_resolved_public_key(tmp_path, moto_server, kms_key):
    store_root, key = stored_artifact(tmp_path / "ws" / "cache-parent", None)
    ws = tmp_path / "ws"
    (ws / "graphs").mkdir()
    (ws / "BUILD.toml").write_text(
        f'[store]\nlocal = "{store_root}"\n[trust]\nkeys = ["{kms_key}"]\nendpoint_url = "{moto_server}"\n')
    # RAW: moto ignores DIGEST (see the module docstring); the PAE is under KMS's RAW limit
    signer = KmsSigner(kms_key, endpoint_url=moto_server, message_type="RAW")
    stored = Store.at(store_root, show_progress=False)
    manifest = stored.manifest(key)
    from efabuild.signing.attest import statement_payload

    assert len(dsse.pae(dsse.PAYLOAD_TYPE, statement_payload(manifest))) < KMS_RAW_LIMIT
    assert sign_stored(stored, key, signer)[1:] == (["store"], True)
    unresolved = efabuild("verify", NAME, cwd=ws)
    assert unresolved.returncode == 2 and "is not resolved yet: run `efabuild trust`" in unresolved.stderr
    resolved = efabuild("trust", "--write", str(tmp_path / "node-trust.toml"), cwd=ws)
    assert resolved.returncode == 0, resolved.stderr
    assert kms_key in resolved.stdout
    node_config = (tmp_path / "node-trust.toml").read_text()
    assert "BEGIN PUBLIC KEY" in node_config and "arn:aws:kms" not in node_config.split("keys = [", 1)[1].replace(
        f"# {kms_key}", "")
    # from now on nothing asks KMS: point its endpoint at a closed port
    (ws / "BUILD.toml").write_text((ws / "BUILD.toml").read_text().replace(moto_server, "http://127.0.0.1:9"))
    verified = efabuild("verify", NAME, cwd=ws)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert efabuild("lookup", "--require-signature", NAME, cwd=ws).returncode == 0
    node = {"EFABUILD_TRUST_CONFIG": str(tmp_path / "node-trust.toml"), "EFABUILD_STORE": str(store_root),
            "EFABUILD_VERIFY_CACHE": str(cache_dir(tmp_path / "verified"))}
    assert efabuild("lookup", "--require-signature", NAME, env=node).returncode == 0


class _Recorder(http.server.BaseHTTPRequestHandler):
    upstream = ""
    seen: list[tuple[str, dict]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append((self.headers.get("X-Amz-Target", ""), json.loads(body or b"{}")))
        request = urllib.request.Request(self.upstream + self.path, data=body, method="POST",
                                         headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
        with urllib.request.urlopen(request) as answer:  # noqa: S310 - loopback moto
            data, status = answer.read(), answer.status
            headers = [(k, v) for k, v in answer.getheaders() if k.lower() not in ("transfer-encoding", "connection")]
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recording_proxy(moto_server: str):
    handler = type("Recorder", (_Recorder,), {"upstream": moto_server, "seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler.seen
    finally:
        server.shutdown()
        server.server_close()


def test_kms_is_asked_to_sign_the_sha256_of_the_pae_as_a_digest(tmp_path, kms_key, recording_proxy):
    endpoint, seen = recording_proxy
    store_root, key = stored_artifact(tmp_path, None)
    stored = Store.at(store_root, show_progress=False)
    signer = KmsSigner(kms_key, endpoint_url=endpoint)  # the production mode: DIGEST
    assert sign_stored(stored, key, signer)[2] is True
    envelope = dsse.decode(object_path(store_root, key, ".intoto.jsonl").read_bytes())
    signs = [body for target, body in seen if target.endswith(".Sign")]
    assert len(signs) == 1
    request = signs[0]
    assert request["MessageType"] == "DIGEST" and request["SigningAlgorithm"] == "ECDSA_SHA_256"
    assert request["KeyId"] == kms_key
    assert base64.b64decode(request["Message"]) == hashlib.sha256(envelope.pae()).digest()
    assert [s.keyid for s in envelope.signatures] == [signer.keyid]
    assert any(target.endswith(".GetPublicKey") for target, _ in seen)
    # the private key never left KMS: no request carried anything but the digest and the key id
    assert all(set(body) <= {"KeyId", "Message", "MessageType", "SigningAlgorithm", "GrantTokens"} for body in signs)


def test_a_kms_key_that_cannot_sign_is_one_line(tmp_path, moto_server):
    import boto3

    kms = boto3.client("kms", endpoint_url=moto_server, region_name="us-east-1")
    arn = kms.create_key(KeySpec="SYMMETRIC_DEFAULT", KeyUsage="ENCRYPT_DECRYPT")["KeyMetadata"]["Arn"]
    store_root, key = stored_artifact(tmp_path, None)
    result = efabuild("sign", key, "--key", arn, "--endpoint-url", moto_server,
                      env={"EFABUILD_STORE": str(store_root)})
    assert result.returncode in (1, 2) and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert arn in result.stderr


def test_a_resolved_key_is_never_written_through_a_state_directory_replaced_by_a_link(tmp_path, moto_server, kms_key):
    """The local store may sit on a shared path: `efabuild trust` (run as root) must not write the
    resolved public key into whatever directory a co-tenant linked in place of state/."""
    store_root = tmp_path / "ws" / "cache"
    ws = tmp_path / "ws"
    (ws / "graphs").mkdir(parents=True)
    (ws / "BUILD.toml").write_text(
        f'[store]\nlocal = "{store_root}"\n[trust]\nkeys = ["{kms_key}"]\nendpoint_url = "{moto_server}"\n')
    victim = tmp_path / "victim"
    victim.mkdir()
    store_root.mkdir()
    (store_root / "state").symlink_to(victim)
    refused = efabuild("trust", cwd=ws)
    assert refused.returncode == 1
    assert refused.stderr.strip() == f"efabuild: {store_root}/state: a symbolic link, not a directory"
    assert list(victim.iterdir()) == []
    (store_root / "state").unlink()
    assert efabuild("trust", cwd=ws).returncode == 0
    assert [p.suffix for p in (store_root / "state" / "trust").iterdir()] == [".pem"]
