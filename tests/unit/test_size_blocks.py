"""``SizeBlocks``: a partition's kept bytes, exact, with per-segment sizes only at the front
and the back; checked against the plain sum over every segment."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.storage.size_blocks import SizeBlocks

pytestmark = pytest.mark.unit

STEP = 10  # offsets per segment


def kept_bytes(segments: list[tuple[int, int]], log_start: int) -> int:
    """The definition: every segment from the one holding the log start on."""
    holding = max((base for base, _ in segments if base <= log_start), default=None)
    return sum(size for base, size in segments if holding is None or base >= holding)


def trimmed(blocks: SizeBlocks, segments: list[tuple[int, int]], log_start: int) -> int:
    """Trim as LogSizes does: list the range it asks for (from ``segments``) and trim again."""
    wanted = blocks.trim(log_start)
    if wanted is not None:
        start, end = wanted
        blocks.fill_first([(b, s) for b, s in segments if start <= b < end])
        assert blocks.trim(log_start) is None
    return blocks.total


def test_only_the_first_and_last_blocks_keep_sizes() -> None:
    blocks = SizeBlocks("p/", 0, block_segments=4)
    segments = [(i * STEP, 100 + i) for i in range(14)]
    blocks.add(segments)
    assert [b.count for b in blocks.blocks] == [4, 4, 4, 2]
    assert [b.bases is not None for b in blocks.blocks] == [True, False, False, True]
    assert blocks.total == sum(size for _, size in segments)
    blocks.add(segments)  # counted already: skipped
    assert blocks.total == sum(size for _, size in segments)
    assert blocks.trim(15) is None  # inside the first block, which kept its sizes
    assert blocks.total == kept_bytes(segments, 15)
    assert blocks.trim(55) == (40, 80)  # into the second block, which gave them up
    blocks.fill_first(segments)
    assert blocks.trim(55) is None and blocks.total == kept_bytes(segments, 55)


@given(
    sizes=st.lists(st.integers(1, 10_000), min_size=1, max_size=60),
    block_segments=st.integers(1, 9),
    starts=st.lists(st.integers(0, 700), max_size=6),
    chunks=st.integers(1, 5),
)
def test_the_total_is_the_kept_bytes(
    sizes: list[int], block_segments: int, starts: list[int], chunks: int
) -> None:
    segments = [(i * STEP, size) for i, size in enumerate(sizes)]
    blocks = SizeBlocks("p/", 0, block_segments=block_segments)
    per_add = max(len(segments) // chunks, 1)
    log_start = 0
    for at in range(0, len(segments), per_add):  # in several listings, or commits
        blocks.add(segments[at : at + per_add])
        stored = segments[: at + per_add]
        if starts:
            log_start = max(log_start, starts.pop(0))  # the log start only grows
            assert trimmed(blocks, stored, log_start) == kept_bytes(stored, log_start)
    assert trimmed(blocks, segments, log_start) == kept_bytes(segments, log_start)
    kept = [b for b in blocks.blocks[1:-1] if b.bases is not None]
    assert not kept  # the middle blocks hold no per-segment sizes
