"""Skill documents and read-only sources in S3/MinIO, through the ``minio`` client.

The client is synchronous; each call runs in a worker thread (``asyncio.to_thread``) so the event
loop never blocks on storage I/O.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import quote, unquote

import urllib3
from minio import Minio
from minio.commonconfig import ENABLED
from minio.deleteobjects import DeleteObject
from minio.error import MinioException, S3Error
from minio.versioningconfig import SUSPENDED

from services.errors import BucketUnusable, ObjectStorageError

DESCRIPTION_META = "description"
# S3 metadata values must be ASCII: anything else is percent-encoded (and decoded on listing).
SAFE_META = " !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~"
DELETE_BATCH = 1000
"""Keys (or versions) in one DeleteObjects request: S3's most."""
T = TypeVar("T")
BUCKET_NAME_REFUSALS = ("invalid bucket name", "bucket name ")
"""How the minio client's ``ValueError`` for a bucket name it refuses (before any request) begins;
another ``ValueError`` (a response it cannot read) is the store's."""
STORE_WIDE_CODES = frozenset(
    {"InvalidAccessKeyId", "SignatureDoesNotMatch", "RequestTimeTooSkewed", "ExpiredToken", "InvalidToken"}
)
"""S3 error codes about the credentials or the clock, whatever the bucket: the store cannot be used
(:class:`~services.errors.ObjectStorageError`); any other error code answers for its bucket
(:class:`~services.errors.BucketUnusable`)."""


@dataclass(frozen=True, slots=True)
class StoredObject:
    key: str
    description: str | None
    etag: str
    size: int


@dataclass(frozen=True, slots=True)
class PrefixSurvey:
    """What a bucket holds under a prefix (:meth:`SkillStore.survey`)."""

    bucket: str
    versioned: bool
    objects: int
    """Keys under the prefix (each counted once, however many versions it has)."""
    refused: str | None = None
    """Why the bucket could not be looked at (:class:`~services.errors.BucketUnusable`: the store
    refused it), when it could not: ``versioned`` and ``objects`` then say nothing."""


@dataclass(frozen=True, slots=True)
class NotCleaned:
    """A bucket whose objects under a tenant's prefix its erasure could not delete, and why."""

    bucket: str
    reason: str


READ_TIMEOUT_S = 15.0
"""How long a request waits for the store's next bytes before it fails (not retried)."""


class BucketMissing(Exception):
    """A put into a bucket that does not exist: nothing stored, and no bucket made (its owner makes
    it, with its policy). Not a problem code: each caller says it its own way (the ``set_context``
    tool as an ``Error: …`` result, ``chronicle skills put`` as exit 2)."""

    def __init__(self, bucket: str) -> None:
        super().__init__(f"bucket {bucket!r} does not exist: create it first")
        self.bucket = bucket


class ObjectTooLarge(Exception):
    """An object read with a bound (:meth:`SkillStore.get_bytes`'s ``limit``) is larger than it."""

    def __init__(self, bucket: str, key: str, limit: int) -> None:
        super().__init__(f"object {key!r} in bucket {bucket!r} is more than {limit} bytes")
        self.limit = limit


class SkillStore:
    def __init__(
        self,
        endpoint: str,
        access_key: str,
        secret_key: str,
        *,
        secure: bool,
        region: str | None,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        # Short timeouts and few retries: a slow object store must fail a request, not hang it. A
        # read that timed out is not retried here (read=0): a store that answered nothing for
        # that long fails the request at once, and the caller's own retries (the SDK's, the
        # projector's) decide; retried here it held each request three times as long (an outside
        # trial: a stalled store kept one SDK call 229 s, 45 s an attempt).
        http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=3.0, read=read_timeout_s),
            retries=urllib3.Retry(total=2, read=0, backoff_factor=0.2, status_forcelist=[500, 502, 503, 504]),
            maxsize=16,
        )
        self._client = Minio(
            endpoint, access_key=access_key, secret_key=secret_key, secure=secure, region=region, http_client=http
        )

    def _ensure_bucket(self, bucket: str) -> bool:
        """Make ``bucket`` unless it exists; True when this call made it."""
        if self._client.bucket_exists(bucket):
            return False
        self._client.make_bucket(bucket)
        return True

    async def create_bucket(self, bucket: str) -> bool:
        """Make ``bucket`` unless it exists (asked for: ``chronicle skills put --create-bucket``,
        the bucket ``chronicle up`` makes on the moto server it starts); True when this call made it.
        :meth:`put` never makes one."""
        return await self._call(lambda: self._ensure_bucket(bucket))

    async def put(self, bucket: str, key: str, content: str, description: str | None) -> StoredObject:
        """Store a document; the description becomes object metadata (dropped when None).
        :class:`BucketMissing` when ``bucket`` does not exist: one request, the PUT (no HEAD first,
        so no bucket deleted between a check and the put is made again)."""
        data = content.encode()

        def put() -> StoredObject:
            meta: dict[str, str | list[str] | tuple[str]] | None = (
                {DESCRIPTION_META: quote(description, safe=SAFE_META)} if description else None
            )
            try:
                result = self._client.put_object(
                    bucket, key, io.BytesIO(data), len(data), content_type="text/markdown; charset=utf-8", metadata=meta
                )
            except S3Error as exc:
                if exc.code == "NoSuchBucket":
                    raise BucketMissing(bucket) from exc
                raise
            return StoredObject(key, description, str(result.etag).strip('"'), len(data))

        return await self._call(put)

    async def put_bytes(self, bucket: str, key: str, data: bytes) -> None:
        """Store bytes, making ``bucket`` when it does not exist (Chronicle's own: the archive's,
        claim-checked bodies')."""

        def put() -> None:
            self._ensure_bucket(bucket)
            self._client.put_object(bucket, key, io.BytesIO(data), len(data))

        await self._call(put)

    async def get_bytes(self, bucket: str, key: str, *, limit: int | None = None) -> bytes | None:
        """The object's bytes, None when it does not exist. With ``limit``, at most ``limit`` + 1
        bytes are asked for (a ranged read: a larger object is never downloaded whole), and a
        larger object is :class:`ObjectTooLarge`."""

        def get() -> bytes | None:
            try:
                resp = self._client.get_object(bucket, key, length=limit + 1 if limit is not None else 0)
            except S3Error as exc:
                if exc.code in ("NoSuchKey", "NoSuchBucket"):
                    return None
                if exc.code == "InvalidRange":  # a range from byte 0 of an empty object
                    return b""
                raise
            try:
                # no more than asked for, should the store ignore the range and send it all
                return bytes(resp.read(limit + 1) if limit is not None else resp.read())
            finally:
                resp.close()
                resp.release_conn()

        data = await self._call(get)
        if data is not None and limit is not None and len(data) > limit:
            raise ObjectTooLarge(bucket, key, limit)
        return data

    async def delete(self, bucket: str, key: str) -> None:
        """Remove an object (none there: nothing to do)."""

        def remove() -> None:
            try:
                self._client.remove_object(bucket, key)
            except S3Error as exc:
                if exc.code not in ("NoSuchKey", "NoSuchBucket"):
                    raise

        await self._call(remove)

    async def bucket_exists(self, bucket: str) -> bool:
        return await self._call(lambda: bool(self._client.bucket_exists(bucket)))

    async def get_text(self, bucket: str, key: str, *, limit: int | None = None) -> str | None:
        """The object's text, or None when it does not exist; :class:`UnicodeDecodeError` when its
        bytes are not UTF-8; :class:`ObjectTooLarge` when it has more than ``limit`` bytes."""
        data = await self.get_bytes(bucket, key, limit=limit)
        return data.decode("utf-8") if data is not None else None

    async def check_usable(self, bucket: str) -> None:
        """:class:`~services.errors.ObjectStorageError` unless the credentials may use ``bucket``,
        one of Chronicle's own (absent is fine): a tenant's erasure asks before it looks at the
        buckets the tenant named, where a refusal leaves only that bucket (a policy that denies
        Chronicle its own bucket denies it the store: nothing may be destroyed then)."""

        def look() -> None:
            try:
                self._client.get_bucket_versioning(bucket)
            except S3Error as exc:
                if exc.code != "NoSuchBucket":
                    raise ObjectStorageError(f"{exc.code}: {exc.message} (one of Chronicle's own buckets)") from exc

        await self._call(look)

    async def survey(self, bucket: str, prefix: str) -> PrefixSurvey | None:
        """How many keys ``bucket`` holds under ``prefix`` (any version of them), and whether it
        keeps versions (versioning enabled, or suspended: versions kept before remain); None when
        there is no such bucket. Needs s3:ListBucket and s3:GetBucketVersioning (a versioned
        bucket: s3:ListBucketVersions too)."""

        def look() -> PrefixSurvey | None:
            # A GET first, not bucket_exists' HEAD: S3 answers a refused HEAD 403 with no body, which
            # the client reads as AccessDenied whatever the cause, and refused credentials or a
            # skewed clock (the store unusable: nothing may be destroyed) then read as a refusal
            # of this bucket alone; a GET's answer names its code.
            try:
                status = self._client.get_bucket_versioning(bucket).status
            except S3Error as exc:
                if exc.code == "NoSuchBucket":
                    return None
                raise
            versioned = status in (ENABLED, SUSPENDED)
            keys = {name for name, _ in self._keys_under(bucket, prefix, versioned)}
            return PrefixSurvey(bucket, versioned, len(keys))

        return await self._call(look)

    async def delete_under(self, bucket: str, prefix: str, *, versioned: bool) -> int:
        """Delete every object under ``prefix``: plain deletes in an unversioned bucket, each
        version (delete markers too) in a versioned one, in batches of up to
        :data:`DELETE_BATCH` (one DeleteObjects request each: s3:DeleteObject, and
        s3:DeleteObjectVersion in a versioned bucket); how many keys went (no bucket: 0).

        A key the store refuses to delete fails it (:class:`~services.errors.BucketUnusable` naming
        the first such key and how many of its batch failed) before the next batch is sent. What a failure
        leaves goes on a rerun."""

        def remove() -> int:
            if not self._client.bucket_exists(bucket):
                return 0
            keys = self._keys_under(bucket, prefix, versioned)
            for start in range(0, len(keys), DELETE_BATCH):
                batch = [
                    DeleteObject(name, version if versioned else None)
                    for name, version in keys[start : start + DELETE_BATCH]
                ]
                # the errors come lazily: the request is only sent as they are read
                failed = list(self._client.remove_objects(bucket, batch))
                if failed:
                    first = failed[0]
                    version = f" (version {first.version_id})" if first.version_id else ""
                    raise BucketUnusable(
                        f"{first.code}: {first.message or 'not deleted'}: key {first.name!r}{version}"
                        f" in bucket {bucket!r} ({len(failed)} of {len(batch)} in its batch not deleted)"
                    )
            return len({name for name, _ in keys})

        return await self._call(remove)

    def _keys_under(self, bucket: str, prefix: str, versioned: bool) -> list[tuple[str, str | None]]:
        """(key, version) of each object under ``prefix`` (each version in a versioned bucket)."""
        found = self._client.list_objects(bucket, prefix=prefix, recursive=True, include_version=versioned)
        return [(o.object_name, o.version_id) for o in found if o.object_name is not None and not o.is_dir]

    async def keys(self, bucket: str, prefix: str) -> list[str]:
        """The key of every object under ``prefix``, in listing order: the listing alone, no
        request per object (no bucket: none)."""

        def listing() -> list[str]:
            if not self._client.bucket_exists(bucket):
                return []
            return [name for name, _ in self._keys_under(bucket, prefix, versioned=False)]

        return await self._call(listing)

    async def list(self, bucket: str, prefix: str) -> list[StoredObject]:
        """Every object under ``prefix`` in listing order, with its description metadata (a HEAD
        request per object: :meth:`keys` when only the keys are wanted)."""

        def listing() -> list[StoredObject]:
            if not self._client.bucket_exists(bucket):
                return []
            out: list[StoredObject] = []
            for obj in self._client.list_objects(bucket, prefix=prefix, recursive=True):
                if obj.object_name is None or obj.is_dir:
                    continue
                stat = self._client.stat_object(bucket, obj.object_name)
                meta = {k.lower(): v for k, v in (stat.metadata or {}).items()}
                raw = meta.get(f"x-amz-meta-{DESCRIPTION_META}")
                desc = unquote(raw) if raw is not None else None
                out.append(StoredObject(obj.object_name, desc, str(stat.etag).strip('"'), int(stat.size or 0)))
            return out

        return await self._call(listing)

    @staticmethod
    async def _call(fn: Callable[[], T]) -> T:
        try:
            return await asyncio.to_thread(fn)
        except S3Error as exc:
            if exc.code in STORE_WIDE_CODES:
                raise ObjectStorageError(f"{exc.code}: {exc.message}") from exc
            raise BucketUnusable(f"{exc.code}: {exc.message}") from exc
        except ValueError as exc:
            if not str(exc).startswith(BUCKET_NAME_REFUSALS) or isinstance(exc, UnicodeError):
                raise ObjectStorageError(f"{type(exc).__name__}: {str(exc)[:200]}") from exc
            raise BucketUnusable(str(exc)[:200]) from exc  # the client's check, before any request
        # refused, reset, retries exhausted; a 5xx page from a proxy, a response minio cannot read
        except (OSError, urllib3.exceptions.HTTPError, MinioException) as exc:
            raise ObjectStorageError(_reason(exc)) from exc


def _reason(exc: Exception) -> str:
    """Why the store could not be used, in a line: urllib3's own message wraps the reason in its
    pool, the URL and the retry count (hundreds of characters)."""
    reason: BaseException = exc
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        reason = exc.reason
    text = str(reason)
    if isinstance(reason, urllib3.exceptions.NewConnectionError):  # "HTTPConnection(host=…, port=…): why"
        text = text.split("): ", 1)[-1]
    return text if len(text) <= 200 else text[:199] + "…"
