"""bench/chaos_txn.py's read-back and check: what a ``read_committed`` (or ``read_uncommitted``)
consumer finds in the output topics, and the anomalies counted against the clients' journal (pure
functions, apart from the reading)."""

from __future__ import annotations

import itertools
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from _txn_clients import (
    ABORTED,
    CLIENT_CONF,
    COMMIT_FAILED,
    COMMITTED,
    IN_TOPIC,
    Txn,
    input_offset,
    new_input_consumer,
)
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

# --- reading back ---------------------------------------------------------------------------------


@dataclass
class Log:
    """What a consumer read: per partition, (offset, value) in offset order; partitions it could
    not read to the end in time."""

    records: dict[int, list[tuple[int, bytes]]] = field(default_factory=lambda: defaultdict(list))
    ends: dict[int, int] = field(default_factory=dict)
    stalled: dict[int, int] = field(default_factory=dict)  # partition -> position reached
    errors: Counter[str] = field(default_factory=Counter)  # "partition: error" -> times


def read_topic(
    bootstrap: str,
    topic: str,
    partitions: int,
    isolation: str,
    timeout_s: float,
    ends: dict[int, int] | None = None,
) -> Log:
    """Every record of ``topic`` from the start up to each partition's high watermark (taken
    first), with ``isolation`` (``read_committed`` or ``read_uncommitted``). A partition is done
    when the consumer's position reaches its high watermark (a read_committed position passes
    control and aborted batches too); one not done within ``timeout_s`` is ``stalled``. Pass
    the high watermarks as ``ends`` for read_committed: its consumer's own watermark query
    answers the last stable offset, which would take a stuck one for the end. The
    consumer's errors are counted (an offset reset, which would have skipped records, is one;
    the partition then stalls)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"chaos-txn-checker-{isolation}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            # an offset reset would jump to the end and pass records by unseen: report it
            "auto.offset.reset": "error",
            "log_level": 0,
            **CLIENT_CONF,
        }
    )
    log = Log()
    try:
        for p in range(partitions):
            log.ends[p] = consumer.get_watermark_offsets(TopicPartition(topic, p), 60)[1]
        log.ends.update(ends or {})
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        pending = {p for p, end in log.ends.items() if end > 0}
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.5):
                if message.error() is None:
                    log.records[message.partition()].append((message.offset(), message.value()))
                else:
                    log.errors[f"{message.partition()}: {message.error().name()}"] += 1
            positions = consumer.position([TopicPartition(topic, p) for p in pending])
            pending -= {tp.partition for tp in positions if tp.offset >= log.ends[tp.partition]}
        for tp in consumer.position([TopicPartition(topic, p) for p in pending]):
            log.stalled[tp.partition] = tp.offset
    finally:
        consumer.close()
    return log


def group_offsets(bootstrap: str, workers: int) -> dict[int, int]:
    """Each worker group's committed input offset (0 if none)."""
    offsets = {}
    for worker in range(workers):
        consumer = new_input_consumer(bootstrap, worker)
        try:
            (tp,) = consumer.committed([TopicPartition(IN_TOPIC, worker)], 60)
            offsets[worker] = max(tp.offset, 0)
        finally:
            consumer.close()
    return offsets


# --- the check (pure) ---------------------------------------------------------------------------


def locate(*logs: Log) -> dict[bytes, list[tuple[int, int]]]:
    found: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    for log in logs:
        for partition, records in log.records.items():
            for offset, value in records:
                found[value].append((partition, offset))
    return found


def check_txns(txns: list[Txn], found: dict[bytes, list[tuple[int, int]]]) -> dict[str, int]:
    """Counts of transactional anomalies in what a read_committed consumer saw."""
    counts: Counter[str] = Counter()
    written: set[bytes] = set()
    for txn in txns:
        visible = [value for _, value in txn.records if value in found]
        written.update(value for _, value in txn.records)
        counts["duplicated"] += sum(len(found[v]) > 1 for v in visible)
        counts["misplaced"] += sum(
            all(p != partition for p, _ in found.get(value, [(partition, 0)]))
            for partition, value in txn.records
        )
        counts.update(txn_anomalies(txn, len(visible)))
    counts["reordered"] += count_reordered(txns, found)
    counts["foreign"] += sum(1 for value in found if value not in written)
    return {name: counts[name] for name in ANOMALIES}


ANOMALIES = (
    "committed_missing",
    "committed_partial",
    "duplicated",
    "misplaced",
    "reordered",
    "aborted_visible",
    "commit_failed_visible",
    "indeterminate_partial",
    "foreign",
)


def txn_anomalies(txn: Txn, visible: int) -> Counter[str]:
    total = len(txn.records)
    anomalies: Counter[str] = Counter()
    if txn.outcome == COMMITTED and total:
        anomalies["committed_missing"] += visible == 0
        anomalies["committed_partial"] += 0 < visible < total
    elif txn.outcome == ABORTED:
        anomalies["aborted_visible"] += visible > 0
    elif txn.outcome == COMMIT_FAILED:
        anomalies["commit_failed_visible"] += visible > 0
    else:
        anomalies["indeterminate_partial"] += 0 < visible < total
    return anomalies


def count_reordered(txns: list[Txn], found: dict[bytes, list[tuple[int, int]]]) -> int:
    """Pairs of a producer's visible records in one partition whose offsets go backwards
    against send order (transactions in their order, records in theirs)."""
    sent: dict[tuple[str, int], list[int]] = defaultdict(list)
    for txn in sorted(txns, key=lambda t: (t.producer, t.number)):
        for partition, value in txn.records:
            places = [offset for p, offset in found.get(value, []) if p == partition]
            if places:
                sent[(txn.producer, partition)].append(min(places))
    return sum(
        sum(1 for a, b in itertools.pairwise(offsets) if b <= a) for offsets in sent.values()
    )


def check_ctp(log: Log, committed: dict[int, int]) -> int:
    """Workers whose visible outputs are not exactly one per input offset below the group's
    committed offset, in order (pure)."""
    return sum(
        [input_offset(value) for _, value in log.records.get(worker, [])] != list(range(end))
        for worker, end in committed.items()
    )
