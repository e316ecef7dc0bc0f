"""Object stores for unit tests: the real local-directory store, counting its listing calls."""

from __future__ import annotations

from kafscale.broker.storage.local_dir import LocalDirObjectStore
from kafscale.broker.storage.object_store import ObjectInfo


class CountingStore(LocalDirObjectStore):
    """A real local-directory store that counts its listing calls (how far a reader or the
    janitor lists is a cost on S3, billed per call)."""

    lists = 0

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int | None = None
    ) -> list[ObjectInfo]:
        self.lists += 1
        return await super().list(prefix, start_after=start_after, limit=limit)
