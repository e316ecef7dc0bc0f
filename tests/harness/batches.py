"""Build real Kafka v2 record batches for tests, with a correct CRC32C.

Laid out by the broker's own encoder (``kafscale.broker.protocol.batch_encoder``), with
timestamps in exact milliseconds and attributes (compression bits, transactional flags) set
freely; ``tests/unit/test_segments.py`` checks the result parses with kio's own batch reader.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from kafscale.broker.protocol.batch_encoder import Header, encode_batch, encode_record

__all__ = ["Header", "make_batch", "with_base_offset"]


def make_batch(
    base_offset: int,
    values: Sequence[bytes | None],
    *,
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Header] = (),
    timestamp_ms: int = 1_700_000_000_000,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = 0,
    attributes: int = 0,
) -> bytes:
    """A v2 record batch of ``len(values)`` uncompressed records at ``base_offset``.

    Record i has offset ``base_offset + i`` and timestamp ``timestamp_ms + i``; every record
    carries ``headers``. ``attributes`` is written as given (the records are not compressed).
    """
    if not values:
        raise ValueError("a record batch needs at least one record")
    keys = keys if keys is not None else [None] * len(values)
    records = b"".join(
        encode_record(i, i, key, value, headers)
        for i, (key, value) in enumerate(zip(keys, values, strict=True))
    )
    return encode_batch(
        records,
        len(values),
        base_timestamp=timestamp_ms,
        max_timestamp=timestamp_ms + len(values) - 1,
        attributes=attributes,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
    )


def with_base_offset(batch: bytes, base_offset: int) -> bytes:
    """The same batch moved to ``base_offset`` (outside the CRC, as a broker assigns it)."""
    return struct.pack(">q", base_offset) + batch[8:]
