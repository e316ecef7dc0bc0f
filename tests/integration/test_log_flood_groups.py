"""Group and transaction churn does not flood the broker's log (``groups/change_log``,
``transactions/coordinator``, ``observability/log_limit``).

A group state change (a rebalance, a group gone Empty) and a transaction's end each wrote an
INFO line, one per client action: a client that joins and leaves in a loop, or a producer that
commits or aborts transactions as fast as it can, wrote one line each time. Now a group's or a
transactional id's lines are limited like the other lines a client causes: the first ten per
minute of each group or id, then one summary with the count; another group's lines are still
written, and a committed transaction (a producer's routine, hundreds a second) goes to DEBUG.
A real broker process; a group churned through JoinGroup, SyncGroup and LeaveGroup on the wire
(what a crash-looping consumer does), and confluent-kafka's transactional producer.
"""

from __future__ import annotations

import re
import time
import uuid

from confluent_kafka import Producer
from harness.brokers import BrokerCluster
from harness.kafka_wire import KafkaWire
from harness.topics import create_topics

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.protocol.errors import ErrorCode

JOIN_GROUP, SYNC_GROUP, LEAVE_GROUP = 11, 14, 13
CYCLES = 30
DEADLINE_S = 60.0
LINES_PER_WINDOW = 10
SUMMARY = re.compile(r"suppressed ([\d,]+) similar messages within 60 s: (.+) \(last from (.+)\)")


def windows_spanned(seconds: float) -> int:
    return int(seconds // 60) + 1


def log_lines(broker: BrokerProcess) -> list[str]:
    return broker.log_path.read_text(errors="replace").splitlines()


def summaries(lines: list[str], kind: str, last_from: str) -> list[int]:
    found = (SUMMARY.search(line) for line in lines)
    return [
        int(m[1].replace(",", ""))
        for m in found
        if m is not None and m[2] == kind and m[3] == last_from
    ]


def join_sync_leave(wire: KafkaWire, group: str) -> None:
    """One member's whole life in ``group``: the group rebalances to Stable, then goes Empty."""
    joined = wire.request(
        JOIN_GROUP,
        3,
        {
            "group_id": group,
            "session_timeout": 10_000,
            "rebalance_timeout": 10_000,
            "member_id": "",
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}],
        },
    )
    assert int(joined.error_code) == ErrorCode.NONE
    member = joined.member_id
    synced = wire.request(
        SYNC_GROUP,
        3,
        {
            "group_id": group,
            "generation_id": joined.generation_id,
            "member_id": member,
            "group_instance_id": None,
            "assignments": [{"member_id": member, "assignment": b""}],
        },
    )
    assert int(synced.error_code) == ErrorCode.NONE
    left = wire.request(LEAVE_GROUP, 2, {"group_id": group, "member_id": member})
    assert int(left.error_code) == ErrorCode.NONE


def test_a_group_churned_in_a_loop_is_logged_ten_times_then_counted(
    broker_cluster: BrokerCluster,
) -> None:
    broker = broker_cluster.start(KAFSCALE_GROUPS__INITIAL_REBALANCE_DELAY_MS="0")
    churned, quiet = f"churn-{uuid.uuid4().hex[:6]}", f"quiet-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    with KafkaWire(broker.bootstrap) as wire:
        for _ in range(CYCLES):
            join_sync_leave(wire, churned)
        join_sync_leave(wire, quiet)
    most = LINES_PER_WINDOW * windows_spanned(time.monotonic() - started)

    def about(group: str, lines: list[str]) -> list[str]:
        return [line for line in lines if f"group {group}: generation" in line]

    # Each cycle is a Stable and an Empty generation: 60 changes of one group.
    churned_lines = about(churned, log_lines(broker))
    assert LINES_PER_WINDOW <= len(churned_lines) <= most, churned_lines
    # Another group's lines are its own: both written (the Empty one once etcd took it).
    deadline = time.monotonic() + DEADLINE_S
    while len(about(quiet, log_lines(broker))) < 2:
        assert time.monotonic() < deadline, about(quiet, log_lines(broker))
        time.sleep(0.2)

    assert broker.stop() == 0  # the window ends with the process: its summary is written
    lines = log_lines(broker)
    counted = summaries(lines, "group state change", f"group {churned}")
    assert counted, lines[-10:]
    # Every change is in the log once: written, or counted. (Its first load is a line of the
    # same window only when the group existed before: it did not, that line is DEBUG.)
    assert len(about(churned, lines)) + sum(counted) == 2 * CYCLES


def test_a_producer_committing_and_aborting_in_a_loop_does_not_flood_the_log(
    broker_cluster: BrokerCluster,
) -> None:
    broker = broker_cluster.start()
    topic, txn_id = f"txn-{uuid.uuid4().hex[:6]}", f"looping-{uuid.uuid4().hex[:6]}"
    create_topics(broker.bootstrap, [topic], 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": txn_id})
    started = time.monotonic()
    producer.init_transactions(60)
    for index in range(CYCLES):
        producer.begin_transaction()
        producer.produce(topic, b"%d" % index)
        if index % 2:
            assert producer.flush(60) == 0  # sent: the abort has a partition to write to
            producer.abort_transaction(60)
        else:
            producer.commit_transaction(60)
    most = LINES_PER_WINDOW * windows_spanned(time.monotonic() - started)
    lines = log_lines(broker)
    assert not [line for line in lines if f"transaction {txn_id} " in line and "committed" in line]
    aborted = [line for line in lines if f"transaction {txn_id} " in line and "aborted" in line]
    assert LINES_PER_WINDOW // 2 <= len(aborted) <= most, aborted
    assert any(f"transactional id {txn_id}: producer id" in line for line in lines)
    assert producer.flush(30) == 0
