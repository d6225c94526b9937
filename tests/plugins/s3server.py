"""Fixtures for a real S3 protocol server on loopback (filled in with the S3 tier)."""
