"""Control batches: the commit and abort markers a partition's owner writes for a transaction.

A control batch is a v2 record batch with the transactional and control attribute bits, the
producer's id and epoch, no sequence, and one record whose key is (version 0, type: 0 abort,
1 commit) and whose value is (version 0, coordinator epoch), as Kafka's ``EndTransactionMarker``
writes it. Clients recognise it by the control bit and skip it; ``read_committed`` consumers use
an abort marker to stop dropping the producer's records.
"""

from __future__ import annotations

import struct

from kafscale.broker.protocol.batch_encoder import encode_batch, encode_record
from kafscale.broker.protocol.record_batch import (
    HEADER_SIZE,
    InvalidBatch,
    read_header,
    read_varint,
)

ABORT = 0
COMMIT = 1
CONTROL_ATTRIBUTES = 0x10 | 0x20  # transactional | control, uncompressed, CreateTime
_MARKER_KEY = struct.Struct(">hh")  # version, type
_MARKER_VALUE = struct.Struct(">hi")  # version, coordinator epoch


def encode_marker(
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    timestamp_ms: int,
    partition_leader_epoch: int = -1,
) -> bytes:
    """A one-record control batch at base offset 0 (the append assigns the real one), laid
    out by the broker's one batch encoder: no sequence (markers carry none)."""
    key = _MARKER_KEY.pack(0, COMMIT if commit else ABORT)
    value = _MARKER_VALUE.pack(0, coordinator_epoch)
    return encode_batch(
        encode_record(0, 0, key, value),
        1,
        base_timestamp=timestamp_ms,
        max_timestamp=timestamp_ms,
        attributes=CONTROL_ATTRIBUTES,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        partition_leader_epoch=partition_leader_epoch,
    )


def marker_type(batch: bytes | memoryview) -> int:
    """ABORT or COMMIT of a control batch's marker record (InvalidBatch if it is none)."""
    header = read_header(batch)
    if not header.is_control or header.compression != 0:
        raise InvalidBatch("not an uncompressed control batch")
    record = bytes(batch[HEADER_SIZE : header.size])
    # length, attributes, timestamp delta, offset delta, key length: varints, not single
    # bytes (a marker the cleaner gave a delete horizon has a long timestamp delta)
    try:
        _, at = read_varint(record, 0)
        _, at = read_varint(record, at + 1)
        _, at = read_varint(record, at)
        key_length, at = read_varint(record, at)
    except IndexError as exc:
        raise InvalidBatch("control record without a marker key") from exc
    if key_length < _MARKER_KEY.size or len(record) < at + key_length:
        raise InvalidBatch("control record without a marker key")
    _version, kind = _MARKER_KEY.unpack_from(record, at)
    return int(kind)
