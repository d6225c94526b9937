"""The S3 tier (or any S3-compatible store via endpoint_url), through boto3's credential chain.

Layout under the prefix mirrors a filesystem tier (objects/<k[:2]>/<key>.sqsh|.json|.manifest.json|
.intoto.jsonl);
a name's history is one empty object per entry, refs/<graph>/<layer>/<time>.<key>, so concurrent
appends never overwrite each other.

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

import math
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

import attrs
import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from efabuild.store.digest import file_digest, is_digest
from efabuild.errors import EfabuildError, NotFound
from efabuild.store.progress import Progress
from efabuild.settings import S3Config
from efabuild.store.fs import PUBLISHED, REUSED, check_publish_input
from efabuild.store.layout import ENVELOPE_SUFFIX, INDEX_SUFFIX, MANIFEST_SUFFIX, RECORD_SUFFIX, SQSH_SUFFIX
from efabuild.refs import check_key, is_key, short, split_name
from efabuild.store.record import ArtifactRecord, utc_now
from efabuild.store.transfer import SIDECARS, DamagedCopy
from efabuild.store.chunks import (
    AVG_SIZE,
    MAX_SIZE,
    MIN_SIZE,
    BadChunkIndex,
    ChunkIndex,
    Usage,
    chunk_file,
    usage,
)
from efabuild.store.s3chunks import CHUNKS_DIR, ChunkStore, Seed, Transfer, assemble, run_parallel

MiB = 1024 * 1024
MIN_PART_SIZE = 5 * MiB  # S3's floor for all parts but the last
DEFAULT_PART_SIZE = 16 * MiB
MAX_PARTS = 10_000
DEFAULT_WORKERS = 10
READ_CHUNK = 1 * MiB
DIGEST_METADATA = "blake3"  # x-amz-meta-blake3 on every .sqsh
SHA256_METADATA = "sha256"  # x-amz-meta-sha256 on .sqsh files exported since records carry it
STALE_UPLOAD = timedelta(days=1)
REQUEST_ATTEMPTS = 5  # per S3 request, by botocore (with its own backoff)
STREAM_ATTEMPTS = 5  # per ranged GET whose body is cut mid-stream, by us
STREAM_BACKOFF = 0.25  # seconds before the 2nd attempt, doubled after each (with jitter)
# Error codes meaning "a conditional create found the object already there"
_ALREADY_EXISTS = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
_MISSING = {"404", "NoSuchKey", "NotFound"}


def _why(exc: BaseException) -> str:
    """The root cause of a transfer error, in a few words (botocore nests urllib3's)."""
    while exc.__context__ is not None and isinstance(exc.__context__, (BotoCoreError, OSError)):
        exc = exc.__context__
    return f"{type(exc).__name__}: {exc.strerror}" if isinstance(exc, OSError) and exc.strerror else str(exc)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _already_exists(exc: ClientError) -> bool:
    return _code(exc) in _ALREADY_EXISTS or _status(exc) in (409, 412)


def _missing(exc: ClientError) -> bool:
    return _code(exc) in _MISSING or _status(exc) == 404


def part_size_for(size: int, preferred: int = DEFAULT_PART_SIZE) -> int:
    """Parts of `preferred` bytes, grown (whole MiB) when the file would need > 10,000 parts."""
    needed = math.ceil(size / MAX_PARTS)
    return max(preferred, MIN_PART_SIZE, math.ceil(needed / MiB) * MiB)


class S3Tier:
    name = "s3"

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
        self.settings = settings
        self.bucket = settings.bucket
        self.prefix = settings.prefix.strip("/")
        self.part_size = max(part_size, MIN_PART_SIZE)
        self.workers = max(1, workers)
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
        self._client = client
        self._client_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"S3Tier({self.url('')!r})"

    # ---- names
    def url(self, path: str) -> str:
        return f"s3://{self.bucket}/{path}"

    def _path(self, *parts: str) -> str:
        return "/".join(([self.prefix] if self.prefix else []) + list(parts))

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

    def _refs_prefix(self, name: str) -> str:
        graph, layer = split_name(name)
        return self._path("refs", graph, layer) + "/"

    # ---- client
    @property
    def client(self):  # noqa: ANN201 - boto3's client class is generated at run time
        with self._client_lock:
            if self._client is None:
                # a dead endpoint should fail in seconds, not minutes; transfers retry parts anyway
                config = Config(
                    max_pool_connections=self.workers + 4,
                    # standard mode retries throttling, 5xx and connection errors of a request,
                    # re-sending its body: a part upload cut by a reset is sent again
                    retries={"mode": "standard", "max_attempts": REQUEST_ATTEMPTS},
                    connect_timeout=10,
                )
                self._client = boto3.session.Session().client(
                    "s3",
                    region_name=self.settings.region,
                    endpoint_url=self.settings.endpoint_url,
                    config=config,
                )
            return self._client

    def _call(self, what: str, operation: str, **kwargs: object) -> dict:
        """One S3 call; failures become one-line EfabuildErrors (never credentials)."""
        try:
            return getattr(self.client, operation)(Bucket=self.bucket, **kwargs)
        except NoCredentialsError:
            raise EfabuildError(
                f"{what}: no AWS credentials (boto3's standard chain: environment, ~/.aws, "
                f"instance or pod role)"
            ) from None
        except ClientError:
            raise
        except BotoCoreError as exc:
            raise EfabuildError(f"{what}: {exc}") from None

    def _error(self, what: str, exc: ClientError) -> EfabuildError:
        message = exc.response.get("Error", {}).get("Message") or _code(exc)
        return EfabuildError(f"{what}: S3 error {_code(exc) or _status(exc)}: {message}")

    def _get_bytes(self, path: str) -> bytes | None:
        try:
            response = self._call(self.url(path), "get_object", Key=path)
        except ClientError as exc:
            if _missing(exc):
                return None
            raise self._error(self.url(path), exc) from None
        return response["Body"].read()

    def _head(self, path: str) -> dict | None:
        try:
            return self._call(self.url(path), "head_object", Key=path)
        except ClientError as exc:
            if _missing(exc):
                return None
            raise self._error(self.url(path), exc) from None

    def _put_new(self, path: str, body: bytes, **extra: object) -> bool:
        """Create an object unless it exists; False when someone else created it first."""
        try:
            self._call(self.url(path), "put_object", Key=path, Body=body, IfNoneMatch="*",
                       ChecksumAlgorithm="CRC32", **extra)
        except ClientError as exc:
            if _already_exists(exc):
                return False
            raise self._error(self.url(path), exc) from None
        return True

    # ---- reads
    def has(self, key: str) -> bool:
        return self._head(self.record_object(check_key(key))) is not None

    def record(self, key: str) -> ArtifactRecord | None:
        data = self._get_bytes(self.record_object(check_key(key)))
        if data is None:
            return None
        return ArtifactRecord.from_json(data, self.url(self.record_object(key)))

    def manifest(self, key: str) -> bytes | None:
        return self.sidecar(key, MANIFEST_SUFFIX)

    def sidecar(self, key: str, suffix: str) -> bytes | None:
        """An object stored beside the .sqsh (e.g. its manifest), None when absent."""
        data = self._get_bytes(self._path("objects", key[:2], check_key(key) + suffix))
        if suffix == INDEX_SUFFIX:
            self._index_bytes[key] = data  # the fetch that follows needs it too: one GET
        return data

    def stored_facts(self, key: str) -> tuple[int, str | None]:
        """(size, blake3 digest stored with it) of the .sqsh object, from a HEAD."""
        head = self._head(self.sqsh_object(check_key(key))) or {}
        stored = head.get("Metadata", {}).get(DIGEST_METADATA)
        return head.get("ContentLength", -1), f"blake3:{stored}" if stored else None

    def describe(self, key: str) -> str:
        return self.url(self.sqsh_object(key))

    def envelope(self, key: str) -> bytes | None:
        """The signed statement (one DSSE envelope), None when unsigned."""
        return self._get_bytes(self.envelope_object(check_key(key)))

    def write_envelope(self, key: str, envelope: bytes) -> None:
        """Replace the signed statement of a committed object (a signature was added): one PUT,
        which S3 makes visible whole."""
        if not self.has(key):
            raise EfabuildError(f"s3 tier has no artifact {short(key)}")
        path = self.envelope_object(key)
        try:
            self._call(self.url(path), "put_object", Key=path, Body=envelope, ChecksumAlgorithm="CRC32",
                       ContentType="application/jsonl")
        except ClientError as exc:
            raise self._error(self.url(path), exc) from None

    def _list(self, prefix: str) -> list[dict]:
        found: list[dict] = []
        token: str | None = None
        while True:
            kwargs: dict = {"Prefix": prefix}
            if token:
                kwargs["ContinuationToken"] = token
            try:
                page = self._call(self.url(prefix), "list_objects_v2", **kwargs)
            except ClientError as exc:
                raise self._error(self.url(prefix), exc) from None
            found.extend(page.get("Contents", []))
            if not page.get("IsTruncated"):
                return found
            token = page["NextContinuationToken"]

    def _object_keys(self, prefix: str) -> tuple[set[str], set[str], list[dict]]:
        """(keys with a record, keys with a .sqsh, raw listing) under objects/<prefix>."""
        fanout = self._path("objects", prefix[:2]) + "/" + prefix if prefix else self._path("objects") + "/"
        listing = self._list(fanout)
        records, sqshes = set(), set()
        for item in listing:
            base = item["Key"].rsplit("/", 1)[-1]
            if base.endswith(INDEX_SUFFIX) and is_key(base[: -len(INDEX_SUFFIX)]):
                sqshes.add(base[: -len(INDEX_SUFFIX)])  # a chunked artifact's data
                continue
            if base.endswith(tuple(SIDECARS)):
                continue
            if base.endswith(RECORD_SUFFIX) and is_key(base[: -len(RECORD_SUFFIX)]):
                records.add(base[: -len(RECORD_SUFFIX)])
            elif base.endswith(SQSH_SUFFIX) and is_key(base[: -len(SQSH_SUFFIX)]):
                sqshes.add(base[: -len(SQSH_SUFFIX)])
        return records, sqshes, listing

    def resolve_prefix(self, prefix: str) -> list[str]:
        records, sqshes, _ = self._object_keys(prefix)
        return sorted(records & sqshes)

    def list(self) -> list[ArtifactRecord]:
        records, sqshes, _ = self._object_keys("")
        keys = sorted(records & sqshes)
        with ThreadPoolExecutor(self.workers) as pool:
            found = list(pool.map(self._record_or_warn, keys))
        return [record for record in found if record is not None]

    def _record_or_warn(self, key: str) -> ArtifactRecord | None:
        try:
            return self.record(key)
        except EfabuildError as exc:
            print(f"efabuild: warning: s3 tier: skipping {short(key)}: {exc}", file=sys.stderr)
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
    ) -> str:
        """Upload `sqsh` under `key`: PUBLISHED, or REUSED when S3 has (or just got) it.
        `sidecars` ({suffix: bytes}, see transfer.SIDECARS) are stored beside it like the manifest.

        Chunked (the default): only the chunks the bucket lacks are sent, then the chunk index,
        then the record as the commit point. `index` is the file's chunk index when the caller
        has it already (also taken from `sidecars`, as a filesystem tier keeps it beside the
        artifact); `likely_present` are chunk ids this node has seen in other artifacts."""
        sqsh = Path(sqsh)
        check_publish_input(key, sqsh, record)
        show = self.show_progress if show_progress is None else show_progress
        self.last_transfer = self.last_index = None
        existing = self.record(key)
        if existing is not None:
            _warn_if_differs(key, existing, record)
            return REUSED
        sidecars = dict(sidecars or {})
        # a filesystem tier's chunk index is a hint, never stored as it is: the chunked publish
        # writes the index of what it uploaded, and a whole object must have none
        hint = sidecars.pop(INDEX_SUFFIX, None)
        if index is None and hint is not None:
            try:
                index = ChunkIndex.from_json(hint, f"{key}{INDEX_SUFFIX}")
            except BadChunkIndex:
                index = None
        if self.chunked:
            if not likely_present and self.seed_provider is not None:
                likely_present = {cid for seed in self.seed_provider(record.name) for cid in seed.index.unique()}
            index = self._publish_chunks(key, sqsh, record, index, likely_present, show)
            won = True
        else:
            won = self._upload_sqsh(key, sqsh, record, show)
        if not won:
            # Another publisher's .sqsh is there: the record must describe its bytes, not ours.
            head = self._head(self.sqsh_object(key)) or {}
            stored = head.get("Metadata", {}).get(DIGEST_METADATA)
            stored_digest = f"blake3:{stored}" if stored else None
            if not is_digest(stored_digest) or head.get("ContentLength") != record.size:
                raise EfabuildError(
                    f"{self.url(self.sqsh_object(key))}: exists without a usable blake3 digest "
                    f"(not written by efabuild?); delete it to publish {short(key)}"
                )
            if stored_digest != record.digest:
                _warn_if_differs(key, attrs.evolve(record, digest=stored_digest), record)
                stored_sha256 = head.get("Metadata", {}).get(SHA256_METADATA)
                record = attrs.evolve(record, digest=stored_digest, sha256=stored_sha256 or None)
                envelope = None  # it names our bytes, not the ones stored
        if manifest is not None:
            self._put_new(self.manifest_object(key), manifest, ContentType="application/json")
        if envelope is not None:
            self._put_new(self.envelope_object(key), envelope, ContentType="application/jsonl")
        for suffix, data in sidecars.items():
            self._put_new(self._path("objects", key[:2], key + suffix), data)
        created = self._put_new(self.record_object(key), record.to_json(), ContentType="application/json")
        return PUBLISHED if won and created else REUSED

    def _publish_chunks(self, key: str, sqsh: Path, record: ArtifactRecord, index: ChunkIndex | None,
                        likely_present: set[str], show: bool) -> ChunkIndex:
        if index is None or (index.size, index.digest, index.chunking) != (record.size, record.digest, self.chunking):
            with Progress(f"chunk {short(key)}", record.size, enabled=show) as bar:
                index = chunk_file(sqsh, chunking=self.chunking, progress=bar.update)
        if index.digest != record.digest:  # never publish bytes under a record they do not match
            raise EfabuildError(f"{sqsh}: digest {index.digest}, its record says {record.digest}; not published")
        unique = index.unique()
        # HEAD only the chunks this node has seen in other artifacts; the others are most likely
        # new, and a conditional PUT of one that exists is refused harmlessly
        known = set(unique) & likely_present
        to_send = (set(unique) - known) | self.chunks.missing(known)
        with Progress(f"upload {short(key)} to {self.url(self.index_object(key))}",
                      sum(unique[c] for c in to_send), enabled=show) as bar:
            sent = self.chunks.upload(index, sqsh, to_send, progress=bar.update)
        # gc may have swept a chunk found present: look again just before the index commits to
        # them, and once more after, and send back whatever went away
        found_present = set(unique) - sent.created
        for attempt in range(2):
            gone = self.chunks.missing(found_present)
            if gone:
                self.chunks.upload(index, sqsh, gone)
            if attempt == 0:
                self._put_new(self.index_object(key), index.to_json(), ContentType="application/json")
        self.last_transfer, self.last_index = sent, index
        return index

    def chunk_index(self, key: str) -> ChunkIndex | None:
        """The artifact's chunk index, or None for a whole-object artifact."""
        path = self.index_object(check_key(key))
        data = self._index_bytes.pop(key) if key in self._index_bytes else self._get_bytes(path)
        return None if data is None else ChunkIndex.from_json(data, self.url(path))

    def _upload_sqsh(self, key: str, sqsh: Path, record: ArtifactRecord, show: bool) -> bool:
        """Upload once, reading the file once; False if the object already existed."""
        path = self.sqsh_object(key)
        metadata = {DIGEST_METADATA: record.digest.split(":", 1)[1]}
        if record.sha256:
            metadata[SHA256_METADATA] = record.sha256
        size = record.size
        part = part_size_for(size, self.part_size)
        with Progress(f"upload {short(key)} to {self.url(path)}", size, enabled=show) as bar:
            if size <= part:
                body = sqsh.read_bytes()
                created = self._put_new(path, body, Metadata=metadata, ContentType="application/octet-stream")
                bar.update(len(body))
                return created
            return self._multipart_upload(path, sqsh, size, part, metadata, bar)

    def _multipart_upload(self, path: str, sqsh: Path, size: int, part: int, metadata: dict,
                          bar: Progress) -> bool:
        what = self.url(path)
        try:
            upload_id = self._call(
                what, "create_multipart_upload", Key=path, ChecksumAlgorithm="CRC32",
                Metadata=metadata, ContentType="application/octet-stream",
            )["UploadId"]
        except ClientError as exc:
            raise self._error(what, exc) from None
        count = math.ceil(size / part)
        fd = os.open(sqsh, os.O_RDONLY)
        completed = False
        try:
            def send(number: int) -> dict:
                offset = (number - 1) * part
                data = os.pread(fd, min(part, size - offset), offset)
                response = self._call(
                    what, "upload_part", Key=path, UploadId=upload_id, PartNumber=number,
                    Body=data, ChecksumAlgorithm="CRC32",
                )
                bar.update(len(data))
                return {"PartNumber": number, "ETag": response["ETag"],
                        "ChecksumCRC32": response["ChecksumCRC32"]}

            parts = run_parallel(send, range(1, count + 1), self.workers)
            try:
                self._call(
                    what, "complete_multipart_upload", Key=path, UploadId=upload_id,
                    MultipartUpload={"Parts": parts}, IfNoneMatch="*",
                )
                completed = True
                return True
            except ClientError as exc:
                if _already_exists(exc):
                    return False
                raise
        except ClientError as exc:
            raise self._error(what, exc) from None
        finally:
            os.close(fd)
            if not completed:
                try:
                    self.client.abort_multipart_upload(Bucket=self.bucket, Key=path, UploadId=upload_id)
                except (ClientError, BotoCoreError):
                    pass  # gc aborts what is left behind

    # ---- fetch
    def download(self, key: str, dest: Path, record: ArtifactRecord, *, show_progress: bool | None = None,
                 seeds: tuple[Seed, ...] = ()) -> ChunkIndex | None:
        """Fetch the .sqsh into the new file `dest`, verified against `record` (else removed).

        A chunked artifact is assembled from `seeds` (files on this node with known chunk
        indexes) and downloads of the chunks they lack; its index is returned, to be kept
        beside the fetched file as a seed for the next fetch."""
        show = self.show_progress if show_progress is None else show_progress
        index = self.chunk_index(key)
        if index is not None:
            if not seeds and self.seed_provider is not None:
                seeds = self.seed_provider(record.name)
            self._download_chunks(key, dest, record, index, seeds, show)
            return index
        self._download_whole(key, dest, record, show)
        return None

    def _download_chunks(self, key: str, dest: Path, record: ArtifactRecord, index: ChunkIndex,
                         seeds: tuple[Seed, ...], show: bool) -> None:
        what = self.url(self.index_object(key))
        if index.size != record.size or index.digest != record.digest:
            raise DamagedCopy(self.name, what, f"describes {index.size} bytes {index.digest}, its record says "
                                               f"{record.size} bytes {record.digest}; not fetched")
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            with Progress(f"fetch {short(key)} from {what}", index.size, enabled=show) as bar:
                self.last_transfer = assemble(self.chunks, index, fd, seeds, progress=bar.update)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            dest.unlink(missing_ok=True)
            raise
        os.close(fd)
        self._check_fetched(dest, record, what)

    def _check_fetched(self, dest: Path, record: ArtifactRecord, what: str) -> None:
        """The whole fetched file against its record, before anyone may see it (else removed)."""
        actual = file_digest(dest)
        if actual != record.digest:
            dest.unlink(missing_ok=True)
            raise DamagedCopy(self.name, what, f"digest {actual}, its record says {record.digest}; not fetched")

    def _download_whole(self, key: str, dest: Path, record: ArtifactRecord, show: bool) -> None:
        path = self.sqsh_object(check_key(key))
        what = self.url(path)
        head = self._head(path)
        if head is None:
            raise NotFound(f"{what}: missing although its record exists (deleted meanwhile?)")
        size, etag = head["ContentLength"], head["ETag"]
        if size != record.size:
            raise DamagedCopy(self.name, what, f"{size} bytes, its record says {record.size}; not fetched")
        part = part_size_for(size, self.part_size)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            os.ftruncate(fd, size)

            def fetch(offset: int) -> None:
                end = min(offset + part, size) - 1
                position = offset
                # botocore retries a request that fails, not a response body cut mid-stream: a
                # reset while reading resumes from the byte reached, a bounded number of times
                for attempt in range(1, STREAM_ATTEMPTS + 1):
                    try:
                        response = self._call(what, "get_object", Key=path, Range=f"bytes={position}-{end}",
                                              IfMatch=etag)
                        for chunk in response["Body"].iter_chunks(READ_CHUNK):
                            os.pwrite(fd, chunk, position)
                            position += len(chunk)
                            bar.update(len(chunk))
                        break
                    except (BotoCoreError, OSError) as exc:
                        if attempt == STREAM_ATTEMPTS:
                            raise EfabuildError(f"{what}: gave up after {attempt} attempts at byte {position} "
                                                f"of {size}: {_why(exc)}") from None
                        time.sleep(random.uniform(0.5, 1.0) * STREAM_BACKOFF * 2 ** (attempt - 1))
                if position != end + 1:
                    raise EfabuildError(f"{what}: short read at byte {position} of {size}")

            with Progress(f"fetch {short(key)} from {what}", size, enabled=show) as bar:
                run_parallel(fetch, range(0, size, part), self.workers)
                os.fsync(fd)
        except ClientError as exc:
            os.close(fd)
            dest.unlink(missing_ok=True)
            if _already_exists(exc):
                raise EfabuildError(f"{what}: changed while being fetched; try again") from None
            raise self._error(what, exc) from None
        except BaseException:
            os.close(fd)
            dest.unlink(missing_ok=True)
            raise
        os.close(fd)
        self._check_fetched(dest, record, what)

    # ---- refs
    def read_refs(self, name: str) -> list[dict]:
        prefix = self._refs_prefix(name)
        entries = []
        for item in self._list(prefix):
            when, _, key = item["Key"][len(prefix):].rpartition(".")
            if is_key(key) and when:
                entries.append({"key": key, "time": when})
        return sorted(entries, key=lambda e: e["time"])

    def append_ref(self, name: str, key: str, when: str | None = None) -> bool:
        check_key(key)
        history = self.read_refs(name)
        if history and history[-1]["key"] == key:
            return False
        path = self._refs_prefix(name) + f"{when or utc_now()}.{key}"
        self._put_new(path, b"")
        return True

    def ref_names(self) -> list[str]:
        prefix = self._path("refs") + "/"
        names = set()
        for item in self._list(prefix):
            parts = item["Key"][len(prefix):].split("/")
            if len(parts) == 3:
                names.add(f"{parts[0]}:{parts[1]}")
        return sorted(names)

    def drop_ref_entries(self, name: str, keys: set[str]) -> None:
        prefix = self._refs_prefix(name)
        entries = sorted(self._list(prefix), key=lambda item: item["Key"])  # "<time>.<key>": oldest first
        for item in entries[:-1]:  # the newest stays: see FilesystemTier.drop_ref_entries
            if item["Key"].rpartition(".")[2] in keys:
                self._delete_object(item["Key"])

    # ---- removal
    def _delete_object(self, path: str) -> None:
        try:
            self._call(self.url(path), "delete_object", Key=path)
        except ClientError as exc:
            if not _missing(exc):
                raise self._error(self.url(path), exc) from None

    def delete(self, key: str) -> None:
        """Record first (uncommits), then the .sqsh and manifest."""
        check_key(key)
        sidecars = [self._path("objects", key[:2], key + suffix) for suffix in SIDECARS]
        for path in (self.record_object(key), self.sqsh_object(key), *sidecars):
            self._delete_object(path)

    def usage(self) -> tuple[dict[str, tuple[ArtifactRecord, Usage]], int, int]:
        """What each artifact costs in the bucket as stored (compressed chunks, or its whole
        object); the bytes all of them take, shared chunks counted once; and the bytes of chunks
        no index references (gc's to sweep)."""
        records = {record.key: record for record in self.list()}
        chunk_sizes = {}
        for item in self._list(self._path(CHUNKS_DIR) + "/"):
            chunk_sizes[item["Key"].rsplit("/", 1)[-1]] = item.get("Size", 0)
        whole_sizes = {}
        for item in self._list(self._path("objects") + "/"):
            base = item["Key"].rsplit("/", 1)[-1]
            if base.endswith(SQSH_SUFFIX):
                whole_sizes[base[: -len(SQSH_SUFFIX)]] = item.get("Size", 0)
        keys = sorted(records)
        indexes = dict(zip(keys, run_parallel(self._index_or_none, keys, self.workers)))
        chunked = usage({k: i for k, i in indexes.items() if i is not None}, chunk_sizes)
        result = {}
        for key in keys:
            size = whole_sizes.get(key, 0)
            result[key] = (records[key], chunked.get(key, Usage(stored=size, unique=size)))
        referenced = {cid for index in indexes.values() if index is not None for cid in index.unique()}
        stored = sum(chunk_sizes.get(cid, 0) for cid in referenced) + sum(
            whole_sizes.get(key, 0) for key in keys if indexes[key] is None)
        return result, stored, sum(size for cid, size in chunk_sizes.items() if cid not in referenced)

    def _index_or_none(self, key: str) -> ChunkIndex | None:
        try:
            return self.chunk_index(key)
        except EfabuildError:
            return None

    def debris(self, now: datetime | None = None) -> list[str]:
        """s3:// URLs of leftovers older than a day: .sqsh without a record, unfinished uploads."""
        now = now or datetime.now(timezone.utc)
        records, _, listing = self._object_keys("")
        found = []
        for item in listing:
            base = item["Key"].rsplit("/", 1)[-1]
            if base.endswith(SQSH_SUFFIX) and base[: -len(SQSH_SUFFIX)] not in records \
                    and now - item["LastModified"] > STALE_UPLOAD:
                found.append(self.url(item["Key"]))
        for upload in self._stale_uploads(now):
            found.append(self.url(upload["Key"]) + f"?uploadId={upload['UploadId']}")
        return found

    def _stale_uploads(self, now: datetime) -> list[dict]:
        prefix = self._path("objects") + "/"
        try:
            page = self._call(self.url(prefix), "list_multipart_uploads", Prefix=prefix)
        except ClientError as exc:
            raise self._error(self.url(prefix), exc) from None
        return [u for u in page.get("Uploads", []) if now - u["Initiated"] > STALE_UPLOAD]

    def remove_debris(self, url: str) -> None:
        path = url[len(self.url("")):]
        if "?uploadId=" in path:
            path, upload_id = path.split("?uploadId=", 1)
            try:
                self._call(self.url(path), "abort_multipart_upload", Key=path, UploadId=upload_id)
            except ClientError as exc:
                if not _missing(exc) and _code(exc) != "NoSuchUpload":
                    raise self._error(self.url(path), exc) from None
        else:
            self._delete_object(path)


def _warn_if_differs(key: str, existing: ArtifactRecord, new: ArtifactRecord) -> None:
    if existing.digest != new.digest:
        print(
            f"efabuild: warning: s3 tier: {short(key)} exists with digest {existing.digest}; the new "
            f"export has {new.digest} (export not byte-identical); keeping the stored one",
            file=sys.stderr,
        )
