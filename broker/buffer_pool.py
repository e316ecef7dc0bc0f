"""Large buffers used again instead of allocated afresh: for new segments and request frames.

Fresh memory is slow on the 2-core VM: a 4 MiB buffer costs about 2 ms of CPU before a byte is
copied, as the kernel maps and zeroes every page on first touch (``bench/README.md``), and a
heap block of a MiB costs a memset and, when malloc has trimmed the heap's top, the same faults.
Filling a buffer that is already mapped costs 0.08 ms per 4 MiB. Two pools use this:

* segments: once the cache is full, every new segment evicts an old one, so the broker builds
  the new one in the evicted one's memory (``storage/cache``), and a deleted topic's segments
  make room for the next topic's;
* request frames: a producer at full speed sends a frame of about a MiB (librdkafka's
  ``message.max.bytes``) every few milliseconds, and each was received into a fresh buffer,
  0.37 ms per MiB: a fifth of the broker's CPU per MiB produced (``protocol/framing``).

A buffer is only reused once nothing refers to it: a fetch response may still be sending a slice
of an evicted segment, an upload may still hold it, a request may still be decoding its frame.
Every such holder keeps a reference (a memoryview refers to the buffer it views), so the pool
checks the buffer's reference count. Buffers below a pool's minimum are left to malloc.
"""

from __future__ import annotations

import sys

MIN_POOLED_BYTES = 1024 * 1024  # the broker's mmap threshold (see ``memory``)
CAPACITY_STEP = 256 * 1024  # fresh buffers are rounded up to this, so nearby sizes share them
# References to a buffer in the pool's list when nothing else holds it: the list's, the local
# name's in ``take`` and ``sys.getrefcount``'s own argument.
_UNREFERENCED = 3


def capacity_for(size: int, step: int = CAPACITY_STEP) -> int:
    """The capacity of a fresh pooled buffer for ``size`` bytes."""
    return -(-size // step) * step


def fits(capacity: int, size: int) -> bool:
    """Whether a buffer of ``capacity`` may hold ``size`` bytes: at most a quarter of it is left
    unused, so the memory a buffer holds stays close to the bytes it is used for."""
    return size <= capacity and capacity - size <= capacity // 4


class BufferPool:
    """Buffers given back (evicted segments, received frames), handed out again.

    ``min_pooled_bytes`` and ``capacity_step`` must keep ``fits`` true for a fresh buffer: a
    step of at most a quarter of the minimum."""

    def __init__(
        self, min_pooled_bytes: int = MIN_POOLED_BYTES, capacity_step: int = CAPACITY_STEP
    ) -> None:
        assert capacity_step <= min_pooled_bytes // 4, "a fresh buffer must fit its own size"
        self.min_pooled_bytes = min_pooled_bytes
        self.capacity_step = capacity_step
        self._free: list[bytearray] = []
        self._bytes = 0
        self.reused = 0  # large buffers taken from the pool
        self.allocated = 0  # large buffers taken from fresh memory

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def take(self, size: int) -> bytearray | memoryview:
        """A writable buffer of exactly ``size`` bytes, with arbitrary contents."""
        if size < self.min_pooled_bytes:
            return bytearray(size)
        for index in range(len(self._free)):
            buffer = self._free[index]
            if fits(len(buffer), size) and sys.getrefcount(buffer) == _UNREFERENCED:
                del self._free[index]
                self._bytes -= len(buffer)
                self.reused += 1
                return memoryview(buffer)[:size]
        self.allocated += 1
        return memoryview(bytearray(capacity_for(size, self.capacity_step)))[:size]

    def give_back(self, body: bytes | bytearray | memoryview, room: int) -> None:
        """Keep the buffer under ``body`` for a later ``take``, which hands it out once nothing
        else refers to it; then drop the oldest buffers until the pool holds at most ``room``
        bytes."""
        buffer = body.obj if isinstance(body, memoryview) else body
        if isinstance(buffer, bytearray) and len(buffer) >= self.min_pooled_bytes:
            self._free.append(buffer)
            self._bytes += len(buffer)
        self.shrink(room)

    def shrink(self, room: int) -> None:
        """Drop the oldest buffers until the pool holds at most ``room`` bytes."""
        while self._free and self._bytes > room:
            self._bytes -= len(self._free.pop(0))
