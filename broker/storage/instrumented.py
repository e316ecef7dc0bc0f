"""An object store that times every call and counts its failures (``kafscale_object_store_*``).

It wraps whichever adapter the configuration picked, so S3 and the local directory report the
same metrics. A missing key or a conditional put that found the key taken is an answer, not a
failure: readers probe for objects and fenced writers race by design.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Awaitable
from typing import TypeVar

from kafscale.broker.observability.metrics import METRICS
from kafscale.broker.storage.object_store import (
    ObjectAlreadyExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
)

T = TypeVar("T")


class InstrumentedStore:
    def __init__(self, store: ObjectStore) -> None:
        self.inner = store

    async def _timed(self, operation: str, call: Awaitable[T]) -> T:
        started = time.perf_counter()
        failed = True
        try:
            result = await call
            failed = False
            return result
        except (ObjectNotFound, ObjectAlreadyExists):
            failed = False
            raise
        finally:
            METRICS.store_call(operation, time.perf_counter() - started, failed)

    async def check(self) -> None:
        await self._timed("check", self.inner.check())

    async def put(
        self, key: str, data: bytes | bytearray | memoryview, *, if_absent: bool = True
    ) -> None:
        await self._timed("put", self.inner.put(key, data, if_absent=if_absent))

    async def get(self, key: str, *, start: int = 0, end: int | None = None) -> bytes:
        return await self._timed("get", self.inner.get(key, start=start, end=end))

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int | None = None
    ) -> builtins.list[ObjectInfo]:
        return await self._timed(
            "list", self.inner.list(prefix, start_after=start_after, limit=limit)
        )

    async def delete_many(self, keys: builtins.list[str]) -> None:
        await self._timed("delete", self.inner.delete_many(keys))

    async def close(self) -> None:
        await self.inner.close()
