"""Pick the object-store adapter the configuration asks for.

The S3 adapter is imported only when S3 is asked for: boto3 and botocore cost ~0.2 s of
CPU to import, paid otherwise by every Spark Python worker and CLI start that reads a local
directory."""

from __future__ import annotations

from kafscale.broker.storage.local_dir import LocalDirObjectStore
from kafscale.broker.storage.object_store import ObjectStore
from kafscale.broker.store_settings import StorageKind, StorageSettings


def open_object_store(settings: StorageSettings) -> ObjectStore:
    """The store for ``settings.kind``; call ``check()`` on it before serving (fail closed)."""
    if settings.kind is StorageKind.S3:
        from kafscale.broker.storage.s3 import S3ObjectStore

        return S3ObjectStore.from_settings(settings)
    if settings.kind is StorageKind.LOCAL:
        return LocalDirObjectStore.from_settings(settings)
    raise ValueError(f"unknown storage kind {settings.kind!r}")
