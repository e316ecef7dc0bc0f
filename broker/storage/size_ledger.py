"""The committed segments' sizes of a partition, kept between retention checks.

``retention.bytes`` needs the size of the whole log, and listing the whole partition on every
check cost one LIST call per thousand objects per partition every 30 s: for a long-retained
topic of 4 MiB segments (25,000 segments per 100 GiB) that is ~0.8 calls a second per
partition, billed on S3. The ledger lists once per ownership epoch and then only from the
high watermark of its last listing on.

That listing finds every segment committed since: a segment is committed by the etcd commit
that follows its upload, so every segment below a high watermark read before a listing is in
that listing (S3's LIST is strongly consistent), and a committed segment never changes. Keys
sort by base offset, so ``objects_from(prefix, listed_below)`` starts where the last listing's
certainty ended.

Sizes are kept in ``SizeBlocks`` (as DescribeLogDirs keeps them): 16 bytes a segment only in
the first block and the one being filled, a few numbers for each block between, so a week of
100 ms segments costs ~130 KB instead of ~96 MB. ``retention.bytes`` cuts the log where the
bytes after the cut first fit: whole blocks are skipped by their totals, and only the block
the cut falls in needs its sizes; if it gave them up, ``bytes_start`` names its range, which
the janitor lists (one bounded listing) and hands back with ``fill``. ``trim`` asks the same
when the log start moves into such a block. The cut is the one ``decide_log_start`` makes from
every segment (the bytes after a cut only shrink as it moves on, so its answer is the first
segment from which they fit, whatever time retention cut before it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from kafscale.broker.storage.size_blocks import BLOCK_SEGMENTS, SizeBlocks


@dataclass(frozen=True, slots=True)
class ListRange:
    """Segments with a base in [start, end) must be listed and handed to ``fill`` first."""

    index: int  # the block
    start: int
    end: int | None  # None: to the end of the log


@dataclass(slots=True)
class SizeLedger:
    prefix: str  # the partition's object prefix: a topic deleted and created again is new
    epoch: int  # the ownership epoch it was listed in: another owner may have trimmed since
    block_segments: int = BLOCK_SEGMENTS
    blocks: SizeBlocks = field(init=False)

    def __post_init__(self) -> None:
        self.blocks = SizeBlocks(self.prefix, self.epoch, self.block_segments)

    @property
    def listed_below(self) -> int:
        """Every committed segment with a lower base offset is here."""
        return self.blocks.listed_below

    @property
    def first_base(self) -> int | None:
        """The base of the oldest segment kept (after ``trim``: the one holding the log
        start), None when none is."""
        return self.blocks.blocks[0].first_base if self.blocks.blocks else None

    def add(self, segments: Iterable[tuple[int, int]], high_watermark: int) -> None:
        """Record ``(base, size)`` of committed segments from a listing taken after the
        partition's high watermark was ``high_watermark``; ones known already are skipped."""
        self.blocks.add(segments)
        self.blocks.listed_below = max(self.blocks.listed_below, high_watermark)

    def trim(self, log_start_offset: int) -> ListRange | None:
        """Forget the segments wholly below the log start: they hold no readable record, count
        for no retention and are being deleted. The segment holding the log start stays. A
        range to list and ``fill`` before trimming again when the log start fell in a block
        that gave its sizes up; None when done."""
        wanted = self.blocks.trim(log_start_offset)
        return None if wanted is None else ListRange(0, *wanted)

    def fill(self, wanted: ListRange, segments: Iterable[tuple[int, int]]) -> None:
        """The segments listed for ``wanted`` (from ``trim`` or ``bytes_start``)."""
        self.blocks.fill_block(wanted.index, segments)

    def bytes_start(
        self, retention_bytes: int, high_watermark: int, log_start_offset: int
    ) -> int | ListRange:
        """Where ``retention.bytes`` starts the log: the base of the first segment from which
        the segments up to the end hold at most ``retention_bytes``, the high watermark when
        not even the last one fits, the log start as it is when no segment is known (never
        expire what was not seen); or the range to list and ``fill`` first."""
        if not self.blocks.blocks:
            return log_start_offset
        after = self.blocks.total  # bytes from the current segment on
        for index, block in enumerate(self.blocks.blocks):
            if after <= retention_bytes:
                return block.first_base
            if after - block.total >= retention_bytes:
                after -= block.total  # the cut lies beyond this block
                continue
            if block.bases is None or block.sizes is None:
                start, end = self.blocks.block_range(index)
                return ListRange(index, start, end)
            for base, size in zip(block.bases, block.sizes, strict=True):
                if after <= retention_bytes:
                    return base
                after -= size
        return high_watermark

    def segments(self) -> Iterator[tuple[int, int]]:
        """``(base, size)`` of the segments whose sizes are kept (for checks and tests)."""
        for block in self.blocks.blocks:
            if block.bases is not None and block.sizes is not None:
                yield from zip(block.bases, block.sizes, strict=True)

    def kept_segments(self) -> int:
        """How many segments' sizes are held one by one: what the ledger's memory grows with."""
        return sum(len(b.bases) for b in self.blocks.blocks if b.bases is not None)
