"""What a stock-client round trip produces and what must come back, checked the same way for
every client and path (a broker directly, the proxy).

``make_records`` builds keyed records with headers and explicit timestamps; ``check_round_trip``
asserts everything came back, in order per partition, at dense offsets from 0, unchanged;
``check_stored_batches`` reads the batches as the broker serves them and asserts the client's
codec (and a producer id for the idempotent producer).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from harness.kafka_wire import FETCH, KafkaWire, batches_in, fetch_body, fetch_partition

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
PARTITIONS = 3
RECORDS = 9  # three per partition
CONSUME_TIMEOUT_S = 30.0


# --- what is produced and what comes back ----------------------------------------------------


Headers = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class Record:
    partition: int
    key: bytes
    value: bytes
    headers: Headers
    timestamp: int | None  # None: the client sets the time (kcat cannot set one)


@dataclass(frozen=True)
class Consumed:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp: int


def make_records(tag: str, count: int = RECORDS, partitions: int = PARTITIONS) -> list[Record]:
    """Keyed records with two headers each, spread round-robin, timestamps an hour ago."""
    base_ms = int(time.time() * 1000) - 3_600_000
    return [
        Record(
            partition=i % partitions,
            key=f"key-{i}".encode(),
            # repetitive so that every codec really compresses
            value=(f"{tag}-value-{i}|" * 30).encode(),
            headers=(("trace", f"trace-{i}".encode()), ("source", tag.encode())),
            timestamp=base_ms + 1000 * i,
        )
        for i in range(count)
    ]


def check_round_trip(
    produced: list[Record],
    consumed: list[Consumed],
    acked: list[tuple[int, int]] | None,
    window_ms: tuple[int, int] | None = None,
) -> None:
    """Everything came back, in order per partition, at dense offsets from 0, unchanged.

    ``acked``: (partition, offset) the producer was given for each record, if it tells.
    ``window_ms``: wall-clock bounds for records the client timestamped itself.
    """
    assert len(consumed) == len(produced), f"{len(consumed)} consumed, {len(produced)} produced"
    for partition in sorted({r.partition for r in produced}):
        sent = [r for r in produced if r.partition == partition]
        got = sorted((c for c in consumed if c.partition == partition), key=lambda c: c.offset)
        assert [c.offset for c in got] == list(range(len(sent))), f"partition {partition}"
        for record, message in zip(sent, got, strict=True):
            assert message.key == record.key
            assert message.value == record.value
            assert message.headers == record.headers
            if record.timestamp is not None:
                assert message.timestamp == record.timestamp
            else:
                assert window_ms is not None
                assert window_ms[0] - 1000 <= message.timestamp <= window_ms[1] + 1000
    if acked is not None:
        expected = []
        next_offset: dict[int, int] = {}
        for record in produced:
            expected.append((record.partition, next_offset.get(record.partition, 0)))
            next_offset[record.partition] = expected[-1][1] + 1
        assert acked == expected


CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


class CodecNotUsed(AssertionError):
    """The client sent the batch with another codec than it was configured with."""


# librdkafka decides per broker whether it may compress, from the advertised ApiVersions:
# LZ4 needs FindCoordinator (any version) advertised; librdkafka 2.0 (Debian's kcat) also needs
# Produce v0 in the advertised range for gzip/snappy/lz4 (the broker serves Produce from v0,
# message format v0/v1 included, as Kafka 3.9 does). Without either, the client logs
# "Broker does not support compression type" and sends uncompressed batches, which
# check_stored_batches catches (CodecNotUsed).


def check_stored_batches(bootstrap: str, topic: str, codec: str, idempotent: bool = True) -> None:
    """The batches as the broker serves them: the client's codec, and a producer id when the
    idempotent producer was on (batches are stored as received, never re-encoded)."""
    with KafkaWire(bootstrap) as wire:
        for partition in range(PARTITIONS):
            response = wire.request(FETCH, 12, fetch_body(topic, partition, 0))
            batches = batches_in(fetch_partition(response).records)
            assert batches, f"partition {partition} is empty"
            for batch in batches:
                if batch.compression != CODEC_IDS[codec]:
                    raise CodecNotUsed(f"{codec} configured, batch stored as {batch}")
                if idempotent:
                    assert batch.producer_id >= 0 and batch.base_sequence >= 0, batch
