"""The S3 tier (or any S3-compatible store via endpoint_url), through boto3's credential chain.

Layout under the prefix mirrors a filesystem tier (objects/<k[:2]>/<key>.sqsh|.json|.manifest.json|
.intoto.jsonl); its names (refs/, platforms/) are s3names.py's.

Publishing order on S3 is the reverse of a filesystem tier: the .sqsh first, then the manifest and
the signed statement, then the record. The record is the commit point here (its presence means "complete"), because the
.sqsh upload is the expensive, racing step: it is created with IfNoneMatch='*', so of several
publishers exactly one completes it and the others get 412 and reuse it. The .sqsh carries its
blake3 digest as object metadata, so whoever writes the record after a lost race or a crash can
describe the bytes actually stored. A multipart upload becomes visible only on completion, whole;
parts carry CRC32 checksums that S3 verifies. Downloads run parallel ranged GETs (pinned to the
object's ETag) into a temp file on the destination filesystem and check the blake3 digest against
the record before the file is published there.

Checked against moto 5.2's server: it honours IfNoneMatch on PutObject and
CompleteMultipartUpload (412 PreconditionFailed). The HEAD of the record before uploading stays
anyway: it saves re-uploading 25 GB that is already there.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path

from botocore.exceptions import ClientError

from efabuild import notices
from efabuild.errors import EfabuildError, NotFound
from efabuild.refs import check_key, is_key, short
from efabuild.chunks.cdc import (
    AVG_SIZE,
    MAX_SIZE,
    MIN_SIZE,
    MAX_INDEX_BYTES,
    BadChunkIndex,
    ChunkIndex,
)
from efabuild.storesettings import S3Config
from efabuild.host.digest import is_digest
from efabuild.store.tiers.base import PUBLISHED, REUSED, S3_TIER, RemoteTier, check_publish_input, check_rewritable
from efabuild.store.layout import (
    ENVELOPE_LIMIT,
    ENVELOPE_SUFFIX,
    INDEX_SUFFIX,
    MANIFEST_SUFFIX,
    RECORD_LIMIT,
    RECORD_SUFFIX,
    SQSH_SUFFIX,
)
from efabuild.store.parallel import run_parallel
from efabuild.store.progress import Progress
from efabuild.store.record import ArtifactRecord
from efabuild.store.chunked.publish import publish as publish_chunks, send_ahead as send_chunks_ahead
from efabuild.store.chunked.assembly import Seed, assemble
from efabuild.store.chunked.s3 import ChunkError, ChunkStore, Transfer
from efabuild.store.s3client import DEFAULT_PART_SIZE, DEFAULT_WORKERS, S3Bucket, already_exists
from efabuild.store.tiers.s3names import S3Names
from efabuild.store.transfer import SIDECARS, DamagedCopy, fetch_into

DIGEST_METADATA = "blake3"  # x-amz-meta-blake3 on every .sqsh
SHA256_METADATA = "sha256"  # x-amz-meta-sha256 on .sqsh files exported since records carry it


class S3Tier(S3Bucket, RemoteTier):
    name = S3_TIER

    def __init__(
        self,
        settings: S3Config,
        *,
        client: object | None = None,
        part_size: int = DEFAULT_PART_SIZE,
        workers: int = DEFAULT_WORKERS,
        show_progress: bool = True,
        chunked: bool = True,
        chunking: tuple[int, int, int] | None = None,
    ) -> None:
        super().__init__(settings, client=client, workers=workers, part_size=part_size)
        self.names = S3Names(self)
        self.show_progress = show_progress
        self.chunked = chunked  # publish as chunks + index (else one whole object, as before)
        self.chunks = ChunkStore(self)
        # name -> artifacts this node holds with known chunk indexes (set by the Store): they seed
        # fetches and tell publish which chunks the bucket most likely has
        self.seed_provider: Callable[[str], tuple[Seed, ...]] | None = None
        self._index_bytes: dict[str, bytes | None] = {}
        self.chunking = chunking or (MIN_SIZE, AVG_SIZE, MAX_SIZE)  # (min, avg, max) chunk bytes
        self.last_transfer: Transfer | None = None  # what the last chunked publish or fetch moved
        self.last_index: ChunkIndex | None = None  # the index of the last chunked publish
        self.last_fetched: tuple[int, int] | None = None  # (device, inode) the last download checked
        self.last_tree: tuple[str, bytes] | None = None  # its digest and units' values, when assembled

    def __repr__(self) -> str:
        return f"S3Tier({self.url('')!r})"

    # ---- names
    def sqsh_object(self, key: str) -> str:
        return self._path("objects", key[:2], key + SQSH_SUFFIX)

    def record_object(self, key: str) -> str:
        return self._path("objects", key[:2], key + RECORD_SUFFIX)

    def manifest_object(self, key: str) -> str:
        return self._path("objects", key[:2], key + MANIFEST_SUFFIX)

    def envelope_object(self, key: str) -> str:
        return self._path("objects", key[:2], key + ENVELOPE_SUFFIX)

    def index_object(self, key: str) -> str:
        return self._path("objects", key[:2], key + INDEX_SUFFIX)

    def has(self, key: str) -> bool:
        return self._head(self.record_object(check_key(key))) is not None

    def record(self, key: str) -> ArtifactRecord | None:
        data = self._get_bytes(self.record_object(check_key(key)), RECORD_LIMIT)
        if data is None:
            return None
        return ArtifactRecord.from_json(data, self.url(self.record_object(key)))

    def sidecar(self, key: str, suffix: str) -> bytes | None:
        path = self._path("objects", key[:2], check_key(key) + suffix)
        if suffix == ENVELOPE_SUFFIX:
            return self._get_bytes(path, ENVELOPE_LIMIT)
        if suffix != INDEX_SUFFIX:
            return self._get_bytes(path)
        try:  # no more than an index may hold is read
            data = self._get_bytes(path, MAX_INDEX_BYTES, BadChunkIndex)
        except BadChunkIndex:
            return None  # no index to carry; a fetch finds it again, refuses it and takes a whole object
        self._index_bytes[key] = data  # the fetch that follows needs it too: one GET
        return data

    def describe(self, key: str) -> str:
        return self.url(self.sqsh_object(key))

    def write_sidecar(self, key: str, suffix: str, data: bytes) -> None:
        check_rewritable(suffix)  # one PUT, seen whole
        if not self.has(key):
            raise EfabuildError(f"s3 tier has no artifact {short(key)}")
        path = self.envelope_object(key)
        try:
            self._call(self.url(path), "put_object", Key=path, Body=data, ChecksumAlgorithm="CRC32",
                       ContentType="application/jsonl")
        except ClientError as exc:
            raise self._error(self.url(path), exc) from None

    def _object_keys(self, prefix: str) -> tuple[set[str], set[str], dict[str, datetime]]:
        """(keys with a record, keys with a .sqsh or chunk index, {.sqsh object: when written})
        under objects/<prefix>: one listing, streamed, of which only these names are kept."""
        fanout = self._path("objects", prefix[:2]) + "/" + prefix if prefix else self._path("objects") + "/"
        records, sqshes, sqsh_objects = set(), set(), {}
        for item in self._walk(fanout):
            base = item["Key"].rsplit("/", 1)[-1]
            if base.endswith(INDEX_SUFFIX) and is_key(base[: -len(INDEX_SUFFIX)]):
                sqshes.add(base[: -len(INDEX_SUFFIX)])  # a chunked artifact's data
                continue
            if base.endswith(tuple(SIDECARS)):
                continue
            if base.endswith(RECORD_SUFFIX) and is_key(base[: -len(RECORD_SUFFIX)]):
                records.add(base[: -len(RECORD_SUFFIX)])
            elif base.endswith(SQSH_SUFFIX):
                sqsh_objects[item["Key"]] = item["LastModified"]
                if is_key(base[: -len(SQSH_SUFFIX)]):
                    sqshes.add(base[: -len(SQSH_SUFFIX)])
        return records, sqshes, sqsh_objects

    def list(self, prefix: str = "") -> list[ArtifactRecord]:
        records, sqshes, _ = self._object_keys(prefix)
        keys = sorted(records & sqshes)
        found = run_parallel(self._record_or_warn, keys, self.workers)
        return [record for record in found if record is not None]

    def _record_or_warn(self, key: str) -> ArtifactRecord | None:
        try:
            return self.record(key)
        except EfabuildError as exc:
            notices.warn(f"s3 tier: skipping {short(key)}: {exc}")
            return None

    # ---- publish
    def publish(
        self,
        key: str,
        sqsh: str | os.PathLike[str],
        record: ArtifactRecord,
        manifest: bytes | None = None,
        *,
        show_progress: bool | None = None,
        envelope: bytes | None = None,
        sidecars: Mapping[str, bytes] | None = None,
        index: ChunkIndex | None = None,
        likely_present: set[str] = frozenset(),
        locked: bool = False,  # noqa: ARG002 - no key lock on S3: its conditional writes decide
    ) -> str:
        """Upload `sqsh` under `key`: PUBLISHED, or REUSED when S3 has (or just got) it.
        `sidecars` ({suffix: bytes}, see transfer.SIDECARS) are stored beside it like the manifest.

        Chunked (the default): only the chunks the bucket lacks are sent, then the chunk index,
        then the record as the commit point. `index` is the file's chunk index when this process
        computed it from these bytes (the export's); one a filesystem tier keeps beside the
        artifact comes in `sidecars` and is checked against the bytes before it is used (see
        store/chunked/publish.py); `likely_present` are chunk ids this node has seen elsewhere."""
        sqsh = Path(sqsh)
        check_publish_input(key, sqsh, record)
        show = self.show_progress if show_progress is None else show_progress
        self.last_transfer = self.last_index = None
        existing = self.record(key)
        if existing is not None:
            _warn_if_differs(key, existing, record)
            return REUSED
        sidecars = dict(sidecars or {})
        # a filesystem tier's chunk index is a hint: the chunked publish writes its own, a whole object none
        kept = sidecars.pop(INDEX_SUFFIX, None)

        def beside() -> None:  # the objects stored beside it, before the record that commits them
            for path, data, kind in ((self.manifest_object(key), manifest, "application/json"),
                                     (self.envelope_object(key), envelope, "application/jsonl"),
                                     *((self._path("objects", key[:2], key + s), d, None) for s, d in sidecars.items())):
                if data is not None:
                    self._put_new(path, data, **({"ContentType": kind} if kind else {}))
        if self.chunked:  # beside() runs while the chunks are checked again after the index
            likely_present = likely_present or self._likely_present(record.name, record.digest)
            self.last_index, self.last_transfer = publish_chunks(
                self.chunks, key, sqsh, record, index=index, kept=kept,
                likely_present=likely_present, chunking=self.chunking, show=show, meanwhile=beside)
            won = True
        else:
            won = self._upload_sqsh(key, sqsh, record, show)
            if not won:  # another publisher's .sqsh is there: the record must describe its bytes, not ours
                record, envelope = self._adopt_stored(key, record, envelope)
            beside()
        created = self._put_new(self.record_object(key), record.to_json(), ContentType="application/json")
        return PUBLISHED if won and created else REUSED

    def send_ahead(self, name: str, sqsh: str | os.PathLike[str], index: ChunkIndex):  # noqa: ANN201 - Future | None
        """Start sending the chunks of `sqsh` (of `name`, cut into `index` by its export) the bucket
        lacks, before its record exists, for its publish (store/chunked/publish.py's send_ahead: a
        Future); None, nothing sent, where this tier stores whole objects or cuts other sizes."""
        if not self.chunked or index.chunking != self.chunking:
            return None
        return send_chunks_ahead(self.chunks, index, Path(sqsh), lambda: self._likely_present(name, index.digest))

    def _likely_present(self, name: str, digest: str) -> set[str]:
        """Chunk ids of the artifacts this node holds for `name` (and others), its own bytes' copy
        (`digest`) aside: the ones a publish of it looks up before sending."""
        if self.seed_provider is None:
            return set()
        return {cid for seed in self.seed_provider(name) if seed.index.digest != digest for cid in seed.index.unique()}

    def _adopt_stored(self, key: str, record: ArtifactRecord,
                      envelope: bytes | None) -> tuple[ArtifactRecord, bytes | None]:
        """The record (and signed statement) for the .sqsh another publisher stored first."""
        head = self._head(self.sqsh_object(key)) or {}
        stored = head.get("Metadata", {}).get(DIGEST_METADATA)
        stored_digest = f"blake3:{stored}" if stored else None
        if not is_digest(stored_digest) or head.get("ContentLength") != record.size:
            raise EfabuildError(
                f"{self.url(self.sqsh_object(key))}: exists without a usable blake3 digest "
                f"(not written by efabuild?); delete it to publish {short(key)}"
            )
        if stored_digest == record.digest:
            return record, envelope
        _warn_if_differs(key, record._replace(digest=stored_digest), record)
        stored_sha256 = head.get("Metadata", {}).get(SHA256_METADATA)
        # the statement names our bytes, not the ones stored
        return record._replace(digest=stored_digest, sha256=stored_sha256 or None), None

    def chunk_index(self, key: str) -> ChunkIndex | None:
        """The artifact's chunk index, or None for a whole-object artifact."""
        path = self.index_object(check_key(key))
        data = self._index_bytes.pop(key) if key in self._index_bytes \
            else self._get_bytes(path, MAX_INDEX_BYTES, BadChunkIndex)
        return None if data is None else ChunkIndex.from_json(data, self.url(path))

    def _upload_sqsh(self, key: str, sqsh: Path, record: ArtifactRecord, show: bool) -> bool:
        """Upload once, reading the file once; False if the object already existed."""
        path = self.sqsh_object(key)
        metadata = {DIGEST_METADATA: record.digest.split(":", 1)[1]}
        if record.sha256:
            metadata[SHA256_METADATA] = record.sha256
        with Progress(f"upload {short(key)} to {self.url(path)}", record.size, enabled=show) as bar:
            return self.upload_file(path, sqsh, record.size, metadata, bar)

    def download(self, key: str, dest: Path, record: ArtifactRecord, *, show_progress: bool | None = None,
                 seeds: tuple[Seed, ...] = ()) -> ChunkIndex | None:
        """Fetch the .sqsh into the new file `dest`, verified against `record` (else removed).

        A chunked artifact is assembled from `seeds` (files here with known chunk indexes) and
        downloads of what they lack; its index is returned, kept beside it to seed the next fetch."""
        show = self.show_progress if show_progress is None else show_progress
        try:
            index = self.chunk_index(key)
            if index is not None:
                if not seeds and self.seed_provider is not None:
                    seeds = self.seed_provider(record.name)
                self._download_chunks(key, dest, record, index, seeds, show)
                return index
        except (BadChunkIndex, ChunkError, DamagedCopy) as exc:
            if self._head(self.sqsh_object(key)) is None:
                raise
            # an index someone created beside a whole-object artifact must not make it unfetchable
            notices.warn(f"{exc}; fetching the whole object instead")
        self.last_tree = None  # a whole object's fetch keeps no tree
        self._download_whole(key, dest, record, show)
        return None

    def _download_chunks(self, key: str, dest: Path, record: ArtifactRecord, index: ChunkIndex,
                         seeds: tuple[Seed, ...], show: bool) -> None:
        what = self.url(self.index_object(key))
        if index.size != record.size or index.digest != record.digest:
            raise DamagedCopy(self.name, what, f"describes {index.size} bytes {index.digest}, its record says "
                                               f"{record.size} bytes {record.digest}; not fetched")

        def fill(fd: int) -> str:
            with Progress(f"fetch {short(key)} from {what}", index.size, enabled=show) as bar:
                assembled = assemble(self.chunks, index, fd, seeds, progress=bar.update)
            self.last_transfer = assembled.transfer
            self.last_tree = (assembled.digest, assembled.cvs) if assembled.cvs is not None else None
            return assembled.digest

        self.last_fetched = fetch_into(self.name, dest, record, what, fill)

    def _download_whole(self, key: str, dest: Path, record: ArtifactRecord, show: bool) -> None:
        path = self.sqsh_object(check_key(key))
        what = self.url(path)
        head = self._head(path)
        if head is None:
            raise NotFound(f"{what}: missing although its record exists (deleted meanwhile?)")
        size, etag = head["ContentLength"], head["ETag"]
        if size != record.size:
            raise DamagedCopy(self.name, what, f"{size} bytes, its record says {record.size}; not fetched")

        def fill(fd: int) -> None:
            os.ftruncate(fd, size)
            with Progress(f"fetch {short(key)} from {what}", size, enabled=show) as bar:
                try:
                    self.get_ranges(path, fd, size, etag, bar)
                except ClientError as exc:
                    if already_exists(exc):
                        raise EfabuildError(f"{what}: changed while being fetched; try again") from None
                    raise self._error(what, exc) from None

        self.last_fetched = fetch_into(self.name, dest, record, what, fill)

    # ---- removal
    def delete(self, key: str) -> None:
        """Record first (uncommits), then the .sqsh and manifest."""
        check_key(key)
        sidecars = [self._path("objects", key[:2], key + suffix) for suffix in SIDECARS]
        for path in (self.record_object(key), self.sqsh_object(key), *sidecars):
            self._delete_object(path)


def _warn_if_differs(key: str, existing: ArtifactRecord, new: ArtifactRecord) -> None:
    if existing.digest != new.digest:
        notices.warn(f"s3 tier: {short(key)} exists with digest {existing.digest}; the new export has "
                     f"{new.digest} (export not byte-identical); keeping the stored one")
