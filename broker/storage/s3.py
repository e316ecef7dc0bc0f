"""The S3 adapter of the object-store port: boto3 in a thread pool, bounded and under deadlines.

boto3 is blocking and its clients are thread-safe, so the broker creates ONE client at
start-up and runs every call in a dedicated thread pool via ``loop.run_in_executor``. An
``asyncio.Semaphore(max_concurrency)`` bounds calls in flight (the pool and the HTTP connection
pool are sized to match) and each call runs under ``asyncio.timeout(timeout_s)``; botocore's
own connect/read timeouts use the same figure so an abandoned thread cannot hang for ever.

Addressing is path-style (``endpoint/bucket/key``), which every S3-compatible server
(radosgw, moto, MinIO) understands without wildcard DNS. The configured key prefix is treated
as a folder: ``prefix="a/b"`` stores ``seg.kfs`` at ``a/b/seg.kfs`` and list results have it
stripped again, so callers never see it.

Conditional writes (``If-None-Match: *``) keep the "objects are never overwritten" invariant on
the server side: a late upload from a fenced writer gets 412 and becomes ObjectAlreadyExists.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

import boto3
import botocore
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

import kafscale
from kafscale.broker.storage.object_store import (
    ObjectAlreadyExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStoreError,
)
from kafscale.broker.store_settings import StorageSettings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ListObjectsV2OutputTypeDef

T = TypeVar("T")

DELETE_BATCH = 1000  # the most keys one DeleteObjects request may carry
_NOT_FOUND = frozenset({"NoSuchKey", "NotFound", "404"})
_NO_BUCKET = frozenset({"NoSuchBucket"})
_CONFLICT = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "412"})
_BUCKET_TAKEN = frozenset({"BucketAlreadyOwnedByYou", "BucketAlreadyExists"})
_INVALID_RANGE = frozenset({"InvalidRange", "416"})


def normalise_prefix(prefix: str) -> str:
    """``"a/b"``, ``"/a/b/"`` -> ``"a/b/"``; ``""`` -> ``""``."""
    stripped = prefix.strip("/")
    return f"{stripped}/" if stripped else ""


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def build_client(settings: StorageSettings) -> S3Client:
    """The one boto3 client of a process: path-style, timeouts and pool sized from settings."""
    config = Config(
        region_name=settings.region,
        connect_timeout=settings.timeout_s,
        read_timeout=settings.timeout_s,
        max_pool_connections=max(settings.max_concurrency, 10),
        retries={"max_attempts": 3, "mode": "standard"},
        # botocore SHA-256-hashes every body it signs, and signs bodies whenever no checksum header
        # goes along (always, with the setting below): a third of the broker's CPU for a 4 MiB
        # segment PUT. Segments and record batches carry their own CRC32C, so sign the headers
        # only (UNSIGNED-PAYLOAD, what the AWS SDKs send over TLS; S3, radosgw and MinIO take it).
        s3={"addressing_style": "path", "payload_signing_enabled": False},
        # Newer botocore adds flexible checksums to every request by default; over TLS they go in
        # an aws-chunked trailer that some S3-compatible servers reject. Only when required.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        # Segments are PUT as memoryviews (views into reused buffers, see buffer_pool), which
        # botocore's parameter validator refuses though its HTTP layer sends any bytes-like
        # body. The calls are few and fixed, in this module, and tested against moto and
        # radosgw; skipping the check also saves ~10 % of boto3's CPU per call.
        parameter_validation=False,
        # Names the broker in the store's access logs. A fixed string also spares botocore from
        # composing its own User-Agent from a dozen parts twice per request (~10 % of a PUT's
        # client CPU).
        user_agent=f"kafscale/{kafscale.__version__} botocore/{botocore.__version__}",
    )
    access = settings.access_key_id
    secret = settings.secret_access_key
    session = boto3.session.Session()
    return session.client(
        "s3",
        endpoint_url=settings.endpoint,
        region_name=settings.region,
        aws_access_key_id=access.get_secret_value() if access else None,
        aws_secret_access_key=secret.get_secret_value() if secret else None,
        config=config,
    )


class S3ObjectStore:
    """ObjectStore over one bucket of an S3-compatible server."""

    def __init__(
        self,
        client: S3Client,
        *,
        bucket: str,
        prefix: str = "",
        endpoint: str | None = None,
        region: str = "us-east-1",
        timeout_s: float = 30.0,
        max_concurrency: int = 16,
    ) -> None:
        self._client = client
        self._bucket = bucket
        self._prefix = normalise_prefix(prefix)
        self._endpoint = endpoint or "AWS S3"
        self._region = region
        self._timeout_s = timeout_s
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self._executor = ThreadPoolExecutor(max_concurrency, thread_name_prefix="kafscale-s3")

    @classmethod
    def from_settings(cls, settings: StorageSettings) -> S3ObjectStore:
        return cls(
            build_client(settings),
            bucket=settings.bucket,
            prefix=settings.prefix,
            endpoint=settings.endpoint,
            region=settings.region,
            timeout_s=settings.timeout_s,
            max_concurrency=settings.max_concurrency,
        )

    @property
    def bucket(self) -> str:
        return self._bucket

    def _where(self) -> str:
        return f"bucket {self._bucket!r} at {self._endpoint}"

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one blocking boto3 call in the pool, bounded and under the deadline."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._timeout_s), self._semaphore:
                return await loop.run_in_executor(
                    self._executor, functools.partial(fn, *args, **kwargs)
                )
        except TimeoutError as exc:
            raise ObjectStoreError(
                f"S3 call timed out after {self._timeout_s}s ({self._where()})"
            ) from exc
        except BotoCoreError as exc:
            raise ObjectStoreError(f"S3 unreachable ({self._where()}): {exc}") from exc

    def _fail(self, exc: ClientError, key: str | None = None) -> ObjectStoreError:
        """Map a ClientError to the port's exceptions."""
        code = _error_code(exc)
        what = f"{key!r} in {self._where()}" if key is not None else self._where()
        if code in _NOT_FOUND:
            return ObjectNotFound(f"no object {what}")
        if code in _NO_BUCKET:
            return ObjectStoreError(f"{self._where()} does not exist")
        return ObjectStoreError(f"S3 error {code or _status(exc)} for {what}: {exc}")

    # --- the port -----------------------------------------------------------------------------

    async def check(self) -> None:
        """HEAD the bucket: a missing, forbidden or unreachable bucket fails start-up clearly."""
        try:
            await self._call(self._client.head_bucket, Bucket=self._bucket)
        except ClientError as exc:
            status = _status(exc)
            if status == 404 or _error_code(exc) in _NO_BUCKET | _NOT_FOUND:
                raise ObjectStoreError(f"{self._where()} does not exist") from exc
            if status == 403:
                raise ObjectStoreError(f"access to {self._where()} denied (403)") from exc
            raise ObjectStoreError(f"{self._where()} is not usable: {exc}") from exc

    async def put(
        self, key: str, data: bytes | bytearray | memoryview, *, if_absent: bool = True
    ) -> None:
        extra: dict[str, str] = {"IfNoneMatch": "*"} if if_absent else {}
        try:
            await self._call(
                self._client.put_object,
                Bucket=self._bucket,
                Key=self._prefix + key,
                Body=data,
                ContentType="application/octet-stream",
                **extra,
            )
        except ClientError as exc:
            if if_absent and (_error_code(exc) in _CONFLICT or _status(exc) in (409, 412)):
                raise ObjectAlreadyExists(f"{key!r} already exists in {self._where()}") from exc
            raise self._fail(exc, key) from exc

    async def get(self, key: str, *, start: int = 0, end: int | None = None) -> bytes:
        if start < 0 or (end is not None and end < 0):
            raise ValueError("byte range bounds must not be negative")
        if end is not None and end <= start:
            await self._head(key)  # an empty range still requires the object to exist
            return b""
        extra: dict[str, str] = {}
        if start > 0 or end is not None:
            extra["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        try:
            return await self._call(self._read_body, self._prefix + key, extra)
        except ClientError as exc:
            if _error_code(exc) in _INVALID_RANGE or _status(exc) == 416:
                return b""  # start at or past the end, as slicing a file would give
            raise self._fail(exc, key) from exc

    def _read_body(self, full_key: str, extra: dict[str, str]) -> bytes:
        """GET and drain the body in the worker thread (reading it is blocking I/O too)."""
        response = self._client.get_object(Bucket=self._bucket, Key=full_key, **extra)  # type: ignore[arg-type]
        with response["Body"] as body:
            return body.read()

    async def _head(self, key: str) -> None:
        try:
            await self._call(self._client.head_object, Bucket=self._bucket, Key=self._prefix + key)
        except ClientError as exc:
            raise self._fail(exc, key) from exc

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int | None = None
    ) -> list[ObjectInfo]:
        """Pages of ListObjectsV2 (up to ``limit`` keys), each page its own call (and deadline)."""
        paginator = self._client.get_paginator("list_objects_v2")
        extra: dict[str, Any] = {}
        if start_after is not None:
            extra["StartAfter"] = self._prefix + start_after
        if limit is not None:
            extra["PaginationConfig"] = {"MaxItems": limit, "PageSize": min(limit, 1000)}
        pages: Iterator[ListObjectsV2OutputTypeDef] = iter(
            paginator.paginate(Bucket=self._bucket, Prefix=self._prefix + prefix, **extra)
        )
        found: builtins.list[ObjectInfo] = []
        strip = len(self._prefix)
        try:
            while (page := await self._call(next, pages, None)) is not None:
                found.extend(
                    ObjectInfo(key=item["Key"][strip:], size=item["Size"])
                    for item in page.get("Contents", [])
                )
        except ClientError as exc:
            raise self._fail(exc) from exc
        found.sort(key=lambda info: info.key)
        return found

    async def delete_many(self, keys: builtins.list[str]) -> None:
        """DeleteObjects in chunks of 1000 (one after another: deletes are rare and bulk)."""
        for i in range(0, len(keys), DELETE_BATCH):
            await self._delete_chunk(keys[i : i + DELETE_BATCH])

    async def _delete_chunk(self, keys: builtins.list[str]) -> None:
        objects = [{"Key": self._prefix + key} for key in keys]
        try:
            response = await self._call(
                self._client.delete_objects,
                Bucket=self._bucket,
                Delete={"Objects": objects, "Quiet": True},  # type: ignore[typeddict-item]
            )
        except ClientError as exc:
            raise self._fail(exc) from exc
        errors = [e for e in response.get("Errors", []) if e.get("Code") != "NoSuchKey"]
        if errors:
            first = errors[0]
            raise ObjectStoreError(
                f"{len(errors)} deletes failed in {self._where()}, first "
                f"{first.get('Key')!r}: {first.get('Code')} {first.get('Message')}"
            )

    async def close(self) -> None:
        """Wait for calls still running in the pool, then close the HTTP connections."""
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)
        self._client.close()

    # --- set-up helpers (kafscale local, tests) -----------------------------------------------

    async def create_bucket_if_missing(self) -> None:
        """Create the bucket unless it exists; used by ``kafscale local`` and the tests."""
        kwargs: dict[str, Any] = {"Bucket": self._bucket}
        if self._region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self._region}
        try:
            await self._call(self._client.create_bucket, **kwargs)
        except ClientError as exc:
            if _error_code(exc) not in _BUCKET_TAKEN:
                raise ObjectStoreError(f"cannot create {self._where()}: {exc}") from exc
        await self.check()
