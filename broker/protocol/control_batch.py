"""Control batches: the commit and abort markers a partition's owner writes for a transaction.

A control batch is a v2 record batch with the transactional and control attribute bits, the
producer's id and epoch, no sequence, and one record whose key is (version 0, type: 0 abort,
1 commit) and whose value is (version 0, coordinator epoch), as Kafka's ``EndTransactionMarker``
writes it. Clients recognise it by the control bit and skip it; ``read_committed`` consumers use
an abort marker to stop dropping the producer's records.
"""

from __future__ import annotations

import struct

import crc32c

from kafscale.broker.protocol.record_batch import HEADER_SIZE, InvalidBatch, read_header

ABORT = 0
COMMIT = 1
CONTROL_ATTRIBUTES = 0x10 | 0x20  # transactional | control, uncompressed, CreateTime
_MARKER_KEY = struct.Struct(">hh")  # version, type
_MARKER_VALUE = struct.Struct(">hi")  # version, coordinator epoch
_AFTER_CRC = struct.Struct(">hiqqqhii")
_BEFORE_CRC = struct.Struct(">qiibI")
_CRC_START = 21


def _varint(value: int) -> bytes:
    """Kafka's zig-zag signed varint."""
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while zigzag & ~0x7F:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def _marker_record(commit: bool, coordinator_epoch: int) -> bytes:
    key = _MARKER_KEY.pack(0, COMMIT if commit else ABORT)
    value = _MARKER_VALUE.pack(0, coordinator_epoch)
    body = b"".join(
        [
            b"\x00",  # record attributes
            _varint(0),  # timestamp delta
            _varint(0),  # offset delta
            _varint(len(key)),
            key,
            _varint(len(value)),
            value,
            _varint(0),  # headers
        ]
    )
    return _varint(len(body)) + body


def encode_marker(
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    timestamp_ms: int,
    partition_leader_epoch: int = -1,
) -> bytes:
    """A one-record control batch at base offset 0 (the append assigns the real one)."""
    after_crc = _AFTER_CRC.pack(
        CONTROL_ATTRIBUTES,
        0,  # last offset delta
        timestamp_ms,
        timestamp_ms,
        producer_id,
        producer_epoch,
        -1,  # base sequence: markers carry none
        1,  # record count
    ) + _marker_record(commit, coordinator_epoch)
    batch_length = 4 + 1 + 4 + len(after_crc)
    head = _BEFORE_CRC.pack(0, batch_length, partition_leader_epoch, 2, crc32c.crc32c(after_crc))
    return head + after_crc


def marker_type(batch: bytes | memoryview) -> int:
    """ABORT or COMMIT of a control batch's marker record (InvalidBatch if it is none)."""
    header = read_header(batch)
    if not header.is_control or header.compression != 0:
        raise InvalidBatch("not an uncompressed control batch")
    record = bytes(batch[HEADER_SIZE : header.size])
    # length, attributes, timestamp delta, offset delta, key length: single bytes here
    key_length = record[4] >> 1
    if key_length < _MARKER_KEY.size or len(record) < 5 + key_length:
        raise InvalidBatch("control record without a marker key")
    _version, kind = _MARKER_KEY.unpack_from(record, 5)
    return int(kind)
