"""The log cleaner's pure decisions and the partition state's ``cleaned`` field."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.partition_state import (
    Cleaned,
    PartitionState,
    is_committed_cleaned,
    is_committed_segment,
)
from kafscale.broker.storage.cleaner import (
    cleaned_inputs,
    plain_inputs,
    stale_cleaned_keys,
    superseded_keys,
)
from kafscale.broker.storage.compaction_plan import (
    CleanerConfig,
    PlainSegment,
    cleanable_end,
    cleaner_config,
    is_compacted,
    plan_dirty_end,
    should_clean,
)
from kafscale.broker.storage.object_store import ObjectInfo
from kafscale.broker.storage.segments import decode_segment, encode_range_segment

NOW = 1_000_000


def segments(*sizes: int, created: int = 0) -> list[PlainSegment]:
    found, base = [], 0
    for size in sizes:
        found.append(PlainSegment(base, base + 10, size, created))
        base += 10
    return found


def test_cleaned_round_trips_and_absent_means_never_cleaned() -> None:
    state = PartitionState(high_watermark=50, cleaned=Cleaned(30, 2, 7))
    assert PartitionState.from_json(state.to_json()).cleaned == Cleaned(30, 2, 7)
    assert b"cleaned" not in PartitionState(high_watermark=50).to_json()
    assert PartitionState.from_json(PartitionState().to_json()).cleaned is None


def test_plain_segments_below_upto_are_superseded_and_only_the_states_pass_counts() -> None:
    state = PartitionState(high_watermark=50, epochs=((0, 0),), cleaned=Cleaned(30, 2, 0))
    assert not is_committed_segment(state, 20, 0)
    assert is_committed_segment(state, 30, 0)
    assert is_committed_cleaned(state, 2, 0, 0)
    assert not is_committed_cleaned(state, 1, 0, 0)  # the previous generation
    assert not is_committed_cleaned(state, 2, 1, 0)  # a fenced pass's orphan
    assert not is_committed_cleaned(state, 2, 0, 30)  # beyond upto


def test_the_newest_segment_is_never_cleaned() -> None:
    assert cleanable_end(segments(100), 10, NOW, 0) is None
    assert cleanable_end(segments(100, 100, 100), 30, NOW, 0) == 20


def test_open_transactions_and_young_segments_stop_the_dirty_end() -> None:
    state = PartitionState(high_watermark=40, open_txns={7: 15})
    eager = CleanerConfig(min_dirty_ratio=0.1)
    assert plan_dirty_end(segments(10, 10, 10, 10), state, 0, NOW, eager) == 10
    young = [*segments(10, created=0)[:1], *segments(10, 10, 10, created=NOW)[1:]]
    assert cleanable_end(young, 40, NOW, 1000) == 10


def test_dirty_ratio_and_max_lag_decide() -> None:
    few = segments(10, 10, 10)
    assert should_clean(few, 20, 0, NOW, CleanerConfig())
    assert not should_clean(few, 10, 1000, NOW, CleanerConfig())  # 10 / 1030 dirty
    lagging = CleanerConfig(max_lag_ms=100)
    assert should_clean(few, 10, 1000, NOW, lagging)  # created at 0: older than 100 ms


@given(st.lists(st.integers(1, 1000), min_size=1, max_size=20), st.integers(0, 200))
def test_the_dirty_end_is_a_segment_boundary_below_the_newest(sizes: list[int], lso: int) -> None:
    listed = segments(*sizes)
    end = cleanable_end(listed, lso, NOW, 0)
    if end is not None:
        assert end in {s.end for s in listed[:-1]}
        assert end <= lso


def test_configs() -> None:
    assert is_compacted({"cleanup.policy": "compact,delete"})
    assert not is_compacted({"cleanup.policy": "delete"})
    config = cleaner_config({"min.cleanable.dirty.ratio": "0.1", "delete.retention.ms": "5"})
    assert config.min_dirty_ratio == 0.1 and config.delete_retention_ms == 5


def test_inputs_tile_the_offsets() -> None:
    state = PartitionState(high_watermark=50, epochs=((0, 0),), cleaned=Cleaned(30, 2, 0))
    plain_prefix = keys.partition_object_prefix("c", "t", "id", 0)
    listed = [
        ObjectInfo(keys.segment_object_key("c", "t", "id", 0, base, 0), 100)
        for base in (0, 10, 30, 40)
    ]
    assert [(i.base, i.end) for i in plain_inputs(state, listed)] == [(30, 40), (40, 50)]
    assert superseded_keys(listed, 30) == [listed[0].key, listed[1].key]
    prefix = keys.cleaned_pass_prefix("c", "t", "id", 0, 2, 0)
    cleaned = [ObjectInfo(keys.cleaned_object_key(prefix, b), 10) for b in (0, 12)]
    assert [(i.base, i.end) for i in cleaned_inputs(state, cleaned, prefix)] == [(0, 12), (12, 30)]
    assert prefix.startswith(keys.cleaned_root_prefix("c", "t", "id", 0))
    assert not prefix.startswith(plain_prefix)


def test_an_emptied_cleaned_object_still_covers_its_range() -> None:
    encoded = encode_range_segment(b"", 10, 19, 5, 4096)
    decoded = decode_segment(encoded.segment)
    assert (decoded.base_offset, decoded.last_offset, len(decoded.body)) == (10, 19, 0)


def test_a_delayed_delete_never_touches_a_newer_pass() -> None:
    """A delete scheduled by an earlier pass runs after later passes committed: it takes older
    generations and older epochs' orphans only (it once deleted the newer generation)."""
    root = keys.cleaned_root_prefix("c", "t", "id", 0)

    def at(generation: int, epoch: int) -> ObjectInfo:
        prefix = keys.cleaned_pass_prefix("c", "t", "id", 0, generation, epoch)
        return ObjectInfo(keys.cleaned_object_key(prefix, 0), 10)

    listed = [at(0, 1), at(1, 1), at(2, 1), at(2, 0), at(3, 2)]
    doomed = stale_cleaned_keys(listed, root, Cleaned(50, 1, 1))
    assert doomed == [at(0, 1).key, at(2, 0).key]


def test_a_partition_with_no_segment_has_no_input() -> None:
    """An empty partition (a compacted topic nothing was written to yet): the cleaner logged a
    ValueError traceback for it every interval (seen in test_compaction_faults.py's logs)."""
    assert plain_inputs(PartitionState(), []) == []


def test_sizes_count_no_superseded_segment() -> None:
    """DescribeLogDirs' count from the state's recent segments leaves out those a pass
    superseded (the cleaned objects are counted from their listing instead)."""
    from kafscale.broker.metadata.partition_state import SegmentRef
    from kafscale.broker.storage.log_sizes import catch_up_from_state
    from kafscale.broker.storage.size_blocks import SizeBlocks

    refs = tuple(SegmentRef(base, base + 9, 0, 100, 0) for base in range(0, 50, 10))
    state = PartitionState(high_watermark=50, segments=refs, cleaned=Cleaned(30, 0, 0))
    blocks = SizeBlocks("p/", 0, listed_below=30)
    assert catch_up_from_state(blocks, state)
    assert blocks.total == 200  # the segments at 30 and 40
