"""DSSE envelopes, signing keys (PEM, KMS), attestations, the trust policy and verification."""
