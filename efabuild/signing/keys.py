"""Keys that sign DSSE envelopes, and checking a signature against a public key.

Signers: a PEM private key file (ECDSA P-256 or Ed25519) and an AWS KMS `ECC_NIST_P256` key.
KMS is handed the SHA-256 of the PAE with `MessageType=DIGEST`: it refuses RAW messages over
4 KiB, and a statement's PAE can be larger. Either way the signature is ECDSA-P256-SHA256 over the
PAE in ASN.1 DER, which is what DSSE, in-toto and cosign verify. Private key material stays in
this process: it is never printed, logged, or written anywhere.

Everything here imports `cryptography`; the cached lookup path never imports this module.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from efabuild.configfile import read_bytes
from efabuild.errors import EfabuildError, InputError
from efabuild.signing.dsse import Signature

KMS_PREFIX = "arn:aws:kms:"
KMS_RAW_LIMIT = 4096  # bytes: the largest message KMS signs with MessageType=RAW
MAX_KEY_BYTES = 64 << 10  # a PEM private key is a few hundred bytes


class Signer(Protocol):
    keyid: str
    public_pem: bytes
    description: str  # names the key (a path or an ARN), never its material

    def sign(self, pae: bytes) -> Signature: ...


def keyid_of(public_key) -> str:  # noqa: ANN001 - a cryptography public key
    """sha256 of the DER SubjectPublicKeyInfo, hex: the keyid efabuild writes into signatures."""
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def public_pem_of(public_key) -> bytes:  # noqa: ANN001
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


class PemSigner:
    """A private key from a PEM file (unencrypted PKCS#8 or SEC1): ECDSA P-256 or Ed25519."""

    def __init__(self, path: str | Path) -> None:
        self.description = str(path)
        # a regular file of a key's size: a device, a FIFO or a huge file is bad input, not a hang
        data = read_bytes(path, str(path), MAX_KEY_BYTES)
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            # the library's message names the format problem, never the key's bytes
            raise InputError(f"not an unencrypted PEM private key ({_first_line(exc)})", str(path)) from None
        finally:
            del data
        if isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1):
            self._sign = lambda message: key.sign(message, ec.ECDSA(_sha256()))
        elif isinstance(key, ed25519.Ed25519PrivateKey):
            self._sign = key.sign
        else:
            raise InputError("unsupported key type: use ECDSA P-256 or Ed25519", str(path))
        public = key.public_key()
        self.keyid = keyid_of(public)
        self.public_pem = public_pem_of(public)

    def __repr__(self) -> str:  # never the key
        return f"PemSigner({self.description!r})"

    def sign(self, pae: bytes) -> Signature:
        return Signature(self.keyid, self._sign(pae))


class KmsSigner:
    """An AWS KMS asymmetric key (`ECC_NIST_P256`, `SIGN_VERIFY`), named by ARN, alias or id."""

    def __init__(self, key_id: str, *, region: str | None = None, endpoint_url: str | None = None,
                 message_type: str = "DIGEST", client=None) -> None:  # noqa: ANN001
        # message_type="RAW" exists for KMS look-alikes that ignore DIGEST (moto); RAW is refused
        # by real KMS for a PAE over 4 KiB, so production always sends the digest.
        if message_type not in ("DIGEST", "RAW"):
            raise ValueError(message_type)
        self.key_id = key_id
        self.description = key_id
        self.message_type = message_type
        if client is None:
            import boto3

            client = boto3.client("kms", region_name=region, endpoint_url=endpoint_url)
        self._client = client
        self.public_pem = kms_public_pem(client, key_id)
        self.keyid = keyid_of(load_public_key(self.public_pem, key_id))

    def __repr__(self) -> str:
        return f"KmsSigner({self.key_id!r})"

    def sign(self, pae: bytes) -> Signature:
        from botocore.exceptions import BotoCoreError, ClientError

        if self.message_type == "DIGEST":
            message = hashlib.sha256(pae).digest()
        elif len(pae) > KMS_RAW_LIMIT:
            raise EfabuildError(f"KMS {self.key_id}: a {len(pae)}-byte message is over KMS's RAW limit")
        else:
            message = pae
        try:
            answer = self._client.sign(KeyId=self.key_id, Message=message, MessageType=self.message_type,
                                       SigningAlgorithm="ECDSA_SHA_256")
        except (BotoCoreError, ClientError) as exc:
            raise EfabuildError(f"KMS {self.key_id}: sign failed: {_first_line(exc)}") from None
        return Signature(self.keyid, answer["Signature"])


def kms_public_pem(client, key_id: str) -> bytes:  # noqa: ANN001
    """The PEM public key of a KMS signing key (what a trust policy stores instead of the ARN)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        answer = client.get_public_key(KeyId=key_id)
    except (BotoCoreError, ClientError) as exc:
        raise EfabuildError(f"KMS {key_id}: cannot read its public key: {_first_line(exc)}") from None
    if answer.get("KeySpec") not in (None, "ECC_NIST_P256") or answer.get("KeyUsage") not in (None, "SIGN_VERIFY"):
        raise InputError(f"KMS key is {answer.get('KeySpec')}/{answer.get('KeyUsage')}, not an ECC_NIST_P256 "
                         f"SIGN_VERIFY key", key_id)
    public = serialization.load_der_public_key(answer["PublicKey"])
    return public_pem_of(public)


def load_public_key(pem: bytes, where: str):  # noqa: ANN201
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError) as exc:
        raise InputError(f"not a PEM public key ({_first_line(exc)})", where) from None
    if isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
        return key
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key
    raise InputError("unsupported public key type: use ECDSA P-256 or Ed25519", where)


def signature_valid(public_key, pae: bytes, sig: bytes) -> bool:  # noqa: ANN001
    try:
        if isinstance(public_key, ec.EllipticCurvePublicKey):
            public_key.verify(sig, pae, ec.ECDSA(_sha256()))
        else:
            public_key.verify(sig, pae)
    except (InvalidSignature, ValueError):
        return False
    return True


def signer_for(key: str, *, root: Path, region: str | None = None, endpoint_url: str | None = None) -> Signer:
    """A signer for `[sign] key`: a KMS ARN, else a PEM private key file (relative to `root`)."""
    if key.startswith(KMS_PREFIX):
        return KmsSigner(key, region=region or _arn_region(key), endpoint_url=endpoint_url)
    return PemSigner(root / Path(key).expanduser())


def _arn_region(arn: str) -> str | None:
    parts = arn.split(":")
    return parts[3] if len(parts) > 3 and parts[3] else None


def _sha256():  # noqa: ANN202
    return hashes.SHA256()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
