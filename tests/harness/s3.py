"""S3 servers for tests: moto's HTTP server (fast) and Ceph radosgw (a real implementation).

Fixtures (loaded as a pytest plugin from ``tests/conftest.py``):

* ``s3_server`` (session): moto's S3 app on a free loopback port (see ``start_moto_s3``).
* ``s3_store``: an ``S3ObjectStore`` on a fresh bucket of ``s3_server``, closed afterwards.
* ``radosgw_server`` (session): a single-node Ceph with radosgw (see ``harness.radosgw``).
  Fails, never skips, when Ceph is not installed: run ``make system-deps``.
* ``radosgw_store``: an ``S3ObjectStore`` on a fresh radosgw bucket.

Both servers yield an ``S3Endpoint``; ``endpoint.settings(bucket)`` gives the
``StorageSettings`` a broker process would be started with.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
from pydantic import SecretStr
from werkzeug.serving import BaseWSGIServer, make_server

from harness.radosgw import SYSTEM_DEPS_HINT, RadosGW, missing_binaries
from kafscale.broker.config import StorageKind, StorageSettings
from kafscale.broker.storage.s3 import S3ObjectStore


@dataclass(frozen=True)
class S3Endpoint:
    name: str
    url: str
    access_key_id: str
    secret_access_key: str
    region: str = "us-east-1"
    startup_s: float = 0.0

    def settings(self, bucket: str, **overrides: Any) -> StorageSettings:
        """StorageSettings for ``bucket`` on this server (short timeouts for tests)."""
        fields: dict[str, Any] = {
            "kind": StorageKind.S3,
            "bucket": bucket,
            "endpoint": self.url,
            "region": self.region,
            "access_key_id": SecretStr(self.access_key_id),
            "secret_access_key": SecretStr(self.secret_access_key),
            "timeout_s": 20.0,
            "max_concurrency": 8,
        }
        return StorageSettings(**(fields | overrides))

    def client(self) -> Any:
        """A plain boto3 S3 client of this server, for tests that look at buckets directly."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name=self.region,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
        )

    async def open_store(self, bucket: str | None = None, **overrides: Any) -> S3ObjectStore:
        """A store on ``bucket`` (default: a new unique one), created if missing."""
        store = S3ObjectStore.from_settings(self.settings(bucket or unique_bucket(), **overrides))
        await store.create_bucket_if_missing()
        return store


def unique_bucket(label: str = "t") -> str:
    """A valid, unique bucket name (3-63 lowercase characters)."""
    return f"kafscale-{label}-{uuid.uuid4().hex[:16]}"


class QuietRequestHandler(MotoRequestHandler):
    """Without werkzeug's INFO line per request: brokers make hundreds of thousands of S3
    requests in a run, each line formatted by pytest's log capture in the worker that serves
    moto (and filling every failure report); errors are still logged."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        return


def start_moto_s3() -> tuple[BaseWSGIServer, threading.Thread]:
    """moto's S3 app alone, served by werkzeug's threaded server on a free loopback port.

    ``ThreadedMotoServer`` serves every moto service and finds the one a request is for from
    its Host and Authorization headers: a directory listing and hundreds of URL patterns per
    request, under a lock, half of moto's CPU for a small PUT. S3 is all we need."""
    server = make_server(
        "127.0.0.1", 0, create_backend_app("s3"), threaded=True, request_handler=QuietRequestHandler
    )
    thread = threading.Thread(target=server.serve_forever, name="moto-s3", daemon=True)
    thread.start()
    return server, thread


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Endpoint]:
    began = time.monotonic()
    server, thread = start_moto_s3()
    host, port = server.server_address[:2]
    try:
        yield S3Endpoint(
            "moto",
            f"http://{host}:{port}",
            "testing",
            "testing",
            startup_s=time.monotonic() - began,
        )
    finally:
        server.shutdown()
        thread.join()


def moto_buckets() -> list[dict[str, Any]]:
    """The bucket tables of this process's moto S3 backends (the server above serves them)."""
    from moto.s3.models import s3_backends

    return [backend.buckets for account in s3_backends.values() for backend in account.values()]


@pytest.fixture(scope="module", autouse=True)
def free_moto_buckets() -> Iterator[None]:
    """Forget, once a module is done, the moto buckets created while it ran. moto keeps every
    object under 5 MiB in memory, in the pytest worker that serves it, for the whole session:
    a worker of a full run reached 21 GB and the kernel's OOM killer. Module scope: a
    module-scoped cluster's bucket lives as long as the module's tests."""
    before = {id(table): set(table) for table in moto_buckets()}
    yield
    for table in moto_buckets():
        for name in set(table) - before.get(id(table), set()):
            table.pop(name, None)


@pytest_asyncio.fixture
async def s3_store(s3_server: S3Endpoint) -> AsyncIterator[S3ObjectStore]:
    store = await s3_server.open_store()
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture(scope="session")
def radosgw_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Endpoint]:
    missing = missing_binaries()
    if missing:
        pytest.fail(f"{SYSTEM_DEPS_HINT}; missing: {', '.join(missing)}", pytrace=False)
    ceph = RadosGW(tmp_path_factory.mktemp("radosgw"))
    ceph.start()
    try:
        yield S3Endpoint(
            "radosgw",
            ceph.endpoint_url,
            ceph.access_key_id,
            ceph.secret_access_key,
            region=ceph.region,
            startup_s=ceph.startup_s or 0.0,
        )
    finally:
        ceph.stop()


@pytest_asyncio.fixture
async def radosgw_store(radosgw_server: S3Endpoint) -> AsyncIterator[S3ObjectStore]:
    store = await radosgw_server.open_store()
    try:
        yield store
    finally:
        await store.close()
