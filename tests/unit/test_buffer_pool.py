"""Segment buffers reused from the cache's evictions (``broker/buffer_pool.py``): a
buffer is handed out again only when nothing refers to it, and a segment built in a reused
buffer is byte for byte the one built in fresh memory."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from harness.batches import make_batch

from kafscale.broker.buffer_pool import MIN_POOLED_BYTES, BufferPool, fits
from kafscale.broker.storage.cache import POOL_SPARE_BYTES, SegmentCache
from kafscale.broker.storage.segments import SEGMENT_HEADER_SIZE, encode_segment

pytestmark = pytest.mark.unit

MiB = 1024 * 1024
ROOM = 64 * MiB


def segment_body(pool: BufferPool, size: int) -> memoryview:
    """What the cache holds of a segment built in the pool: a view into its buffer."""
    return memoryview(pool.take(size))[SEGMENT_HEADER_SIZE:-16]


def test_small_buffers_are_plain_bytearrays_and_never_pooled() -> None:
    pool = BufferPool()
    small = pool.take(1000)
    assert isinstance(small, bytearray) and len(small) == 1000
    pool.give_back(small, ROOM)
    assert pool.size_bytes == 0


def owner(held: bytearray | memoryview) -> object:
    return held.obj if isinstance(held, memoryview) else held


@pytest.mark.parametrize(
    "hold",
    [
        pytest.param(lambda body: body.obj, id="a name for the buffer"),
        # e.g. a fetch response still being written from a slice of the segment
        pytest.param(lambda body: body[100:200], id="a view of a slice"),
    ],
)
def test_an_evicted_buffer_is_handed_out_again_once_nothing_refers_to_it(
    hold: Callable[[memoryview], bytearray | memoryview],
) -> None:
    pool = BufferPool()
    body = segment_body(pool, 2 * MiB)
    holders = [hold(body)]
    pool.give_back(body, ROOM)
    del body
    # The cache's view is gone, but something else still refers to the buffer: not reusable.
    assert owner(pool.take(2 * MiB)) is not owner(holders[0])
    assert pool.size_bytes == 2 * MiB  # still pooled, for later
    holders.clear()
    reused = pool.take(2 * MiB)
    assert pool.size_bytes == 0
    assert len(reused) == 2 * MiB


def test_reuse_returns_the_same_memory() -> None:
    pool = BufferPool()
    body = segment_body(pool, 3 * MiB)
    address = id(body.obj)
    pool.give_back(body, ROOM)
    del body
    reused = pool.take(3 * MiB - 1000)
    assert isinstance(reused, memoryview)
    assert id(reused.obj) == address
    assert len(reused) == 3 * MiB - 1000


@pytest.mark.parametrize(
    ("capacity", "size", "expected"),
    [
        (4 * MiB, 4 * MiB, True),
        (4 * MiB, 4 * MiB + 1, False),  # too small
        (4 * MiB, 3 * MiB, True),
        (4 * MiB, 3 * MiB - 1, False),  # would leave more than a quarter unused
    ],
)
def test_a_buffer_fits_sizes_up_to_a_quarter_below_its_capacity(
    capacity: int, size: int, expected: bool
) -> None:
    assert fits(capacity, size) is expected


def test_the_pool_drops_its_oldest_buffers_beyond_its_room() -> None:
    pool = BufferPool()
    bodies = [segment_body(pool, MIN_POOLED_BYTES) for _ in range(3)]
    oldest = bodies[0].obj
    for body in bodies:
        pool.give_back(body, room=2 * MIN_POOLED_BYTES)
    del bodies, body
    assert pool.size_bytes == 2 * MIN_POOLED_BYTES
    assert all(memoryview(pool.take(MIN_POOLED_BYTES)).obj is not oldest for _ in range(2))


def test_a_full_cache_builds_each_new_segment_in_the_one_it_evicted_last() -> None:
    cache = SegmentCache(8 * MiB)
    buffers = []
    for n in range(5):
        body = segment_body(cache.buffers, 4 * MiB)
        buffers.append(id(body.obj))
        cache.put(f"t/0/{n}", body)
        del body
    # Two segments fit the budget. The third put evicted the first; the fourth segment was
    # built in its buffer, and the fifth in the second's.
    assert buffers[3] == buffers[0] and buffers[4] == buffers[1]
    assert len(set(buffers)) == 3
    assert cache.size_bytes <= 8 * MiB
    assert cache.buffers.size_bytes == 4 * MiB  # the third's, evicted by the fifth put
    cache.discard_prefix("t/")
    assert cache.size_bytes == 0
    assert cache.buffers.size_bytes == 3 * (4 * MiB)


def test_the_pool_holds_no_more_than_the_cache_budget_has_free() -> None:
    cache = SegmentCache(8 * MiB)
    bodies = [segment_body(cache.buffers, 4 * MiB) for _ in range(30)]
    for n, body in enumerate(bodies):
        cache.put(f"t/0/{n}", body)
    del bodies, body  # the evicted ones are free (a reader would keep its own view)
    assert cache.buffers.size_bytes <= 8 * MiB - cache.size_bytes + POOL_SPARE_BYTES
    cache.discard_prefix("t/")
    assert cache.buffers.size_bytes <= 8 * MiB + POOL_SPARE_BYTES


def test_a_segment_built_in_a_reused_buffer_equals_one_built_in_fresh_memory() -> None:
    values = [bytes([n % 251]) * 1000 for n in range(1500)]
    batches = [make_batch(10 * i, values[10 * i : 10 * i + 10]) for i in range(150)]
    fresh = bytes(encode_segment(batches, 1_700_000_000_000, 4096).segment)
    assert len(fresh) >= MIN_POOLED_BYTES
    pool = BufferPool()
    dirty = pool.take(len(fresh))
    dirty[:] = b"\xff" * len(fresh)  # what an earlier segment left behind
    pool.give_back(memoryview(dirty)[10:20], ROOM)
    del dirty
    reused = encode_segment(batches, 1_700_000_000_000, 4096, allocate=pool.take)
    assert pool.size_bytes == 0  # built in the pooled buffer
    assert bytes(reused.segment) == fresh
