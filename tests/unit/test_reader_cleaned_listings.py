"""The reader's listings of cleaned objects (log compaction) stay bounded over a broker's life:
it keeps those of the compacted partitions it read most recently, not of every partition and
generation it ever served (the old main kept one per partition for good)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from harness.batches import make_batch
from harness.stores import CountingStore

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.partition_state import Cleaned, PartitionState
from kafscale.broker.protocol.record_batch import iter_batch_headers
from kafscale.broker.storage import reader as reader_module
from kafscale.broker.storage.cache import SegmentCache
from kafscale.broker.storage.reader import LogReader
from kafscale.broker.storage.segments import encode_range_segment

pytestmark = pytest.mark.unit

CLUSTER, TOPIC, TOPIC_ID = "c", "t", "id"
PARTITIONS, KEPT = 24, 4


async def put_generation(store: CountingStore, partition: int, generation: int) -> PartitionState:
    """One cleaned object holding offsets [0, 10) of ``partition`` (offset 9 kept)."""
    prefix = keys.cleaned_pass_prefix(CLUSTER, TOPIC, TOPIC_ID, partition, generation, 0)
    batch = make_batch(9, [b"g%d" % generation], keys=[b"k"])
    encoded = encode_range_segment(batch, 0, 9, 1_700_000_000_000, 4096)
    await store.put(keys.cleaned_object_key(prefix, 0), encoded.segment)
    return PartitionState(
        high_watermark=10, leader_epoch=0, epochs=((0, 0),), cleaned=Cleaned(10, generation, 0)
    )


async def first_offset(reader: LogReader, partition: int, state: PartitionState) -> int:
    data = await reader.read(TOPIC, TOPIC_ID, partition, state, 0, 1 << 20)
    return next(iter_batch_headers(data))[1].base_offset


def test_cleaned_listings_are_bounded_and_the_recently_read_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fails on the old main: after reading 24 compacted partitions (each over two
    generations) the reader held 24 listings, one per partition ever read."""
    monkeypatch.setattr(reader_module, "MAX_CLEANED_LISTINGS", KEPT)

    async def run() -> None:
        store = CountingStore(tmp_path)
        reader = LogReader(CLUSTER, store, SegmentCache(0))
        try:
            states = {}
            for generation in range(2):
                for partition in range(PARTITIONS):
                    states[partition] = await put_generation(store, partition, generation)
                    assert await first_offset(reader, partition, states[partition]) == 9
                    assert reader.cleaned_listings <= KEPT
            assert reader.cleaned_listings == KEPT
            # The most recently read partitions are served from their kept listing ...
            listed = store.lists
            for partition in range(PARTITIONS - KEPT, PARTITIONS):
                assert await first_offset(reader, partition, states[partition]) == 9
            assert store.lists == listed
            # ... an evicted one is listed again, and read right.
            assert await first_offset(reader, 0, states[0]) == 9
            assert store.lists > listed
            assert reader.cleaned_listings == KEPT
        finally:
            await reader.close()
            await store.close()

    asyncio.run(run())
