"""A byte-bounded LRU of recent segment bodies, so fresh data is served without a GET.

The bound is on memory: a body that is a view counts the whole buffer it keeps alive (a
segment's header and footer, or the unused end of a reused buffer). Segments the cache drops
go to its buffer pool, where new segments are built (see ``buffer_pool``). The pool holds at
most what the cache's budget has free plus ``POOL_SPARE_BYTES``: with a full cache, each flush
round builds its segments in the memory the previous round's puts evicted, and the broker's
memory stays near the cache's budget.
"""

from __future__ import annotations

from collections import OrderedDict

from kafscale.broker.buffer_pool import BufferPool

POOL_SPARE_BYTES = 16 * 1024 * 1024  # a flush round's evicted segments beyond the budget


def held_bytes(body: bytes | memoryview) -> int:
    """The memory ``body`` keeps alive."""
    owner = body.obj if isinstance(body, memoryview) else body
    return len(owner) if isinstance(owner, bytes | bytearray) else len(body)


class SegmentCache:
    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._entries: OrderedDict[str, bytes | memoryview] = OrderedDict()
        self.buffers = BufferPool()

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def get(self, key: str) -> bytes | memoryview | None:
        body = self._entries.get(key)
        if body is not None:
            self._entries.move_to_end(key)
        return body

    def put(self, key: str, body: bytes | memoryview) -> None:
        if held_bytes(body) > self._max_bytes:
            return
        previous = self._entries.pop(key, None)
        if previous is not None:
            self._bytes -= held_bytes(previous)
        self._entries[key] = body
        self._bytes += held_bytes(body)
        while self._bytes > self._max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= held_bytes(evicted)
            self.buffers.give_back(evicted, self._pool_room())
        self.buffers.shrink(self._pool_room())

    def discard_prefix(self, prefix: str) -> None:
        for key in [k for k in self._entries if k.startswith(prefix)]:
            body = self._entries.pop(key)
            self._bytes -= held_bytes(body)
            self.buffers.give_back(body, self._pool_room())

    def _pool_room(self) -> int:
        return self._max_bytes - self._bytes + POOL_SPARE_BYTES
