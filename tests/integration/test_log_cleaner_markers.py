"""Transaction markers under the log cleaner, end to end: a broker process on moto S3 and etcd.

A transactional confluent-kafka producer (as Kafka Streams' or Quix's exactly-once changelogs
write) commits and aborts many small transactions to a compacted topic. As in Kafka 3.1+
(KIP-534), the first pass keeps every marker and gives those whose transaction has no record
left a delete horizon (pass time + ``delete.retention.ms``); a pass after the horizon removes
them: the stored bytes come down to about the keys' latest values, and read_committed and
read_uncommitted consumers from the beginning see exactly the records a cleaned log holds, after
either pass, through the broker and through the proxy. On the old main (before markers were
cleaned) every marker stays, so the marker and size checks fail there.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from harness import children
from harness.brokers import BrokerCluster
from harness.compaction_batches import (
    BATCH_READER_SOURCE,
    batch_reader_lines,
    read_with_kafka_python,
)
from harness.java_client import java_program
from harness.log_cleaner import (
    CLEANER_ENV,
    alter_topic,
    cleaned_up_to,
    create_compacted,
    eventually,
    in_transaction,
    log_dir_size,
    partition_state,
    poll_all,
    produce_rounds,
    txn_producer,
)
from harness.proxy import start_proxy

from kafscale.broker.protocol.batch_filter import iter_stored_batches
from kafscale.broker.storage.segments import decode_segment

pytestmark = pytest.mark.integration

KEYS = [b"k%d" % k for k in range(4)]
TRANSACTIONS = 40
DELETE_RETENTION_MS = 1500


def _stored_batches(cluster: BrokerCluster, topic: str) -> bytes:
    """The batches of the committed generation's cleaned objects, in offset order."""
    state = partition_state(cluster, topic)
    assert state.cleaned is not None
    prefix = f"{cluster.cluster}/topics/{topic}/"
    wanted = f"/0.cleaned/g{state.cleaned.generation:010d}-e{state.cleaned.epoch}/"
    client = cluster.s3.client()
    bodies = []
    for key in sorted(k for k in cluster.object_keys(prefix) if wanted in k):
        data = client.get_object(Bucket=cluster.bucket, Key=key)["Body"].read()
        bodies.append(bytes(decode_segment(data).body))
    return b"".join(bodies)


def test_markers_of_transactions_with_no_record_left_go_and_readers_see_the_same_records(
    broker_cluster: BrokerCluster, tmp_path: Path
) -> None:
    broker = broker_cluster.start(**CLEANER_ENV)
    topic = "txn-markers"
    create_compacted(
        broker.bootstrap,
        topic,
        **{"min.cleanable.dirty.ratio": "1.5", "delete.retention.ms": str(DELETE_RETENTION_MS)},
    )
    producer = txn_producer(broker.bootstrap, "changelog")
    for n in range(TRANSACTIONS):
        records = [(KEYS[(n + i) % len(KEYS)], b"txn %03d " % n * 40) for i in range(2)]
        in_transaction(producer, topic, records, commit=n % 5 != 3)  # every fifth one aborts
    time.sleep(DELETE_RETENTION_MS / 1000 + 0.5)  # every marker is older than the retention
    produce_rounds(broker.bootstrap, topic, [[(b"tail", b"last")]])  # the segment not cleaned
    committed_before = poll_all(broker.bootstrap, topic, "read_committed")
    tail_offset = committed_before[-1][0]
    assert committed_before[-1][1:] == (b"tail", b"last")
    written = {offset for offset, _, _ in poll_all(broker.bootstrap, topic, "read_uncommitted")}
    marker_offsets = sorted(set(range(tail_offset)) - written)  # one producer: the gaps
    assert len(marker_offsets) == TRANSACTIONS
    state = partition_state(broker_cluster, topic)
    assert len(state.aborted_txns) == TRANSACTIONS // 5
    before = eventually(lambda: log_dir_size(broker.bootstrap, topic), "a size")

    alter_topic(broker.bootstrap, topic, "min.cleanable.dirty.ratio", "0.01")
    first = cleaned_up_to(broker_cluster, topic, tail_offset)

    # Each key's latest committed value, at its offset; nothing aborted.
    latest = {key: (offset, key, value) for offset, key, value in committed_before[:-1]}
    expected = [*sorted(latest.values()), committed_before[-1]]
    assert poll_all(broker.bootstrap, topic, "read_committed") == expected
    assert poll_all(broker.bootstrap, topic, "read_uncommitted") == expected
    # The first pass keeps every marker; those of transactions with no record left get a delete
    # horizon. Each kept record's transaction ends at the first marker after it (one producer,
    # one transaction at a time).
    holding = {min(m for m in marker_offsets if m > offset) for offset, _, _ in expected[:-1]}
    stored = [b.header for b in iter_stored_batches(_stored_batches(broker_cluster, topic))]
    assert [h.base_offset for h in stored if h.is_control] == marker_offsets
    horizons = {h.base_offset: h.delete_horizon_ms for h in stored if h.is_control}
    assert {m for m, horizon in horizons.items() if horizon is not None} == (
        set(marker_offsets) - holding
    )

    # After the horizon, the next pass (new data makes one due) removes them.
    latest_horizon = max(h for h in horizons.values() if h is not None)
    time.sleep(max(0.0, latest_horizon / 1000 - time.time()) + 0.5)
    produce_rounds(broker.bootstrap, topic, [[(b"tail", b"again")]])
    cleaned = eventually(
        lambda: (
            (c := partition_state(broker_cluster, topic).cleaned)
            and c.generation > first.generation
            and c.upto > tail_offset
            and c
        ),
        "a pass after the horizon",
        timeout_s=90,
    )
    expected = [*expected, (tail_offset + 1, b"tail", b"again")]  # the newest: not cleaned
    assert poll_all(broker.bootstrap, topic, "read_committed") == expected
    assert poll_all(broker.bootstrap, topic, "read_uncommitted") == expected
    # Only the markers of the transactions that still hold a record stay.
    batches = read_with_kafka_python(_stored_batches(broker_cluster, topic))
    markers = [batch.base_offset for batch, _ in batches if batch.is_control_batch]
    assert markers == sorted(holding)
    # The aborted transactions' entries went with their records and markers.
    after_state = partition_state(broker_cluster, topic)
    assert not [t for t in after_state.aborted_txns if t.last_offset < cleaned.upto]
    # The stored bytes come down to the keys' latest values and a marker each at most.
    kept_bytes = sum(len(value or b"") + 150 for _, _, value in expected) + 100 * len(markers)
    after = eventually(
        lambda: (size := log_dir_size(broker.bootstrap, topic)) < kept_bytes + 200 and size,
        f"the reported size to come down to about {kept_bytes} bytes (from {before})",
    )
    assert 0 < after < before / 10, (before, after)

    # Kafka's own Java reader reads the cleaned batches as kafka-python does.
    path = tmp_path / "cleaned.batches"
    path.write_bytes(_stored_batches(broker_cluster, topic))
    out = children.run(
        [*java_program(BATCH_READER_SOURCE, "BatchReader"), str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == [
        f"file {path}",
        *batch_reader_lines(path.read_bytes(), "none"),
    ]

    # A read_committed consumer through the proxy sees the same.
    proxy = start_proxy(broker_cluster)
    assert poll_all(proxy.bootstrap, topic, "read_committed") == expected
