"""Memory for new segments, taken from segments the cache has let go of.

A segment is built in a buffer of its own, and the cache keeps that buffer for reads of recent
data. Built in fresh memory, a 4 MiB segment costs about 2 ms of CPU on the 2-core VM before a
byte is copied: the kernel maps and zeroes every page on first touch (``bench/README.md``). That
is a fifth of the broker's CPU per MiB produced at full rate. Filling a buffer that is already
mapped costs 0.08 ms. Once the cache is full, every new segment evicts an old one, so the broker
builds the new one in the evicted one's memory, and a deleted topic's segments make room for
the next topic's.

A buffer is only reused once nothing refers to it: a fetch response may still be sending a slice
of an evicted segment, and an upload may still hold it. Every such holder keeps a reference
(a memoryview refers to the buffer it views), so the pool checks the buffer's reference count.
Buffers below ``MIN_POOLED_BYTES`` are left to malloc, whose heap reuses small blocks anyway.
"""

from __future__ import annotations

import sys

MIN_POOLED_BYTES = 1024 * 1024  # the broker's mmap threshold (see ``memory``)
CAPACITY_STEP = 256 * 1024  # fresh buffers are rounded up to this, so nearby sizes share them
# References to a buffer in the pool's list when nothing else holds it: the list's, the local
# name's in ``take`` and ``sys.getrefcount``'s own argument.
_UNREFERENCED = 3


def capacity_for(size: int) -> int:
    """The capacity of a fresh pooled buffer for ``size`` bytes."""
    return -(-size // CAPACITY_STEP) * CAPACITY_STEP


def fits(capacity: int, size: int) -> bool:
    """Whether a buffer of ``capacity`` may hold ``size`` bytes: at most a quarter of it is left
    unused, so the memory a buffer holds stays close to the bytes the cache counts for it."""
    return size <= capacity and capacity - size <= capacity // 4


class BufferPool:
    """Buffers of evicted segments, handed out again for new ones."""

    def __init__(self) -> None:
        self._free: list[bytearray] = []
        self._bytes = 0
        self.reused = 0  # large buffers taken from the pool
        self.allocated = 0  # large buffers taken from fresh memory

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def take(self, size: int) -> bytearray | memoryview:
        """A writable buffer of exactly ``size`` bytes, with arbitrary contents."""
        if size < MIN_POOLED_BYTES:
            return bytearray(size)
        for index in range(len(self._free)):
            buffer = self._free[index]
            if fits(len(buffer), size) and sys.getrefcount(buffer) == _UNREFERENCED:
                del self._free[index]
                self._bytes -= len(buffer)
                self.reused += 1
                return memoryview(buffer)[:size]
        self.allocated += 1
        return memoryview(bytearray(capacity_for(size)))[:size]

    def give_back(self, body: bytes | bytearray | memoryview, room: int) -> None:
        """Keep the buffer under ``body`` (a segment the cache dropped) for a later ``take``;
        then drop the oldest buffers until the pool holds at most ``room`` bytes."""
        buffer = body.obj if isinstance(body, memoryview) else body
        if isinstance(buffer, bytearray) and len(buffer) >= MIN_POOLED_BYTES:
            self._free.append(buffer)
            self._bytes += len(buffer)
        self.shrink(room)

    def shrink(self, room: int) -> None:
        """Drop the oldest buffers until the pool holds at most ``room`` bytes."""
        while self._free and self._bytes > room:
            self._bytes -= len(self._free.pop(0))
