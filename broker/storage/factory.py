"""Pick the object-store adapter the configuration asks for."""

from __future__ import annotations

from kafscale.broker.config import StorageKind, StorageSettings
from kafscale.broker.storage.local_dir import LocalDirObjectStore
from kafscale.broker.storage.object_store import ObjectStore
from kafscale.broker.storage.s3 import S3ObjectStore


def open_object_store(settings: StorageSettings) -> ObjectStore:
    """The store for ``settings.kind``; call ``check()`` on it before serving (fail closed)."""
    if settings.kind is StorageKind.S3:
        return S3ObjectStore.from_settings(settings)
    if settings.kind is StorageKind.LOCAL:
        return LocalDirObjectStore.from_settings(settings)
    raise ValueError(f"unknown storage kind {settings.kind!r}")
