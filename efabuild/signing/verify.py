"""Is a stored artifact exactly what a trusted key signed? Full checks, and the cached answer.

A full verification of key K on a filesystem tier checks that:
- the record is well formed and is K's, and the `.sqsh` has its size and blake3 digest;
- the signed statement (`K.intoto.jsonl`) carries a valid signature by a key of the trust policy;
- the statement's subject is `K.sqsh` with the file's blake3 (and the record's sha256);
- the manifest, when there is one, has the record's manifest digest and names the same key and
  digests. With `sha256=True` the file's sha256 is computed and compared too (slower; blake3
  already binds the bytes).

`require_signed` is the job-start path: a hit in the verification cache costs stats only (no
hashing, no `cryptography`); a miss runs the full verification and remembers it. Heavy modules are
imported inside the full check, never at module level.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from efabuild.signing import verifycache
from efabuild.errors import EfabuildError
from efabuild.host import fsutil
from efabuild.platforms import INDEX_PAYLOAD_TYPE
from efabuild.store.layout import Layout
from efabuild.refs import short

MAX_METADATA_BYTES = 16 << 20


class VerificationFailed(EfabuildError):
    """An artifact failed verification; `problems` has one line each. Exit status 1."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _paths(layout: Layout, key: str) -> dict[str, Path]:
    return {"sqsh": layout.sqsh_path(key), "record": layout.record_path(key),
            "envelope": layout.envelope_path(key)}


def require_signed(layout: Layout, key: str, policy, *, cache: bool = True) -> bool:  # noqa: ANN001
    """Raise VerificationFailed unless `key` on this tier verifies under `policy`.

    Returns True when the answer came from the verification cache."""
    paths = _paths(layout, key)
    stamps = verifycache.take_stamps(paths)
    sqsh = paths["sqsh"].absolute()
    if cache and verifycache.is_verified(sqsh, key, stamps, policy.digest):
        return True
    started = time.time()
    problems = verify(layout, key, policy)
    if problems:
        raise VerificationFailed(problems)
    if cache:
        verifycache.remember(sqsh, key, paths, stamps, policy.digest, started)
    return False


def verify_and_remember(layout: Layout, key: str, policy, *, sha256: bool = False) -> list[str]:  # noqa: ANN001
    """A full verification (never answered from the cache); a success is remembered for lookups."""
    paths = _paths(layout, key)
    stamps = verifycache.take_stamps(paths)
    started = time.time()
    problems = verify(layout, key, policy, sha256=sha256)
    if not problems:
        verifycache.remember(paths["sqsh"].absolute(), key, paths, stamps, policy.digest, started)
    return problems


def verify(layout: Layout, key: str, policy, *, sha256: bool = False) -> list[str]:  # noqa: ANN001
    """Every problem with `key` on this tier, one line each (empty: it verifies)."""
    from efabuild.store.record import ArtifactRecord

    sqsh = layout.sqsh_path(key)
    try:
        record_bytes = _read(layout, layout.record_path(key))
        if record_bytes is None:
            return [f"{sqsh}: no record beside it"]
        record = ArtifactRecord.from_json(record_bytes, str(layout.record_path(key)))
    except EfabuildError as exc:
        return [str(exc)]
    problems: list[str] = []
    if record.key != key:
        problems.append(f"{layout.record_path(key)}: the record is for {short(record.key)}, not {short(key)}")
    try:
        info = fsutil.stat_under(layout.root, sqsh)  # a planted FIFO or device is never read
    except EfabuildError as exc:
        return problems + [str(exc)]
    if info is None:
        return [f"{sqsh}: no such file"]
    file_problems, actual, actual_sha256 = _check_file(sqsh, info.st_size, record, sha256)
    problems += file_problems
    problems += _check_manifest(layout, key, record)
    problems += _check_signed(layout, key, record, policy, actual or record.digest, actual_sha256)
    return problems


def _check_file(sqsh: Path, size: int, record, sha256: bool) -> tuple[list[str], str | None, str | None]:  # noqa: ANN001
    """The file against its record: problems, and its blake3 and sha256 when they were computed."""
    from efabuild.host.digest import file_digest, sha256_file

    problems = []
    actual = None
    if size != record.size:
        problems.append(f"{sqsh}: {size} bytes, its record says {record.size}")
    else:
        actual = file_digest(sqsh)
        if actual != record.digest:
            problems.append(f"{sqsh}: digest {actual}, its record says {record.digest}")
    actual_sha256 = sha256_file(sqsh) if sha256 else None
    if actual_sha256 is not None and record.sha256 is not None and actual_sha256 != record.sha256:
        problems.append(f"{sqsh}: sha256 {actual_sha256}, its record says {record.sha256}")
    return problems, actual, actual_sha256


def _check_signed(layout: Layout, key: str, record, policy, blake3: str,  # noqa: ANN001
                  sha256: str | None) -> list[str]:
    """The signed statement: a trusted signature, on a statement whose subject is this file."""
    envelope_path = layout.envelope_path(key)
    try:
        envelope_bytes = _read(layout, envelope_path)
    except EfabuildError as exc:
        return [str(exc)]
    return signed_problems(envelope_bytes, key, record, policy, blake3, sha256,
                           sqsh=str(layout.sqsh_path(key)), where=str(envelope_path))


def signed_problems(envelope_bytes: bytes | None, key: str, record, policy, blake3: str,  # noqa: ANN001
                    sha256: str | None, *, sqsh: str, where: str, chunk_index: str | None = None) -> list[str]:
    """A signed statement's bytes (None: unsigned) checked against the record it is to vouch
    for: a trusted signature, on a statement whose subject is `key`.sqsh with `blake3` (and
    `sha256`). A fetch calls it before it writes a byte; `sqsh` and `where` name the files. With
    `chunk_index` (an index's identity), the statement must name that index as its byproduct too:
    what a lazy mount serves chunks by before it has read the whole file."""
    from efabuild.signing import dsse

    if envelope_bytes is None:
        return [f"{sqsh}: unsigned (no {key}.intoto.jsonl)"]
    try:
        envelope = dsse.decode(envelope_bytes, where)
    except EfabuildError as exc:
        return [str(exc)]
    if trusted_signer(envelope, policy) is None:
        count = len(envelope.signatures)
        return [f"{where}: {'no signatures' if not count else f'{count} signature(s), none'} "
                f"by a key trusted by {policy.source}"]
    try:
        statement = envelope.statement(where)
    except EfabuildError as exc:
        return [str(exc)]
    problems = _check_subject(statement, key, record, where, blake3, sha256)
    if chunk_index is not None:
        problems += _check_chunk_index(statement, key, where, chunk_index)
    return problems


def _check_chunk_index(statement: dict, key: str, where: str, chunk_index: str) -> list[str]:
    from efabuild.provenance.intoto import chunk_index_name

    run = (statement.get("predicate") or {}).get("runDetails") if isinstance(statement.get("predicate"), dict) else None
    byproducts = run.get("byproducts") if isinstance(run, dict) else None
    named = [b for b in byproducts if isinstance(b, dict) and b.get("name") == chunk_index_name(key)] \
        if isinstance(byproducts, list) else []
    digests = [b.get("digest") for b in named if isinstance(b.get("digest"), dict)]
    if not digests:
        return [f"{where}: the signed statement names no chunk index (signed before lazy mounts, or cut into none)"]
    if any("blake3:" + str(d.get("blake3")) != chunk_index for d in digests):
        return [f"{where}: the signed statement names another chunk index than {chunk_index}"]
    return []


def index_problems(data: bytes, envelope_bytes: bytes | None, policy, where: str) -> list[str]:  # noqa: ANN001
    """A name's platform index checked against its DSSE envelope: a trusted signature, over exactly
    these bytes, of the index's own payload type ([] when it verifies)."""
    from efabuild.signing import dsse

    envelope_where = where.removesuffix(".json") + ".dsse.json"
    if envelope_bytes is None:
        return [f"{where}: unsigned platform index (no {envelope_where.rsplit('/', 1)[-1]} beside it)"]
    try:
        envelope = dsse.decode(envelope_bytes, envelope_where)
    except EfabuildError as exc:
        return [str(exc)]
    if envelope.payload_type != INDEX_PAYLOAD_TYPE:
        return [f"{envelope_where}: payloadType is {envelope.payload_type[:80]!r}, not {INDEX_PAYLOAD_TYPE}"]
    if envelope.payload != data:
        return [f"{envelope_where}: signs other bytes than the platform index beside it"]
    if trusted_signer(envelope, policy) is None:
        count = len(envelope.signatures)
        return [f"{envelope_where}: {'no signatures' if not count else f'{count} signature(s), none'} "
                f"by a key trusted by {policy.source}"]
    return []


def trusted_signer(envelope, policy) -> str | None:  # noqa: ANN001
    """What names the first trusted key with a valid signature on `envelope`, else None."""
    from efabuild.signing.keys import keyid_of, load_public_key, signature_valid

    pae = envelope.pae()
    for source, pem in policy.keys:
        public = load_public_key(pem, source)
        keyid = keyid_of(public)
        for signature in envelope.signatures:
            if signature.keyid and signature.keyid != keyid:
                continue
            if signature_valid(public, pae, signature.sig):
                return source
    return None


def _check_subject(statement: dict, key: str, record, where: str, blake3: str,  # noqa: ANN001
                   sha256: str | None) -> list[str]:
    from efabuild.provenance.intoto import PREDICATE_TYPE, STATEMENT_TYPE

    problems = []
    if statement.get("_type") != STATEMENT_TYPE or statement.get("predicateType") != PREDICATE_TYPE:
        problems.append(f"{where}: not an in-toto v1 statement with SLSA provenance v1")
    subjects = statement.get("subject")
    if not isinstance(subjects, list) or len(subjects) != 1 or not isinstance(subjects[0], dict):
        return problems + [f"{where}: the statement must name exactly one subject"]
    subject = subjects[0]
    digests = subject.get("digest") if isinstance(subject.get("digest"), dict) else {}
    if subject.get("name") != f"{key}.sqsh":
        problems.append(f"{where}: the statement is for {subject.get('name')!r}, not {key}.sqsh")
    if "blake3:" + str(digests.get("blake3")) != blake3:
        problems.append(f"{where}: the statement's subject has blake3 {digests.get('blake3')}, the file "
                        f"{blake3.split(':', 1)[1]}")
    for what, value in (("record", record.sha256), ("file", sha256)):
        if value is not None and digests.get("sha256") != value:
            problems.append(f"{where}: the statement's subject has sha256 {digests.get('sha256')}, the {what} {value}")
    return problems


def _check_manifest(layout: Layout, key: str, record) -> list[str]:  # noqa: ANN001
    from efabuild.host.digest import bytes_digest

    if record.manifest_digest is None:
        return []
    path = layout.manifest_path(key)
    data = _read(layout, path)
    if data is None:
        return [f"{path}: missing, though the record names its digest"]
    if bytes_digest(data) != record.manifest_digest:
        return [f"{path}: digest {bytes_digest(data)}, the record says {record.manifest_digest}"]
    try:
        manifest = json.loads(data)
        artifact = manifest.get("artifact") or {}
    except (ValueError, AttributeError, RecursionError):
        return [f"{path}: not a JSON manifest"]
    problems = []
    if manifest.get("key") != key:
        problems.append(f"{path}: the manifest is for {manifest.get('key')!r}, not {key}")
    if artifact.get("digest") != record.digest or artifact.get("sha256") != record.sha256:
        problems.append(f"{path}: the manifest's digests differ from the record's")
    return problems


def _read(layout: Layout, path: Path) -> bytes | None:
    """A file beside an artifact, bounded, never through a link or from a FIFO (fsutil)."""
    return fsutil.read_under(layout.root, path, MAX_METADATA_BYTES)


def signed_index_vet(policy, ref: str):  # noqa: ANN001, ANN202 - a TrustPolicy; a platformindex.IndexVet
    """Refuses (VerificationFailed) a platform index without a trusted signature over its bytes:
    whoever can write the store could otherwise point a platform at another key."""

    def vet(data: bytes, envelope: bytes | None, where: str) -> None:
        # the bytes read are hashed (a few hundred): a cached answer needs no signature check
        content = None if envelope is None else hashlib.sha256(b"%d\0" % len(data) + data + envelope).hexdigest()
        if content is not None and verifycache.content_verified(where, content, policy.digest):
            return
        problems = index_problems(data, envelope, policy, where)
        if problems:
            raise refusal(VerificationFailed(problems), ref)
        verifycache.remember_content(where, content, policy.digest)

    return vet


def refusal(exc: VerificationFailed, ref: str) -> VerificationFailed:
    """One line for Pyxis to show: the first problem says enough to act on."""
    if len(exc.problems) == 1 and exc.problems[0].startswith(f"refusing {ref}: "):
        return exc  # worded already (a platform index refused on the way)
    more = f" (and {len(exc.problems) - 1} more: efabuild verify {ref})" if len(exc.problems) > 1 else ""
    return VerificationFailed([f"refusing {ref}: {exc.problems[0]}{more}"])
