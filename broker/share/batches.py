"""What a share fetch learns from the batches it read (pure): the offsets they cover, the
offsets no member may be given (control records; aborted transactions when reading committed
data, which Kafka's share-partition leader archives itself), and the batches worth sending."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kafscale.broker.protocol.record_batch import iter_batch_headers
from kafscale.broker.share.partition import Acquired


def covered_last(data: bytes | memoryview) -> int | None:
    """The last offset of the last whole batch in ``data``, or None."""
    last = None
    for _, header in iter_batch_headers(data):
        last = header.last_offset
    return last


def batch_ends(data: bytes | memoryview) -> frozenset[int]:
    """The last offset of every whole batch in ``data``."""
    return frozenset(header.last_offset for _, header in iter_batch_headers(data))


def skipped(
    data: bytes | memoryview, aborted: Iterable[tuple[int, int]], read_committed: bool
) -> list[tuple[int, int]]:
    """Offset ranges never delivered: control batches, and with ``read_committed`` the
    transactional batches of an aborted transaction (``aborted``: (producer id, first offset)),
    from its first offset up to its abort marker."""
    starts = sorted(aborted, key=lambda a: a[1])
    active: set[int] = set()
    ranges: list[tuple[int, int]] = []
    index = 0
    for _, header in iter_batch_headers(data):
        while index < len(starts) and starts[index][1] <= header.base_offset:
            active.add(starts[index][0])
            index += 1
        if header.is_control:
            ranges.append((header.base_offset, header.last_offset))
            active.discard(header.producer_id)
        elif read_committed and header.is_transactional and header.producer_id in active:
            ranges.append((header.base_offset, header.last_offset))
    return ranges


def overlapping(data: bytes | memoryview, acquired: Sequence[Acquired]) -> bytes:
    """The whole batches of ``data`` holding at least one acquired offset."""
    view = memoryview(data)
    parts = [
        bytes(view[position : position + header.size])
        for position, header in iter_batch_headers(view)
        if any(a.first <= header.last_offset and header.base_offset <= a.last for a in acquired)
    ]
    return b"".join(parts)
