"""A byte-bounded LRU of recent segment bodies, so fresh data is served without a GET.

The bound is on memory: a body that is a view counts the whole buffer it keeps alive (a
segment's header and footer, or the unused end of a reused buffer). Segments being flushed
count too, from the moment their buffer is taken (``reserve``) until they are cached or given
up: without that, a full cache plus the uploads in flight (up to four rounds of segments) is
what a flood of produce held, tens of MiB over the budget. Segments the cache drops go to its
buffer pool, where new segments are built (see ``buffer_pool``). The pool holds at most what
the cache's budget has free plus ``POOL_SPARE_BYTES``: with a full cache, a new segment's
reservation evicts an old one and is built in its memory, and the broker's memory stays near
the cache's budget.
"""

from __future__ import annotations

from collections import OrderedDict

from kafscale.broker.buffer_pool import BufferPool

POOL_SPARE_BYTES = 16 * 1024 * 1024  # a flush round's evicted segments beyond the budget


def held_bytes(body: bytes | memoryview) -> int:
    """The memory ``body`` keeps alive."""
    owner = body.obj if isinstance(body, memoryview) else body
    return len(owner) if isinstance(owner, bytes | bytearray) else len(body)


class Reservation:
    """A segment being flushed, counted against the cache's budget until released (once)."""

    __slots__ = ("_cache", "nbytes")

    def __init__(self, cache: SegmentCache, nbytes: int) -> None:
        self._cache = cache
        self.nbytes = nbytes

    def release(self) -> None:
        self._cache._reserved -= self.nbytes
        self.nbytes = 0


class SegmentCache:
    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._reserved = 0
        self._entries: OrderedDict[str, bytes | memoryview] = OrderedDict()
        self.buffers = BufferPool()

    @property
    def size_bytes(self) -> int:
        return self._bytes

    @property
    def reserved_bytes(self) -> int:
        return self._reserved

    def reserve(self, nbytes: int) -> Reservation:
        """Count a segment about to be built against the budget, evicting the oldest entries
        that no longer fit (their buffers go to the pool, where the segment may be built)."""
        self._reserved += nbytes
        self._evict_while_over(keep=0)
        return Reservation(self, nbytes)

    def segment_buffer(self, nbytes: int) -> tuple[bytearray | memoryview, Reservation]:
        """A buffer for a new segment of ``nbytes``, reserved first so that it can be one of
        the buffers its reservation evicts."""
        reservation = self.reserve(nbytes)
        return self.buffers.take(nbytes), reservation

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
        self._evict_while_over(keep=1)  # the new entry stays, even if uploads fill the budget

    def _evict_while_over(self, keep: int) -> None:
        while len(self._entries) > keep and self._bytes + self._reserved > self._max_bytes:
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
        return max(0, self._max_bytes - self._bytes - self._reserved) + POOL_SPARE_BYTES
