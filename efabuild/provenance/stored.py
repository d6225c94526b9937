"""Provenance of stored artifacts: the side-effect half (store, files, squashfs tools, host).

`describe_sqsh` makes the manifest bytes for a freshly exported .sqsh (called by make before
publishing); `audit_stored` gathers the facts for the pure checks in `audit`; `load_manifest`
reads and verifies a stored manifest for `show` and `diff`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from efabuild.digest import file_digest
from efabuild.errors import EfabuildError, NotFound
from efabuild.model import AuditPolicy
from efabuild.provenance import audit as checks_
from efabuild.provenance import manifest as manifests
from efabuild.provenance.fsview import SqshView
from efabuild.provenance.probe import EFA_PACKAGES_FILE, probe_tree

HOST_EFA_FILE = Path(EFA_PACKAGES_FILE)  # the host's own, when run on a cluster node


def describe_sqsh(
    sqsh: Path,
    *,
    key: str,
    name: str,
    sqsh_digest: str,
    export_options: Mapping[str, Any],
    base: Any,
    chain: list[Mapping[str, Any]],
    builder: Mapping[str, Any],
    times: Mapping[str, Any],
    image_env: Mapping[str, str] | Iterable[str] | None = None,
    image_labels: Mapping[str, str] | None = None,
    sqsh_sha256: str | Callable[[], str] | None = None,
) -> bytes:
    """Probe an exported .sqsh and return its canonical manifest bytes, ready for store.publish.

    Without `image_env`/`image_labels` the env and labels are read from the .sqsh's /etc/environment
    and /etc/rc: what Enroot and Pyxis will use when the container starts. `sqsh_sha256` may be a
    callable, asked once the probe is done."""
    measured = probe_tree(SqshView(sqsh), image_env, image_labels)
    if callable(sqsh_sha256):  # computed while the probe ran (see digest.Sha256Pass)
        sqsh_sha256 = sqsh_sha256()
    return manifests.encode(manifests.build_manifest(
        key=key, name=name, sqsh_digest=sqsh_digest, sqsh_size=Path(sqsh).stat().st_size,
        export_options=export_options, base=base, chain=chain, measured=measured, builder=builder,
        times=times, sqsh_sha256=sqsh_sha256,
    ))


@attrs.frozen
class StoredManifest:
    key: str
    name: str
    manifest: dict[str, Any]
    verified: bool  # its blake3 matches the record's manifest_digest


def load_manifest(store: Any, ref: str) -> StoredManifest:
    key = store.resolve(ref)
    record = store.record(key)
    if record is None:
        raise NotFound(f"no record for artifact {key[:12]} ({ref})")
    data = store.manifest(key)
    if data is None:
        raise NotFound(f"artifact {key[:12]} ({record.name}) has no manifest; rebuild it with efabuild make")
    where = f"manifest of {key[:12]} ({record.name})"
    manifest = manifests.decode(data, where)
    verified = record.manifest_digest is not None and manifests.digest(data) == record.manifest_digest
    return StoredManifest(key, record.name, manifest, verified)


@attrs.frozen
class AuditResult:
    ref: str
    key: str
    name: str
    checks: tuple[checks_.Check, ...]

    @property
    def failed(self) -> bool:
        return checks_.failed(list(self.checks))


def audit_stored(store: Any, ref: str, policy: AuditPolicy, host: checks_.HostFacts) -> AuditResult:
    key = store.resolve(ref)
    record = store.record(key)
    if record is None:
        raise NotFound(f"no record for artifact {key[:12]} ({ref})")
    try:
        path: Path | None = store.lookup(key, fetch=True, verify=False)
    except NotFound:
        path = None
    sqsh = measured = None
    probe_error = None
    if path is not None:
        sqsh = checks_.FileFacts(path.stat().st_size, file_digest(path))
        try:
            measured = probe_tree(SqshView(path))
        except EfabuildError as exc:
            probe_error = str(exc)
    results = checks_.audit(
        record=record, manifest_bytes=store.manifest(key), sqsh=sqsh, measured=measured,
        policy=policy, host=host, probe_error=probe_error,
    )
    return AuditResult(ref, key, record.name, tuple(results))


def host_facts(flag: str | None, policy: AuditPolicy, host_file: Path = HOST_EFA_FILE) -> checks_.HostFacts:
    """The host AMI's EFA installer: --host-efa, else this host's installer file, else BUILD.toml."""
    if flag:
        return checks_.HostFacts(flag, "--host-efa")
    version = read_efa_installer_version(host_file)
    if version is not None:
        return checks_.HostFacts(version, str(host_file))
    if policy.host_efa_installer:
        return checks_.HostFacts(policy.host_efa_installer, "BUILD.toml [audit] host_efa_installer")
    return checks_.HostFacts()


def read_efa_installer_version(path: Path) -> str | None:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("# EFA installer version:"):
            return line.split(":", 1)[1].strip() or None
    return None
