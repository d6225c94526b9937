"""Signed statements of artifacts: made at export, extended by `efabuild sign`.

The payload is the in-toto statement derived from the artifact's manifest (`show --intoto`), as
canonical JSON. A later signature is added over the stored payload exactly as it is, so every
signature of an artifact covers the same bytes.
"""

from __future__ import annotations

from efabuild.errors import EfabuildError, NotFound
from efabuild.platforms import INDEX_PAYLOAD_TYPE
from efabuild.provenance import manifest as manifests
from efabuild.provenance.intoto import to_intoto
from efabuild.refs import short
from efabuild.signing import dsse


def statement_payload(manifest: bytes, where: str = "manifest") -> bytes:
    return dsse.statement_bytes(to_intoto(manifests.decode(manifest, where)))


def signed(manifest: bytes, signer, where: str = "manifest") -> bytes:  # noqa: ANN001 - a signing.Signer
    """A new envelope over the statement of `manifest`, signed once: the bundle file's bytes."""
    envelope = dsse.Envelope(statement_payload(manifest, where))
    return dsse.encode(envelope.with_signature(signer.sign(envelope.pae())))


def signed_index(data: bytes, *, signer) -> bytes:  # noqa: ANN001 - a signing.Signer
    """A name's platform index (platforms.index_bytes) in a DSSE envelope of its own payload type,
    signed once: what `lookup --require-signature` checks before it believes a platform's key."""

    envelope = dsse.Envelope(data, INDEX_PAYLOAD_TYPE)
    return dsse.encode(envelope.with_signature(signer.sign(envelope.pae())))


def add_signature(stored: bytes | None, manifest: bytes | None, signer, where: str) -> tuple[bytes, bool]:  # noqa: ANN001
    """(bundle bytes, whether a signature was added) with `signer`'s signature on the stored payload.

    Without a stored envelope, the statement is made from the manifest (an artifact exported
    before signing was configured)."""
    if stored is not None:
        envelope = dsse.decode(stored, where)
    elif manifest is not None:
        envelope = dsse.Envelope(statement_payload(manifest, where))
    else:
        raise NotFound(f"{where}: neither a signed statement nor a manifest to make one from")
    pae = envelope.pae()
    if any(s.keyid == signer.keyid for s in envelope.signatures):
        return dsse.encode(envelope), False
    signature = signer.sign(pae)
    return dsse.encode(envelope.with_signature(signature)), True


def sign_stored(store, ref: str, signer) -> tuple[str, list[str], bool]:  # noqa: ANN001
    """Add `signer`'s signature to the stored statement of `ref` on every tier holding it.

    Returns (key, tiers written, whether a signature was added)."""
    key = store.resolve(ref)
    record = store.record(key)
    if record is None:
        raise NotFound(f"no artifact {short(key)} ({ref}) in {store.describe()}")
    where = f"signed statement of {short(key)} ({record.name})"
    envelope, added = add_signature(store.envelope(key), store.manifest(key), signer, where)
    if not added:
        return key, [], False
    written = store.write_envelope(key, envelope)
    if not written:
        raise EfabuildError(f"{where}: no tier holds the artifact to store it beside")
    return key, written, True
