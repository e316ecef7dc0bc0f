"""A partition's kept bytes in blocks: exact for committed data, in memory that stays small.

``SizeLedger`` keeps 16 bytes per segment, which a long-retained partition of small segments
(a week of 100 ms flushes: six million segments) turns into ~96 MB. The size DescribeLogDirs
reports needs per-segment sizes only where the log start can fall: at the front. So segments
are kept in blocks of ``BLOCK_SEGMENTS``: each block keeps its first base offset, count and
total; only the first block (where trimming happens) and the last one (being filled) keep every
segment's base and size. When trimming reaches into a block that gave its sizes up, the caller
lists that block's range again (``trim`` says which) and hands the sizes back (``fill_first``):
one bounded listing per ``BLOCK_SEGMENTS`` segments the log start passes.

Pure: no I/O. Segments arrive in base-offset order; the log start only grows.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field

BLOCK_SEGMENTS = 4096


def _int64s() -> array[int]:
    return array("q")


@dataclass(slots=True)
class _Block:
    first_base: int
    count: int = 0
    total: int = 0
    bases: array[int] | None = field(default_factory=_int64s)  # None: sizes given up
    sizes: array[int] | None = field(default_factory=_int64s)


@dataclass(slots=True)
class SizeBlocks:
    prefix: str  # the partition's object prefix: a topic deleted and created again is new
    epoch: int  # the ownership epoch it was built in
    block_segments: int = BLOCK_SEGMENTS
    listed_below: int = 0  # every committed segment with a lower base offset is counted
    blocks: list[_Block] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(block.total for block in self.blocks)

    @property
    def last_base(self) -> int:
        block = self.blocks[-1] if self.blocks else None
        if block is None:
            return -1
        assert block.bases is not None  # the last block always keeps its sizes
        return block.bases[-1]

    def add(self, segments: Iterable[tuple[int, int]]) -> None:
        """Count ``(base, size)`` of committed segments; ones counted already are skipped.
        (Raise ``listed_below`` once a listing or state covered everything below a mark.)"""
        for base, size in sorted(segments):
            if base >= self.listed_below and base > self.last_base:
                self._append(base, size)

    def _append(self, base: int, size: int) -> None:
        block = self.blocks[-1] if self.blocks else None
        if block is None or block.count >= self.block_segments:
            if block is not None and len(self.blocks) > 1:
                block.bases = block.sizes = None  # full, and not the first: totals suffice
            block = _Block(base)
            self.blocks.append(block)
        assert block.bases is not None and block.sizes is not None
        block.bases.append(base)
        block.sizes.append(size)
        block.count += 1
        block.total += size

    def trim(self, log_start_offset: int) -> tuple[int, int] | None:
        """Forget the segments wholly below the log start (the one holding it stays). None when
        done; else the base range [start, end) whose segments must be listed and given to
        ``fill_first`` before trimming again (the first block gave its sizes up)."""
        while len(self.blocks) > 1 and self.blocks[1].first_base <= log_start_offset:
            del self.blocks[0]
        if not self.blocks or self.blocks[0].first_base >= log_start_offset:
            return None
        first = self.blocks[0]
        if first.bases is None or first.sizes is None:
            return first.first_base, self.blocks[1].first_base
        keep = 0
        while keep + 1 < len(first.bases) and first.bases[keep + 1] <= log_start_offset:
            keep += 1
        if keep:
            first.count -= keep
            first.total -= sum(first.sizes[:keep])
            del first.bases[:keep]
            del first.sizes[:keep]
            first.first_base = first.bases[0]
        return None

    def fill_first(self, segments: Iterable[tuple[int, int]]) -> None:
        """The first block's segments as listed (``trim``'s range): its sizes, exact again."""
        self.fill_block(0, segments)

    def block_range(self, index: int) -> tuple[int, int | None]:
        """The base range [start, end) of block ``index`` (end None: the last block)."""
        end = self.blocks[index + 1].first_base if index + 1 < len(self.blocks) else None
        return self.blocks[index].first_base, end

    def fill_block(self, index: int, segments: Iterable[tuple[int, int]]) -> None:
        """Block ``index``'s segments as listed (its ``block_range``): its sizes, exact again.
        A block none of whose segments is stored any more goes."""
        block = self.blocks[index]
        start, end = self.block_range(index)
        chosen = sorted(
            (base, size) for base, size in segments if base >= start and (end is None or base < end)
        )
        if not chosen:  # nothing of it is stored any more: nothing to count
            del self.blocks[index]
            return
        block.bases = array("q", [base for base, _ in chosen])
        block.sizes = array("q", [size for _, size in chosen])
        block.first_base = chosen[0][0]
        block.count = len(chosen)
        block.total = sum(size for _, size in chosen)
