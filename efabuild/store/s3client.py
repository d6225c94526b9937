"""The boto3 client of one S3 bucket and prefix: object names, calls that fail as one line, and
the byte transfers of whole objects (a conditional single or multipart upload; parallel ranged
GETs that resume where a response was cut).

botocore retries a request that fails (throttling, 5xx, connection errors, re-sending a part's
body); it does not retry a response body cut mid-stream. `retried` does that, once for every GET
of this package (ranged GETs of whole objects and chunk GETs alike).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from efabuild.errors import EfabuildError, NoCredentials
from efabuild.storesettings import S3Config
from efabuild.store.progress import Progress
from efabuild.store.parallel import run_parallel

MiB = 1024 * 1024
MIN_PART_SIZE = 5 * MiB  # S3's floor for all parts but the last
DEFAULT_PART_SIZE = 16 * MiB
MAX_PARTS = 10_000
DEFAULT_WORKERS = 16  # parallel requests: 16 beat 10 for 4 MiB chunks on loopback (per-request cost)
READ_CHUNK = 1 * MiB
REQUEST_ATTEMPTS = 5  # per S3 request, by botocore (with its own backoff)
QUICK_ATTEMPTS, QUICK_CONNECT_TIMEOUT, QUICK_READ_TIMEOUT = 2, 3, 15  # a plan's questions
STREAM_ATTEMPTS = 5  # per GET whose body is cut mid-stream, by us
STREAM_BACKOFF = 0.25  # seconds before the 2nd attempt, doubled after each (with jitter)
# Error codes meaning "a conditional create found the object already there"
_ALREADY_EXISTS = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
_MISSING = {"404", "NoSuchKey", "NotFound"}
# the largest small object a store keeps (manifests, chunk indexes); others pass their own bound
MAX_SMALL_OBJECT = 64 * MiB
# objects one listing goes through before it stops with an error naming the bucket and prefix:
# far more than a store holds (2,000 LIST pages; 8 TB of distinct 4 MiB chunks), so that a
# prefix flooded by anyone with write access costs one error, not hours of listing
MAX_LISTED = 2_000_000

T = TypeVar("T")


def _why(exc: BaseException) -> str:
    """The root cause of a transfer error, in a few words (botocore nests urllib3's)."""
    while exc.__context__ is not None and isinstance(exc.__context__, (BotoCoreError, OSError)):
        exc = exc.__context__
    return f"{type(exc).__name__}: {exc.strerror}" if isinstance(exc, OSError) and exc.strerror else str(exc)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def already_exists(exc: ClientError) -> bool:
    return _code(exc) in _ALREADY_EXISTS or _status(exc) in (409, 412)


def _missing(exc: ClientError) -> bool:
    return _code(exc) in _MISSING or _status(exc) == 404


def response_time(response: dict) -> float:
    """When the server answered `response` by its own clock (its Date header, to the second),
    in seconds since the epoch; this host's clock only when a server sends no Date."""
    date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    try:
        return parsedate_to_datetime(date).timestamp()
    except (TypeError, ValueError):
        return time.time()


def part_size_for(size: int, preferred: int = DEFAULT_PART_SIZE) -> int:
    """Parts of `preferred` bytes, grown (whole MiB) when the file would need > 10,000 parts."""
    needed = math.ceil(size / MAX_PARTS)
    return max(preferred, MIN_PART_SIZE, math.ceil(needed / MiB) * MiB)


def retried(what: str, attempt: Callable[[], T], *, where: Callable[[], str] = str,
            error: type[EfabuildError] = EfabuildError) -> T:
    """attempt(), tried again when its response body is cut mid-stream, at most STREAM_ATTEMPTS
    times with a doubling, jittered backoff; then `error` naming `what` (and `where()` it got)."""
    for number in range(1, STREAM_ATTEMPTS + 1):
        try:
            return attempt()
        except (BotoCoreError, OSError) as exc:
            if number == STREAM_ATTEMPTS:
                raise error(f"{what}: gave up after {number} attempts{where()}: {_why(exc)}") from None
            time.sleep(random.uniform(0.5, 1.0) * STREAM_BACKOFF * 2 ** (number - 1))
    raise AssertionError("unreachable")


class S3Bucket:
    """Calls to one bucket under one prefix, through boto3's credential chain."""

    def __init__(self, settings: S3Config, *, client: object | None = None, workers: int = DEFAULT_WORKERS,
                 part_size: int = DEFAULT_PART_SIZE) -> None:
        self.settings = settings
        self.bucket = settings.bucket
        self.prefix = settings.prefix.strip("/")
        self.part_size = max(part_size, MIN_PART_SIZE)
        self.workers = max(1, workers)
        # patient (False) and quick (True) clients, made on first use; a caller's client serves both
        self._clients = {} if client is None else {False: client, True: client}
        self._quick = threading.local()
        self._client_lock = threading.Lock()

    def url(self, path: str) -> str:
        return f"s3://{self.bucket}/{path}"

    def _path(self, *parts: str) -> str:
        return "/".join(([self.prefix] if self.prefix else []) + list(parts))

    # ---- client
    @contextlib.contextmanager
    def asking_quickly(self) -> Iterator[None]:
        """Questions asked in this block (in this thread) fail in seconds when S3 is out of reach:
        two attempts and a short connect timeout, not the transfers' patient retries. For a plan,
        whose answer a make checks again: a dead endpoint must not hold it for 20 s or more."""
        self._quick.active = True
        try:
            yield
        finally:
            self._quick.active = False

    @property
    def client(self):  # noqa: ANN201 - boto3's client class is generated at run time
        quick = getattr(self._quick, "active", False)
        with self._client_lock:
            if quick not in self._clients:
                self._clients[quick] = boto3.session.Session().client(
                    "s3", region_name=self.settings.region, endpoint_url=self.settings.endpoint_url,
                    config=self._config(quick))
            return self._clients[quick]

    def _config(self, quick: bool) -> Config:
        if quick:
            return Config(retries={"mode": "standard", "max_attempts": QUICK_ATTEMPTS},
                          connect_timeout=QUICK_CONNECT_TIMEOUT, read_timeout=QUICK_READ_TIMEOUT)
        # a dead endpoint should fail in seconds, not minutes; transfers retry parts anyway
        return Config(
            max_pool_connections=self.workers + 4,
            # standard mode retries throttling, 5xx and connection errors of a request,
            # re-sending its body: a part upload cut by a reset is sent again
            retries={"mode": "standard", "max_attempts": REQUEST_ATTEMPTS},
            connect_timeout=10,
        )

    def _call(self, what: str, operation: str, **kwargs: object) -> dict:
        """One S3 call; failures become one-line EfabuildErrors (never credentials)."""
        try:
            return getattr(self.client, operation)(Bucket=self.bucket, **kwargs)
        except NoCredentialsError:
            raise NoCredentials(what, "no AWS credentials (boto3's standard chain: environment, ~/.aws, "
                                      "instance or pod role)") from None
        except ClientError:
            raise
        except BotoCoreError as exc:
            raise EfabuildError(f"{what}: {exc}") from None

    def _error(self, what: str, exc: ClientError) -> EfabuildError:
        message = exc.response.get("Error", {}).get("Message") or _code(exc)
        return EfabuildError(f"{what}: S3 error {_code(exc) or _status(exc)}: {message}")

    def _get_bytes(self, path: str, limit: int = MAX_SMALL_OBJECT,
                   error: type[EfabuildError] = EfabuildError) -> bytes | None:
        """The object's bytes, None when absent; `error` when it holds more than `limit` bytes
        (an object planted in a shared bucket must not make us read without end)."""
        try:
            response = self._call(self.url(path), "get_object", Key=path)
        except ClientError as exc:
            if _missing(exc):
                return None
            raise self._error(self.url(path), exc) from None
        body, size = response["Body"], response.get("ContentLength") or 0
        data = body.read(limit + 1) if size <= limit else b""
        if size > limit or len(data) > limit:
            body.close()
            raise error(f"{self.url(path)}: larger than the {limit} bytes it may hold "
                        f"(not written by efabuild?); not read")
        return data

    def server_time(self) -> float:
        """The bucket's own clock now (seconds since the epoch), from the Date of a response: what
        S3's LastModified times are compared with, never this host's clock, which may be off by
        a day."""
        what = self.url(self._path("gc") + "/")
        try:
            response = self._call(what, "list_objects_v2", Prefix=self._path("gc") + "/", MaxKeys=1)
        except ClientError as exc:
            raise self._error(what, exc) from None
        return response_time(response)

    def _head(self, path: str) -> dict | None:
        try:
            return self._call(self.url(path), "head_object", Key=path)
        except ClientError as exc:
            if _missing(exc):
                return None
            raise self._error(self.url(path), exc) from None

    def _put_new(self, path: str, body: bytes, **extra: object) -> bool:
        """Create an object unless it exists; False when someone else created it first."""
        return self._create(path, body, **extra) is not None

    def _create(self, path: str, body: bytes, **extra: object) -> str | None:
        """`_put_new` that gives the created object's ETag (unquoted), None when it existed."""
        try:
            response = self._call(self.url(path), "put_object", Key=path, Body=body, IfNoneMatch="*",
                                  ChecksumAlgorithm="CRC32", **extra)
        except ClientError as exc:
            if already_exists(exc):
                return None
            raise self._error(self.url(path), exc) from None
        return str(response.get("ETag", "")).strip('"')


    def _walk(self, prefix: str, *, after: str = "", through: str | None = None,
              most: int | None = None) -> Iterator[dict]:
        """The objects under `prefix`, in key order, a page at a time (a caller keeps what it
        needs of them, never the whole listing): only those after `after`, and no page past the
        one that reaches `through` (S3 lists in key order, so a range costs only its pages); an
        error once more than `most` (default MAX_LISTED) are found: others may flood a prefix."""
        for page in self._pages(prefix, after=after, through=through, most=most):
            yield from page

    def _pages(self, prefix: str, *, after: str = "", through: str | None = None, most: int | None = None,
               size: int | None = None) -> Iterator[list[dict]]:
        """`_walk`'s listing as the pages S3 gives (of `size` keys at most, else S3's 1,000)."""
        most = MAX_LISTED if most is None else most
        seen, token = 0, None
        while True:
            kwargs: dict = {"Prefix": prefix}
            if size is not None:
                kwargs["MaxKeys"] = size
            if token:
                kwargs["ContinuationToken"] = token
            elif after:
                kwargs["StartAfter"] = after
            try:
                page = self._call(self.url(prefix), "list_objects_v2", **kwargs)
            except ClientError as exc:
                raise self._error(self.url(prefix), exc) from None
            contents = page.get("Contents", [])
            seen += len(contents)
            if seen > most:
                raise EfabuildError(f"{self.url(prefix)}: more than {most} objects (not written by efabuild?); "
                                    f"not listed further")
            yield contents
            if not page.get("IsTruncated") or (through is not None and contents and contents[-1]["Key"] >= through):
                return
            token = page["NextContinuationToken"]

    def _list(self, prefix: str, **bounds: object) -> list[dict]:
        """The whole listing of `prefix` (see `_walk`), for prefixes whose objects a caller needs together."""
        return list(self._walk(prefix, **bounds))

    def _delete_object(self, path: str) -> None:
        try:
            self._call(self.url(path), "delete_object", Key=path)
        except ClientError as exc:
            if not _missing(exc):
                raise self._error(self.url(path), exc) from None

    # ---- whole objects
    def upload_file(self, path: str, source: os.PathLike[str], size: int, metadata: dict,
                    bar: Progress) -> bool:
        """Upload a file of `size` bytes as one object, unless it exists (False then): one PUT, or
        a multipart upload in parallel parts, reading the file once."""
        part = part_size_for(size, self.part_size)
        if size <= part:
            with open(source, "rb") as handle:
                body = handle.read()
            created = self._put_new(path, body, Metadata=metadata, ContentType="application/octet-stream")
            bar.update(len(body))
            return created
        return self._multipart_upload(path, source, size, part, metadata, bar)

    def _multipart_upload(self, path: str, sqsh: os.PathLike[str], size: int, part: int, metadata: dict,
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
                if already_exists(exc):
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


    def get_ranges(self, path: str, fd: int, size: int, etag: str, bar: Progress) -> None:
        """The object's `size` bytes into `fd` by parallel ranged GETs pinned to `etag`; a
        response cut mid-body resumes from the byte reached. ClientError when the object changed."""
        what = self.url(path)
        part = part_size_for(size, self.part_size)

        def fetch(offset: int) -> None:
            end = min(offset + part, size) - 1
            position = [offset]

            def attempt() -> None:
                response = self._call(what, "get_object", Key=path, Range=f"bytes={position[0]}-{end}", IfMatch=etag)
                for chunk in response["Body"].iter_chunks(READ_CHUNK):
                    os.pwrite(fd, chunk, position[0])
                    position[0] += len(chunk)
                    bar.update(len(chunk))

            retried(what, attempt, where=lambda: f" at byte {position[0]} of {size}")
            if position[0] != end + 1:
                raise EfabuildError(f"{what}: short read at byte {position[0]} of {size}")

        run_parallel(fetch, range(0, size, part), self.workers)

    def uploads_started_before(self, prefix: str, cutoff: datetime) -> list[dict]:
        """Multipart uploads under `prefix` begun before `cutoff` (left by interrupted publishes)."""
        try:
            page = self._call(self.url(prefix), "list_multipart_uploads", Prefix=prefix)
        except ClientError as exc:
            raise self._error(self.url(prefix), exc) from None
        return [u for u in page.get("Uploads", []) if u["Initiated"] < cutoff]

    def abort_upload(self, path: str, upload_id: str) -> None:
        try:
            self._call(self.url(path), "abort_multipart_upload", Key=path, UploadId=upload_id)
        except ClientError as exc:
            if not _missing(exc) and _code(exc) != "NoSuchUpload":
                raise self._error(self.url(path), exc) from None
