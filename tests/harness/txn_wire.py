"""Transactions over the wire, as a transaction coordinator and its producer would speak them:
transactional batches with a producer id and epoch, and WriteTxnMarkers to the partition owner.

For tests of the partition side that need no coordinator (the producer id is made up)."""

from __future__ import annotations

from harness.batches import make_batch
from harness.kafka_wire import PRODUCE, KafkaWire, produce_body, produce_partition

WRITE_TXN_MARKERS = 27
TRANSACTIONAL, CONTROL = 0x10, 0x20


def produce_transactional(
    wire: KafkaWire,
    topic: str,
    partition: int,
    values: list[bytes],
    *,
    producer_id: int,
    sequence: int,
    epoch: int = 0,
    transactional_id: str = "app-1",
) -> tuple[int, int]:
    """(error code, base offset) of one transactional batch."""
    batch = make_batch(
        0,
        values,
        attributes=TRANSACTIONAL,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
    )
    body = {**produce_body(topic, partition, batch), "transactional_id": transactional_id}
    return produce_partition(wire.request(PRODUCE, 9, body))


def write_marker(
    wire: KafkaWire,
    topic: str,
    partition: int,
    *,
    producer_id: int,
    commit: bool,
    epoch: int = 0,
    coordinator_epoch: int = 0,
    version: int = 1,
) -> int:
    """The error code of a WriteTxnMarkers entry for one partition."""
    body = {
        "markers": [
            {
                "producer_id": producer_id,
                "producer_epoch": epoch,
                "transaction_result": commit,
                "topics": [{"name": topic, "partition_indexes": [partition]}],
                "coordinator_epoch": coordinator_epoch,
            }
        ]
    }
    response = wire.request(WRITE_TXN_MARKERS, version, body)
    assert int(response.markers[0].producer_id) == producer_id
    return int(response.markers[0].topics[0].partitions[0].error_code)
