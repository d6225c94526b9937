"""DSSE envelopes as in-toto attestation bundles (`<key>.intoto.jsonl`): encode, decode, PAE.

An envelope wraps the in-toto statement bytes (`payload`, base64 on the wire) with signatures
over the pre-authentication encoding PAE(payloadType, payload). The bundle file holds exactly one
envelope on one line (cosign rejects a second line); a second signer adds to `signatures` and
leaves the payload byte for byte as it was. Pure: no keys, no files.

Spec: https://github.com/secure-systems-lab/dsse/blob/master/protocol.md
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import attrs

from efabuild.errors import EfabuildError

PAYLOAD_TYPE = "application/vnd.in-toto+json"
MAX_ENVELOPE_BYTES = 4 << 20  # a statement is a few KiB; anything this large is not ours


@attrs.frozen
class Signature:
    keyid: str  # sha256 of the signer's public key (DER SubjectPublicKeyInfo), hex; "" if unknown
    sig: bytes  # ECDSA: ASN.1 DER; Ed25519: 64 raw bytes


@attrs.frozen
class Envelope:
    payload: bytes
    payload_type: str = PAYLOAD_TYPE
    signatures: tuple[Signature, ...] = ()

    def pae(self) -> bytes:
        return pae(self.payload_type, self.payload)

    def with_signature(self, signature: Signature) -> Envelope:
        """This envelope with one more signature (an identical one is not added twice)."""
        if signature in self.signatures:
            return self
        return attrs.evolve(self, signatures=(*self.signatures, signature))

    def statement(self, where: str = "envelope") -> dict[str, Any]:
        """The signed in-toto statement as a dict (only meaningful once a signature is checked)."""
        if self.payload_type != PAYLOAD_TYPE:
            raise EfabuildError(f"{where}: payloadType is {self.payload_type!r}, not {PAYLOAD_TYPE}")
        try:
            statement = json.loads(self.payload)
        except (ValueError, RecursionError) as exc:
            raise EfabuildError(f"{where}: the payload is not a JSON statement ({_why(exc)})") from None
        if not isinstance(statement, dict):
            raise EfabuildError(f"{where}: the payload is not a JSON object")
        return statement


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSEv1 pre-authentication encoding: what is actually signed."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def statement_bytes(statement: dict[str, Any]) -> bytes:
    """Canonical payload bytes of a statement: sorted keys, compact, UTF-8."""
    return json.dumps(statement, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def encode(envelope: Envelope) -> bytes:
    """The bundle file's bytes: one JSON line, newline-terminated."""
    data = {
        "payloadType": envelope.payload_type,
        "payload": base64.b64encode(envelope.payload).decode(),
        "signatures": [{"keyid": s.keyid, "sig": base64.b64encode(s.sig).decode()} for s in envelope.signatures],
    }
    return json.dumps(data, separators=(",", ":")).encode() + b"\n"


def decode(data: bytes, where: str = "envelope") -> Envelope:
    """Parse a bundle file holding one envelope; EfabuildError naming `where` otherwise."""
    if len(data) > MAX_ENVELOPE_BYTES:
        raise EfabuildError(f"{where}: {len(data)} bytes, larger than any envelope efabuild writes")
    lines = [line for line in data.splitlines() if line.strip()]
    if len(lines) != 1:
        raise EfabuildError(f"{where}: holds {len(lines)} envelopes, not exactly one")
    try:
        raw = json.loads(lines[0])
    except (ValueError, RecursionError) as exc:
        raise EfabuildError(f"{where}: not a JSON envelope ({_why(exc)})") from None
    if not isinstance(raw, dict):
        raise EfabuildError(f"{where}: not a JSON envelope object")
    payload_type, payload, signatures = raw.get("payloadType"), raw.get("payload"), raw.get("signatures")
    if not isinstance(payload_type, str) or not isinstance(payload, str) or not isinstance(signatures, list):
        raise EfabuildError(f"{where}: an envelope needs payloadType, payload and a signatures list")
    parsed = []
    for index, entry in enumerate(signatures):
        if not isinstance(entry, dict) or not isinstance(entry.get("sig"), str):
            raise EfabuildError(f"{where}: signatures[{index}] has no sig")
        keyid = entry.get("keyid") or ""
        if not isinstance(keyid, str):
            raise EfabuildError(f"{where}: signatures[{index}].keyid is not a string")
        parsed.append(Signature(keyid, _b64(entry["sig"], f"{where}: signatures[{index}].sig")))
    return Envelope(_b64(payload, f"{where}: payload"), payload_type, tuple(parsed))


def _b64(text: str, where: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        try:  # DSSE allows URL-safe base64 too
            return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            raise EfabuildError(f"{where}: not base64") from None


def _why(exc: Exception) -> str:
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
