"""The segment cache (``broker/storage/cache.py``): bounded by bytes, least recently used out
first, compared step by step with a reference model."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.storage.cache import Reservation, SegmentCache

pytestmark = pytest.mark.unit

keys = st.sampled_from([f"{t}/{p}/{n:020d}" for t in ("a", "b") for p in (0, 1) for n in (0, 7)])
operations = st.lists(
    st.one_of(
        st.tuples(st.just("put"), keys, st.integers(0, 120)),
        st.tuples(st.just("get"), keys, st.just(0)),
        st.tuples(st.just("discard"), st.sampled_from(["a/", "a/0/", "b/1/", "c/"]), st.just(0)),
    ),
    max_size=60,
)


class Model:
    """The obvious LRU: an ordered dict, oldest first."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.entries: OrderedDict[str, bytes] = OrderedDict()

    def put(self, key: str, body: bytes) -> None:
        if len(body) > self.max_bytes:
            return
        self.entries.pop(key, None)
        self.entries[key] = body
        while sum(map(len, self.entries.values())) > self.max_bytes:
            self.entries.popitem(last=False)

    def get(self, key: str) -> bytes | None:
        if key in self.entries:
            self.entries.move_to_end(key)
            return self.entries[key]
        return None


@given(st.integers(0, 300), operations)
def test_cache_matches_an_lru_model_and_stays_within_its_bound(
    max_bytes: int, steps: list[tuple[str, str, int]]
) -> None:
    cache, model = SegmentCache(max_bytes), Model(max_bytes)
    for number, (op, key, size) in enumerate(steps):
        if op == "put":
            body = bytes([number % 256]) * size
            cache.put(key, body)
            model.put(key, body)
        elif op == "get":
            assert cache.get(key) == model.get(key)
        else:
            cache.discard_prefix(key)
            for k in [k for k in model.entries if k.startswith(key)]:
                del model.entries[k]
        assert cache.size_bytes <= max_bytes
        assert cache.size_bytes == sum(map(len, model.entries.values()))
    for key, body in model.entries.items():
        assert cache.get(key) == body


def test_least_recently_used_goes_first() -> None:
    cache = SegmentCache(30)
    cache.put("a", b"a" * 10)
    cache.put("b", b"b" * 10)
    cache.put("c", b"c" * 10)
    assert cache.get("a") is not None  # a is now the most recent
    cache.put("d", b"d" * 10)
    assert cache.get("b") is None
    assert [cache.get(k) is not None for k in "acd"] == [True, True, True]


def test_replacing_a_key_counts_its_new_size() -> None:
    cache = SegmentCache(100)
    cache.put("a", b"x" * 60)
    cache.put("a", b"y" * 30)
    assert cache.size_bytes == 30
    cache.put("b", b"z" * 70)
    assert cache.get("a") == b"y" * 30
    assert cache.size_bytes == 100


def test_bodies_larger_than_the_cache_are_not_kept() -> None:
    cache = SegmentCache(50)
    cache.put("small", b"s" * 20)
    cache.put("big", b"b" * 51)
    assert cache.get("big") is None
    assert cache.get("small") == b"s" * 20
    assert cache.size_bytes == 20


def test_discard_prefix_forgets_a_partition() -> None:
    cache = SegmentCache(1000)
    for key in ("t/0/a", "t/0/b", "t/1/a", "u/0/a"):
        cache.put(key, b"x" * 10)
    cache.discard_prefix("t/0/")
    assert cache.get("t/0/a") is None and cache.get("t/0/b") is None
    assert cache.get("t/1/a") is not None and cache.get("u/0/a") is not None
    assert cache.size_bytes == 20


def test_a_view_counts_the_whole_buffer_it_keeps_alive() -> None:
    """A segment body is a view into its segment's buffer (header, footer, and in a reused
    buffer an unused end): the bound is on the memory held, not on the bytes served."""
    cache = SegmentCache(1000)
    cache.put("a/0/0", memoryview(bytearray(600))[32:-16])
    assert cache.size_bytes == 600
    cache.put("a/0/1", memoryview(bytes(600))[:10])
    assert cache.get("a/0/0") is None  # 1200 bytes held would exceed the bound
    assert cache.size_bytes == 600


def test_segments_being_flushed_count_against_the_budget() -> None:
    """A flood of produce must not hold a full cache plus every upload in flight: a segment's
    reservation evicts the oldest entries, and its buffer can be one of theirs."""
    cache = SegmentCache(8 << 20)
    for n in range(4):
        cache.put(f"t/0/{n}", memoryview(bytearray(2 << 20))[:-16])
    segment, reservation = cache.segment_buffer(2 << 20)
    assert cache.get("t/0/0") is None and cache.size_bytes == 6 << 20
    assert cache.size_bytes + cache.reserved_bytes == 8 << 20
    assert cache.buffers.reused == 1  # built in the evicted segment's memory
    reservation.release()
    reservation.release()  # a second release changes nothing
    assert cache.reserved_bytes == 0
    cache.put("t/0/4", segment)
    assert cache.size_bytes == 8 << 20 and cache.get("t/0/4") is not None


def test_a_new_entry_stays_cached_while_uploads_fill_the_budget() -> None:
    cache = SegmentCache(100)
    cache.put("a", b"a" * 40)
    cache.reserve(90)  # more in flight than the budget has room for: "a" goes
    assert cache.get("a") is None
    cache.put("b", b"b" * 40)  # what was just committed is what consumers read next
    assert cache.get("b") == b"b" * 40


@given(st.integers(0, 300), st.lists(st.tuples(st.booleans(), st.integers(0, 120)), max_size=40))
def test_cached_and_flushing_bytes_stay_within_the_budget(
    max_bytes: int, steps: list[tuple[bool, int]]
) -> None:
    cache = SegmentCache(max_bytes)
    held: list[Reservation] = []
    for number, (reserve, size) in enumerate(steps):
        if reserve:
            held.append(cache.reserve(size))
        else:
            if held:
                held.pop(0).release()
            cache.put(f"k{number}", b"x" * size)
        over = cache.size_bytes + cache.reserved_bytes - max_bytes
        # Over the budget only by what is in flight, or by the one entry just put.
        assert over <= 0 or cache.size_bytes <= max(size, 0) or cache.size_bytes == 0
        assert cache.reserved_bytes == sum(r.nbytes for r in held)
