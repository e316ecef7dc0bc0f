"""The object-store port: the few calls the broker makes to S3 or a local directory.

Async on the outside; the S3 adapter runs boto3 (blocking) in a thread pool behind it. Keys are
plain strings built by ``kafscale.broker.metadata.keys``; adapters add the configured prefix.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Protocol


class ObjectStoreError(Exception):
    """The store could not be reached or answered with an error."""


class ObjectNotFound(ObjectStoreError):
    """The key does not exist."""


class ObjectAlreadyExists(ObjectStoreError):
    """A conditional put found the key already taken (objects are never overwritten)."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int


class ObjectStore(Protocol):
    async def check(self) -> None:
        """Fail with ObjectStoreError unless the store (bucket or directory) is usable."""

    async def put(
        self, key: str, data: bytes | bytearray | memoryview, *, if_absent: bool = True
    ) -> None:
        """Write ``data`` at ``key``; with ``if_absent`` raise ObjectAlreadyExists if taken."""

    async def get(self, key: str, *, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of the object (``end=None``: to the end); ObjectNotFound."""

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int | None = None
    ) -> list[ObjectInfo]:
        """The objects whose key starts with ``prefix`` (and sorts after ``start_after``), in
        key order; at most ``limit`` of them."""

    async def delete_many(self, keys: builtins.list[str]) -> None:
        """Delete the keys; missing keys are not an error."""

    async def close(self) -> None:
        """Release clients and thread pools."""
