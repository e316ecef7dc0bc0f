"""The size in bytes of each partition this broker owns, and the "log dir" it lives in.

DescribeLogDirs asks every broker for its partitions' sizes. A partition's size is the bytes of
its committed segment objects that are still kept: the ones from the segment holding the log
start offset on (what ``retention.bytes`` weighs, and what Kafka's ``Log.size`` counts: whole
segments, the one holding the log start included). Index objects are not counted.

Nothing here lists the object store per request. Each partition keeps its sizes in
``SizeBlocks`` per ownership epoch, brought up to date from the partition state's
``recent_segments`` (the newest 32 committed segments, with their sizes): as long as those reach
back to where the count's certainty ends (or to the log start), no listing is needed at all, so
a new or short partition is never listed. Only a partition that committed more than 32 segments
since it was last asked (or the first time, when its oldest kept segment is older than its
recent ones) is listed, page by page, from where the count stopped; and a block of the front
is listed again when the log start moves into it (``size_blocks``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Collection
from pathlib import Path

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.partition_state import Cleaned, PartitionState
from kafscale.broker.storage.object_store import ObjectStore
from kafscale.broker.storage.partition_log import OwnedPartition
from kafscale.broker.storage.reader import committed_objects
from kafscale.broker.storage.size_blocks import BLOCK_SEGMENTS, SizeBlocks
from kafscale.broker.store_settings import StorageKind, StorageSettings

TopicPartition = tuple[str, int]
UNKNOWN = -1
PAGE = 1000  # keys per listing call (S3's page size)


def log_dir_name(settings: StorageSettings) -> str:
    """The name of the one "log dir" a broker reports: where its store keeps segments."""
    prefix = settings.prefix.strip("/")
    if settings.kind is StorageKind.S3:
        return f"s3://{settings.bucket}/{prefix}" if prefix else f"s3://{settings.bucket}"
    root = settings.local_dir.resolve()
    return str(root / prefix if prefix else root)


def volume_bytes(settings: StorageSettings) -> tuple[int, int]:
    """(total, usable) bytes of the volume under a local directory; (-1, -1) for S3, whose
    capacity is not a number it tells, or when the directory cannot be examined."""
    if settings.kind is not StorageKind.LOCAL:
        return UNKNOWN, UNKNOWN
    try:
        stats = os.statvfs(Path(log_dir_name(settings)))
    except OSError:
        return UNKNOWN, UNKNOWN
    return stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize


def catch_up_from_state(blocks: SizeBlocks, state: PartitionState) -> bool:
    """Bring ``blocks`` up to ``state`` from its recent segments alone, if they cover every
    kept segment not counted yet: True if done (nothing to list), False if a listing is
    needed. Segments are contiguous, so the recent ones cover the rest when the oldest of them
    starts at or below where the count's certainty ends, or at or below the log start (the
    segments before the one holding it are not counted)."""
    if blocks.listed_below >= state.high_watermark:
        return True
    upto = state.cleaned.upto if state.cleaned is not None else 0
    segments = [s for s in state.segments if s.base >= upto]  # below: superseded
    if not segments or segments[0].base > max(blocks.listed_below, plain_floor(state)):
        return False
    blocks.add((s.base, s.size) for s in segments)
    blocks.listed_below = state.high_watermark
    return True


def plain_floor(state: PartitionState) -> int:
    """Where the plain segments counted start: the log start, or for a compacted partition the
    cleaned range's end (below it the cleaned objects are counted instead)."""
    cleaned = state.cleaned.upto if state.cleaned is not None else 0
    return max(state.log_start_offset, cleaned)


async def committed_pages(
    store: ObjectStore, prefix: str, state: PartitionState, start: int, end: int | None
) -> AsyncIterator[list[tuple[int, int]]]:
    """``(base, size)`` of the committed segments from ``start`` (to before ``end``), a page of
    keys at a time: a long partition is never held as one listing."""
    after = keys.objects_from(prefix, start)
    while True:
        page = await store.list(prefix, start_after=after, limit=PAGE)
        yield [(base, info.size) for base, _, info in committed_objects(state, page)]
        if len(page) < PAGE:
            return
        after = page[-1].key
        parsed = keys.parse_object_name(after)
        if end is not None and parsed is not None and parsed[0] >= end:
            return


class LogSizes:
    """Per owned partition, its size blocks; asked by DescribeLogDirs."""

    def __init__(
        self, cluster: str, store: ObjectStore, block_segments: int = BLOCK_SEGMENTS
    ) -> None:
        self._cluster = cluster
        self._store = store
        self._block_segments = block_segments
        self._blocks: dict[TopicPartition, SizeBlocks] = {}
        # Per compacted partition, the bytes of its committed generation of cleaned objects.
        self._cleaned: dict[TopicPartition, tuple[tuple[Cleaned, int], int]] = {}
        self._counted_for: dict[TopicPartition, Cleaned | None] = {}  # the blocks' pass

    async def size_of(self, owned: OwnedPartition) -> int:
        """The partition's kept committed bytes (raises ObjectStoreError if a listing fails)."""
        state = owned.state  # as of one commit: a flush committing meanwhile is the next answer
        prefix = keys.partition_object_prefix(
            self._cluster, owned.topic, owned.topic_id, owned.partition
        )
        blocks = self._blocks.get(owned.tp)
        cleaned_bytes = await self._cleaned_bytes(owned, state)
        if (
            blocks is None
            or (blocks.prefix, blocks.epoch) != (prefix, owned.epoch)
            or self._counted_for.get(owned.tp) != state.cleaned
        ):
            # A pass superseded counted segments: count the plain ones above it afresh.
            blocks = SizeBlocks(prefix, owned.epoch, self._block_segments)
            blocks.listed_below = state.cleaned.upto if state.cleaned is not None else 0
        if not catch_up_from_state(blocks, state):
            async for page in self._listed(prefix, state, blocks.listed_below, None):
                blocks.add(page)
            blocks.listed_below = max(blocks.listed_below, state.high_watermark)
        wanted = blocks.trim(plain_floor(state))
        if wanted is not None:
            front: list[tuple[int, int]] = []
            async for page in self._listed(prefix, state, *wanted):
                front += page
            blocks.fill_first(front)
            blocks.trim(plain_floor(state))
        self._blocks[owned.tp] = blocks  # only once counted: a failed listing starts again
        self._counted_for[owned.tp] = state.cleaned
        return blocks.total + cleaned_bytes

    async def _cleaned_bytes(self, owned: OwnedPartition, state: PartitionState) -> int:
        """The bytes of the committed cleaned objects holding offsets at or above the log start
        (one listing of their prefix per pass and log start: retention of ``compact,delete``
        and DeleteRecords move it past cleaned objects, which the janitor then deletes)."""
        if state.cleaned is None:
            return 0
        counted_for = (state.cleaned, state.log_start_offset)
        known = self._cleaned.get(owned.tp)
        if known is not None and known[0] == counted_for:
            return known[1]
        prefix = keys.cleaned_pass_prefix(
            self._cluster,
            owned.topic,
            owned.topic_id,
            owned.partition,
            state.cleaned.generation,
            state.cleaned.epoch,
        )
        objects = sorted(
            (int(info.key[len(prefix) : -4]), info.size)
            for info in await self._store.list(prefix)
            if info.key.endswith(".kfs") and info.key[len(prefix) : -4].isdigit()
        )
        ends = [base for base, _ in objects[1:]] + [state.cleaned.upto]
        total = sum(
            size
            for (_, size), end in zip(objects, ends, strict=False)
            if end > state.log_start_offset
        )
        self._cleaned[owned.tp] = (counted_for, total)
        return total

    def _listed(
        self, prefix: str, state: PartitionState, start: int, end: int | None
    ) -> AsyncIterator[list[tuple[int, int]]]:
        return committed_pages(self._store, prefix, state, start, end)

    def keep_only(self, owned: Collection[TopicPartition]) -> None:
        """Forget the counts of partitions no longer owned here."""
        for tp in [tp for tp in self._blocks if tp not in owned]:
            del self._blocks[tp]
        for tp in [tp for tp in self._cleaned if tp not in owned]:
            del self._cleaned[tp]
        for tp in [tp for tp in self._counted_for if tp not in owned]:
            del self._counted_for[tp]
