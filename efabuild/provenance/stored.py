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

from efabuild.host.digest import file_digest
from efabuild.errors import EfabuildError, InputError, NotFound
from efabuild.settings import AuditPolicy
from efabuild.provenance import audit as checks_
from efabuild.provenance import manifest as manifests
from efabuild.provenance.fsview import SqshView
from efabuild.provenance.probe import EFA_PACKAGES_FILE, probe_tree
from efabuild.configfile import read_bytes

HOST_EFA_FILE = Path(EFA_PACKAGES_FILE)  # the host's own, when run on a cluster node
MAX_HOST_EFA_BYTES = 1 << 20


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
    platform: str | None = None,
    vcs: Mapping[str, str] | None = None,
    chunk_index: str | None = None,
) -> bytes:
    """Probe an exported .sqsh and return its canonical manifest bytes, ready for store.publish.

    Without `image_env`/`image_labels` the env and labels are read from the .sqsh's /etc/environment
    and /etc/rc: what Enroot and Pyxis will use when the container starts. `sqsh_sha256` may be a
    callable, asked once the probe is done. `platform` is the layer's (linux/arm64): its machine's
    directories are searched first and it is the machine the manifest records."""
    measured = probe_tree(SqshView(sqsh), image_env, image_labels, platform)
    if callable(sqsh_sha256):  # computed while the probe ran (see digest.Sha256Pass)
        sqsh_sha256 = sqsh_sha256()
    return manifests.encode(manifests.build_manifest(
        key=key, name=name, sqsh_digest=sqsh_digest, sqsh_size=Path(sqsh).stat().st_size,
        export_options=export_options, base=base, chain=chain, measured=measured, builder=builder,
        times=times, sqsh_sha256=sqsh_sha256, vcs=vcs, platform=platform, chunk_index=chunk_index,
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


def audit_stored(store: Any, ref: str, policy: AuditPolicy, host: checks_.HostFacts, *,
                 deep: bool = False) -> AuditResult:
    key = store.resolve(ref)
    record = store.record(key)
    if record is None:
        raise NotFound(f"no record for artifact {key[:12]} ({ref})")
    damaged = [tier.sqsh_path(key) for tier in store.fs_tiers if tier.has(key)] if store.local_hit(key) is None else []
    try:
        # a copy of the wrong size is audited as it stands (the integrity check names it), not
        # fetched over as a lookup would
        path: Path | None = damaged[0] if damaged else store.lookup(key, fetch=True, verify=False)
    except NotFound:
        path = None
    copies = _copies(store, key, deep)
    sqsh = measured = None
    probe_error = None
    manifest_bytes = store.manifest(key)
    if path is not None:
        sqsh = next((facts for _, where, facts, _ in copies if where == path), None)
        try:
            # measured again the way make measured it: on the platform its key was built for
            measured = probe_tree(SqshView(path), platform=_platform(manifest_bytes))
        except EfabuildError as exc:
            probe_error = str(exc)
    results = checks_.audit(
        record=record, manifest_bytes=manifest_bytes, sqsh=sqsh, measured=measured,
        policy=policy, host=host, probe_error=probe_error,
    )
    if path is not None:
        results[0] = _integrity_of_every_copy(record, manifest_bytes, copies)
    return AuditResult(ref, key, record.name, tuple(results))


def _platform(manifest_bytes: bytes | None) -> str | None:
    try:
        return manifests.platform_of(manifests.decode(manifest_bytes)) if manifest_bytes is not None else None
    except EfabuildError:
        return None  # manifest-integrity says what is wrong with it


def _copies(store: Any, key: str, deep: bool = False) -> list[tuple[str, Any, checks_.FileFacts | None, str | None]]:
    """(tier, path or URL, facts, why unreadable) for every tier holding `key`. A filesystem copy
    is hashed; an S3 copy is judged by store/chunked/health.py: its chunk index against the record and
    every chunk there as written (`deep`: every chunk read and checked against its id), or a whole
    object by its size and the digest stored with it (`deep`: its bytes hashed)."""
    found = []
    for tier in store.fs_tiers:
        if not tier.has(key):
            continue
        where = tier.sqsh_path(key)
        try:
            found.append((tier.name, where, checks_.FileFacts(where.stat().st_size, file_digest(where)), None))
        except OSError as exc:
            found.append((tier.name, where, None, f"{where}: cannot read: {exc.strerror}"))
    health = store.s3_health(key, deep=deep) if store.s3 is not None else None
    if health is not None:
        facts = checks_.FileFacts(health.size, health.digest or "none recorded")
        problems = "; ".join(problem.removeprefix("s3 tier: ") for problem in health.problems)
        found.append(("s3", store.s3.describe(key), facts if health.ok else None, problems or None))
    return found


def _integrity_of_every_copy(record: Any, manifest_bytes: bytes | None, copies: list) -> checks_.Check:
    try:
        manifest = manifests.decode(manifest_bytes, "manifest") if manifest_bytes is not None else None
    except EfabuildError:
        manifest = None  # manifest-integrity says what is wrong with it
    problems, good = [], []
    for tier, _, facts, unreadable in copies:
        check = checks_.sqsh_integrity(record, manifest, facts) if unreadable is None else None
        if check is None or check.status == checks_.FAIL:
            problems.append(f"{tier} tier: {unreadable or check.message}")
        else:
            good.append(tier)
    if problems:
        return checks_.Check("sqsh-integrity", checks_.FAIL, "; ".join(problems))
    return checks_.Check("sqsh-integrity", checks_.PASS,
                         f"{record.size} bytes, {record.digest[:19]}… as recorded, on {', '.join(good)}")


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
    """The version line of an installer's package list (a few KB): a FIFO, a device or a file
    of over 1 MiB there is not waited on or read, it says nothing."""
    try:
        text = read_bytes(path, str(path), limit=MAX_HOST_EFA_BYTES).decode("utf-8", errors="replace")
    except InputError:
        return None
    for line in text.splitlines():
        if line.startswith("# EFA installer version:"):
            return line.split(":", 1)[1].strip() or None
    return None
