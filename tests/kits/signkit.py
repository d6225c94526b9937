"""Helpers for the signing tests: keys, a stored signed artifact, and the node's trust config."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.kits.storekit import key_for, make_sqsh

NAME = "demo:user"


def make_key(directory: Path, kind: str) -> tuple[Path, Path]:
    """(private PEM, public PEM) of a fresh key, made with openssl: ec (P-256) or ed25519."""
    directory.mkdir(parents=True, exist_ok=True)
    private, public = directory / f"{kind}.pem", directory / f"{kind}.pub.pem"
    if kind == "ec":
        subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                        "-out", str(private)], check=True, capture_output=True)
    else:
        subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(private)], check=True,
                       capture_output=True)
    subprocess.run(["openssl", "pkey", "-in", str(private), "-pubout", "-out", str(public)], check=True,
                   capture_output=True)
    return private, public


def stored_artifact(directory: Path, signer, *, label: str = "artifact", name: str = NAME) -> tuple[Path, str]:  # noqa: ANN001
    """A store at directory/store holding one real .sqsh with record, manifest and (when `signer`)
    its signed statement, published through the store like make does. (store root, key)"""
    from efabuild.signing.attest import signed
    from efabuild.host.digest import file_digests
    from efabuild.provenance.stored import describe_sqsh
    from efabuild.store.tiered import Store
    from efabuild.store.record import ArtifactRecord

    directory.mkdir(parents=True, exist_ok=True)
    sqsh = make_sqsh(directory, os.urandom(200_000), label)
    key = key_for(label)
    blake3, sha256 = file_digests(sqsh)
    manifest = describe_sqsh(sqsh, key=key, name=name, sqsh_digest=blake3, sqsh_sha256=sha256,
                             export_options={"mksquashfs": ["-comp", "lzo", "-noD"]}, base=None, chain=[],
                             builder={}, times={})
    record = ArtifactRecord.for_file(key, name, sqsh, blake3, sha256=sha256)
    envelope = signed(manifest, signer) if signer is not None else None
    store = Store.at(directory / "store", show_progress=False)
    store.publish(key, sqsh, record, manifest, envelope=envelope)
    shutil.rmtree(directory / f"{label}-rootfs")
    sqsh.unlink()
    return directory / "store", key


def trust_config(path: Path, *public_keys: Path) -> Path:
    keys = ", ".join(f'"{key}"' for key in public_keys)
    path.write_text(f"[trust]\nkeys = [{keys}]\n")
    return path


def object_path(store: Path, key: str, suffix: str) -> Path:
    return store / "objects" / key[:2] / f"{key}{suffix}"
