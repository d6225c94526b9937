"""The trust policy: which public keys may sign the artifacts a job is allowed to start.

Stdlib only: `lookup --require-signature` reads it on every job start.

    [trust]
    keys = [
      "keys/release.pub.pem",                              # a PEM public key file
      "arn:aws:kms:us-east-1:123456789012:key/1234abcd-…",  # a KMS key (BUILD.toml only)
      '''-----BEGIN PUBLIC KEY-----
    …
    -----END PUBLIC KEY-----''',                             # the key itself (node config)
    ]
    endpoint_url = "https://kms.…"                          # optional, for resolving KMS keys

A workspace reads `[trust]` from BUILD.toml; a bare store (a compute node, the Pyxis importer)
reads the node config `/etc/efabuild/trust.toml` (`$EFABUILD_TRUST_CONFIG`). A KMS key is resolved
to its PEM public key when the policy is written — `efabuild trust` saves it under the local
store's `state/trust/`, `efabuild trust --write PATH` writes a node config with the PEM inline —
so a lookup never calls KMS. The policy's digest binds cached verifications to it.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from efabuild.configfile import load_toml, read_bytes
from efabuild.errors import InputError
from efabuild.grammar import endpoint_url_problem
from efabuild.host.fsutil import only_writable_by, replace_owned

TRUST_CONFIG_ENV = "EFABUILD_TRUST_CONFIG"
DEFAULT_NODE_CONFIG = Path("/etc/efabuild/trust.toml")
TRUST_KEYS = ("keys", "endpoint_url")
KMS_PREFIX = "arn:aws:kms:"
PEM_BEGIN = "-----BEGIN PUBLIC KEY-----"
MAX_PEM_BYTES = 64 << 10


class TrustPolicy:
    """Trusted PEM public keys and where the policy came from (a plain class: fast path)."""

    __slots__ = ("keys", "source")

    def __init__(self, keys: tuple[tuple[str, bytes], ...], source: str) -> None:
        self.keys = keys  # ((what named it: a path, an ARN or "inline"), PEM bytes)
        self.source = source

    @property
    def digest(self) -> str:
        """sha256 over the normalised PEM texts, in order-independent form."""
        canonical = sorted(_normalise(pem) for _, pem in self.keys)
        return hashlib.sha256(b"\0".join(canonical)).hexdigest()


def _normalise(pem: bytes) -> bytes:
    return b"\n".join(line.strip() for line in pem.strip().splitlines() if line.strip())


def kms_cache_name(arn: str) -> str:
    return hashlib.sha256(arn.encode()).hexdigest()[:32] + ".pem"


def parse_trust_table(table: object, base: Path, where: str, resolved_dir: Path | None) -> TrustPolicy:
    """Validate a [trust] table; file paths relative to `base`; KMS ARNs from `resolved_dir`."""
    if not isinstance(table, dict):
        raise InputError(f"must be a table, not {table!r}", where)
    unknown = sorted(set(table) - set(TRUST_KEYS))
    if unknown:
        raise InputError(f"unknown key {unknown[0]!r} (known: {', '.join(TRUST_KEYS)})", where)
    entries = table.get("keys", [])
    if not isinstance(entries, list) or not all(isinstance(e, str) and e.strip() for e in entries):
        raise InputError("must be a list of PEM public key files, PEM keys or KMS key ARNs", f"{where}.keys")
    keys = []
    for index, entry in enumerate(entries):
        entry_where = f"{where}.keys[{index}]"
        if entry.lstrip().startswith(PEM_BEGIN):
            keys.append(("inline", entry.strip().encode() + b"\n"))
        elif entry.startswith(KMS_PREFIX):
            if resolved_dir is None:
                raise InputError("a KMS key must be resolved to its PEM public key here: write this file with "
                                 "`efabuild trust --write`", entry_where)
            pem = _read_resolved_pem(resolved_dir / kms_cache_name(entry), entry_where, missing=(
                f"KMS key {entry} is not resolved yet: run `efabuild trust` (it asks KMS once; lookups never do)"))
            keys.append((entry, pem))
        else:
            path = base / Path(entry).expanduser()
            keys.append((str(path), _read_pem(path, entry_where)))
    return TrustPolicy(tuple(keys), where.split(":")[0])


def _read_resolved_pem(path: Path, where: str, missing: str) -> bytes:
    """A KMS key's public key as `efabuild trust` saved it: believed only when this user (or root)
    wrote it and nobody else may change it, since the local store may sit on a shared path and
    a planted key would be trusted as the KMS key's."""
    if not os.path.lexists(path):
        raise InputError(missing, where)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}", where) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not only_writable_by(st, (os.geteuid(), 0)):
            raise InputError(f"{path} was not written by this user (owner uid {st.st_uid}, mode "
                             f"{stat.S_IMODE(st.st_mode):o}): run `efabuild trust` again", where)
        data = os.read(fd, MAX_PEM_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_PEM_BYTES or PEM_BEGIN.encode() not in data:
        raise InputError(f"{path} is not a PEM public key ({PEM_BEGIN})", where)
    return data


def _read_pem(path: Path, where: str, missing: str | None = None) -> bytes:
    if not os.path.lexists(path):
        raise InputError(missing or f"no such PEM public key file {path}", where)
    data = read_bytes(path, f"{where}: {path}", MAX_PEM_BYTES)
    if PEM_BEGIN.encode() not in data:
        raise InputError(f"{path} is not a PEM public key ({PEM_BEGIN})", where)
    return data


def node_config_path(environ: dict[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    return Path(environ.get(TRUST_CONFIG_ENV) or DEFAULT_NODE_CONFIG)


def node_policy(environ: dict[str, str] | None = None) -> TrustPolicy | None:
    """The node config's policy; None when there is no node config."""
    path = node_config_path(environ)
    if not os.path.lexists(path):
        return None
    data = load_toml(path, str(path))
    unknown = sorted(set(data) - {"trust"})
    if unknown:
        raise InputError(f"unknown key {unknown[0]!r} (known: trust)", str(path))
    return parse_trust_table(data.get("trust", {}), path.parent, f"{path}: trust", None)


def workspace_policy(build_toml: Path, local_store: Path) -> TrustPolicy | None:
    """BUILD.toml's [trust]; None when it has none."""
    data = load_toml(build_toml, str(build_toml))
    if "trust" not in data:
        return None
    return parse_trust_table(data["trust"], build_toml.parent, f"{build_toml}: trust",
                             resolved_dir(local_store))


def resolved_dir(local_store: Path) -> Path:
    return Path(local_store) / "state" / "trust"


def policy_for(table, environ: dict[str, str] | None = None) -> TrustPolicy:  # noqa: ANN001 - StoreConfig
    """The policy that applies to a located store: BUILD.toml's for a workspace, else the node's.

    No policy at all is an InputError: requiring signatures without trusting any key would refuse
    everything, and is a configuration mistake worth one clear line."""
    policy, asked = None, []
    if not table.bare and Path(table.source).is_file():  # a workspace: source is its BUILD.toml
        policy = workspace_policy(Path(table.source), table.local)
        asked.append(f"{table.source} has no [trust] table" if policy is None else
                     f"{table.source} [trust] names no keys")
    if policy is None:  # a bare store, or a workspace without [trust]: the node's policy
        policy = node_policy(environ)
        path = node_config_path(environ)
        asked.append(f"{path} does not exist (an admin writes it from a workspace's [trust] with `efabuild trust "
                     f"--write {path}`)" if policy is None
                     else f"{path} names no keys (`[trust] keys = [...]`)")
    if policy is None or not policy.keys:
        raise InputError(f"no trusted keys: signatures are required but {'; '.join(asked)}")
    return policy


def resolve_workspace_keys(build_toml: Path, local_store: Path) -> TrustPolicy:
    """Ask KMS for the public key of every KMS ARN in BUILD.toml's [trust] and keep it under the
    local store; the policy then reads without KMS. (The one place trust calls KMS.)"""
    table = load_toml(build_toml, str(build_toml)).get("trust")
    if not isinstance(table, dict) or not table.get("keys"):
        raise InputError("no [trust] keys to resolve", str(build_toml))
    entries = table.get("keys")
    arns = [e for e in entries if isinstance(e, str) and e.startswith(KMS_PREFIX)] if isinstance(entries, list) else []
    endpoint_url = table.get("endpoint_url")
    if endpoint_url is not None:  # checked before boto3 sees it: a traceback, or a password repeated
        problem = endpoint_url_problem(endpoint_url) if isinstance(endpoint_url, str) else "must be a string"
        if problem:
            raise InputError(problem, f"{build_toml}: trust.endpoint_url")
    if arns:
        import boto3

        from efabuild.signing.keys import kms_public_pem  # deferred with boto3: KMS keys only

        for arn in arns:
            region = arn.split(":")[3] or None
            client = boto3.client("kms", region_name=region, endpoint_url=table.get("endpoint_url"))
            # no link followed below the store's root: it may sit on a shared path
            replace_owned(resolved_dir(local_store) / kms_cache_name(arn), kms_public_pem(client, arn), 0o644,
                          fsync=True, below=Path(local_store))
    return parse_trust_table(table, build_toml.parent, f"{build_toml}: trust", resolved_dir(local_store))


def node_config_text(policy: TrustPolicy) -> str:
    lines = ["# efabuild trust policy: artifacts must be signed by one of these keys.",
             "# Written by `efabuild trust --write`; KMS keys are resolved to their public keys.",
             "[trust]", "keys = ["]
    for source, pem in policy.keys:
        lines.append(f"  # {source}")
        lines.append('  """' + pem.decode().strip() + '""",')
    lines.append("]")
    return "\n".join(lines) + "\n"
