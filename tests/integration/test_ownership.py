"""Several broker processes share partitions: balanced ownership, fenced handoffs."""

from __future__ import annotations

import time

import pytest
from harness import children
from harness.brokers import BrokerCluster, BrokerProcess
from harness.children import settings_free_env
from harness.etcd import harness_etcd
from harness.kafka_wire import KafkaWire, produce_body, produce_partition
from harness.topics import create_topic

PRODUCE = 0


def produce_to(wire: KafkaWire, topic: str, partition: int, batch: bytes) -> tuple[int, int]:
    """(error code, base offset) of an acks=all produce sent straight to this broker."""
    return produce_partition(wire.request(PRODUCE, 9, produce_body(topic, partition, batch)))


pytestmark = pytest.mark.integration


def owned_counts(brokers: list[BrokerProcess]) -> dict[int, int]:
    return {b.node_id: len(b.status()["owned"]) for b in brokers}


def wait_for(condition, timeout_s: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"condition not met in {timeout_s}s (last: {last})")


def test_ownership_balances_across_three_brokers(broker_cluster: BrokerCluster) -> None:
    brokers = [broker_cluster.start() for _ in range(3)]
    create_topic(brokers[0].bootstrap, "spread", 9)

    def balanced() -> dict[int, int] | None:
        counts = owned_counts(brokers)
        return counts if sorted(counts.values()) == [3, 3, 3] else None

    wait_for(balanced)


def read_all(bootstrap: str, topic: str, partition: int) -> list[tuple[int, bytes]]:
    """(offset, value) of every record the partition holds, acked or not: read up to the high
    watermark its owner answers with once every produce was answered, so a record beyond what
    was acked shows (rather than polling a quiet second longer after the acked ones)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False}
    )
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
        consumer.assign([TopicPartition(topic, partition, 0)])
        records: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 60
        while (records[-1][0] if records else -1) < high - 1:
            assert time.monotonic() < deadline, f"read {len(records)} of {high} records"
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                records.append((message.offset(), message.value()))
    finally:
        consumer.close()
    return records


def test_two_brokers_never_assign_the_same_offset(broker_cluster: BrokerCluster) -> None:
    """Produces for one partition sent to both brokers at once: only the owner acks."""
    from concurrent.futures import ThreadPoolExecutor

    from harness.batches import make_batch

    brokers = [broker_cluster.start() for _ in range(2)]
    create_topic(brokers[0].bootstrap, "contended", 1)
    connections = [KafkaWire(b.bootstrap) for b in brokers]

    def send_all(which: int) -> list[tuple[int, int, bytes]]:
        results = []
        for i in range(100):
            value = b"broker%d-record%d" % (which, i)
            outcome = produce_to(connections[which], "contended", 0, make_batch(0, [value]))
            results.append((*outcome, value))
        return results

    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = [o for result in pool.map(send_all, range(2)) for o in result]
    for connection in connections:
        connection.close()
    acked = {offset: value for code, offset, value in outcomes if code == 0}
    assert len(acked) == sum(1 for code, _, _ in outcomes if code == 0), "an offset acked twice"
    assert acked, "nothing was acked"
    assert {code for code, _, _ in outcomes} <= {0, 6}  # NONE or NOT_LEADER_OR_FOLLOWER
    stored = dict(read_all(brokers[0].bootstrap, "contended", 0))
    assert sorted(stored) == list(range(len(stored))), "offsets are not dense"
    mismatched = {o: (v, stored.get(o)) for o, v in acked.items() if stored.get(o) != v}
    assert not mismatched, f"acked records differ from what is stored: {mismatched}"


def test_frozen_owner_acks_nothing_after_its_lease_expires(broker_cluster: BrokerCluster) -> None:
    """SIGSTOP the owner past its TTL with a produce buffered; after SIGCONT it must not ack."""
    import signal

    from harness.batches import make_batch

    slow_flush = {
        "KAFSCALE_LOG__FLUSH_INTERVAL_MS": "8000",
        "KAFSCALE_LOG__FLUSH_MIN_INTERVAL_MS": "8000",  # one round per 8 s
    }
    first = broker_cluster.start(**slow_flush)
    create_topic(first.bootstrap, "fenced", 1)
    owner_connection = KafkaWire(first.bootstrap, timeout_s=60)
    code, _ = produce_to(owner_connection, "fenced", 0, make_batch(0, [b"before"]))
    assert code == 0

    # A produce the owner buffers (its next round is ~8 s after the last one), then the owner
    # freezes; a second broker starts meanwhile (starting it first left the 8 s to chance on a
    # busy machine).
    owner_connection.send(PRODUCE, 9, produce_body("fenced", 0, make_batch(0, [b"frozen"])))
    time.sleep(0.2)
    first.signal(signal.SIGSTOP)
    try:
        second = broker_cluster.start()
        new_owner = KafkaWire(second.bootstrap)

        def taken_over() -> bool:
            code, _ = produce_to(new_owner, "fenced", 0, make_batch(0, [b"after"]))
            if code != 0:
                time.sleep(0.3)
            return code == 0

        wait_for(taken_over, timeout_s=30)
        for i in range(5):
            code, _ = produce_to(new_owner, "fenced", 0, make_batch(0, [b"more%d" % i]))
            assert code == 0
    finally:
        first.signal(signal.SIGCONT)
    code, _ = produce_partition(owner_connection.recv(PRODUCE, 9)[1])
    assert code != 0, f"a fenced broker acknowledged a write:\n{first.tail()}"
    owner_connection.close()
    new_owner.close()
    values = [v for _, v in read_all(second.bootstrap, "fenced", 0)]
    assert values == [b"before", b"after", b"more0", b"more1", b"more2", b"more3", b"more4"]


class BackgroundProducer:
    """An idempotent confluent-kafka producer sending numbered values until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        import threading

        from confluent_kafka import Producer

        self.topic = topic
        self.acked: list[bytes] = []
        self.errors: list[str] = []
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 60000,
            }
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _on_delivery(self, err, msg) -> None:  # type: ignore[no-untyped-def]
        if err is None:
            self.acked.append(msg.value())
        else:
            self.errors.append(str(err))

    def _run(self) -> None:
        sequence = 0
        while not self._stop.is_set():
            self._producer.produce(
                self.topic, value=b"%08d" % sequence, on_delivery=self._on_delivery
            )
            sequence += 1
            self._producer.poll(0.002)
        self._producer.flush(60)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(90)


def consume_values(bootstrap: str, topic: str, partitions: int) -> list[bytes]:
    """Every value the topic holds: each partition read up to its high watermark, taken once
    the producer got every answer (a quiet 1.5 s after the acked count was waited before)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "check", "enable.auto.commit": False}
    )
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(partitions)
        }
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        values: list[bytes] = []
        read_to = dict.fromkeys(ends, -1)
        deadline = time.monotonic() + 60
        while any(read_to[p] < end - 1 for p, end in ends.items()):
            assert time.monotonic() < deadline, f"read up to {read_to}, not {ends}"
            message = consumer.poll(0.3)
            if message is not None and message.error() is None:
                partition, offset = message.partition(), message.offset()
                assert partition is not None and offset is not None
                values.append(message.value())
                read_to[partition] = offset
    finally:
        consumer.close()
    return values


def wait_for_acks(producer: BackgroundProducer, more: int = 100) -> None:
    """Until ``more`` records more were acked: traffic under each step, however slow the
    machine (a fixed second before)."""
    before = len(producer.acked)
    wait_for(lambda: len(producer.acked) >= before + more or producer.errors, timeout_s=60)


def test_scale_out_and_in_under_load_loses_nothing(broker_cluster: BrokerCluster) -> None:
    first = broker_cluster.start()
    create_topic(first.bootstrap, "load", 6)
    producer = BackgroundProducer(first.bootstrap, "load")
    wait_for_acks(producer)
    brokers = [first, broker_cluster.start(), broker_cluster.start()]

    def balanced() -> dict[int, int] | None:
        counts = owned_counts(brokers)
        return counts if sorted(counts.values()) == [2, 2, 2] else None

    wait_for(balanced)
    wait_for_acks(producer)
    brokers[1].stop()  # SIGTERM: graceful handoff
    brokers[2].stop()
    wait_for(lambda: len(first.status()["owned"]) == 6)
    wait_for_acks(producer)
    producer.stop()
    assert producer.acked, producer.errors[:5]
    assert not producer.errors, producer.errors[:5]
    values = consume_values(first.bootstrap, "load", 6)
    assert len(values) == len(set(values)), "an acked record was stored twice"
    assert set(producer.acked) <= set(values), "an acked record was lost"


def test_sigterm_hands_partitions_over_and_sigkill_within_ttl(
    broker_cluster: BrokerCluster,
) -> None:
    from harness.batches import make_batch

    brokers = [broker_cluster.start() for _ in range(2)]
    create_topic(brokers[0].bootstrap, "handoff", 4)
    wait_for(lambda: sorted(owned_counts(brokers).values()) == [2, 2])
    survivor, leaving = brokers
    moved = leaving.status()["owned"]
    leaving.stop()
    connection = KafkaWire(survivor.bootstrap)

    def all_accept() -> bool:
        for name in moved:
            topic, partition = name.rsplit("-", 1)
            code, _ = produce_to(connection, topic, int(partition), make_batch(0, [b"x"]))
            if code != 0:
                return False
        return True

    wait_for(all_accept, timeout_s=10)
    third = broker_cluster.start()
    wait_for(lambda: sorted(owned_counts([survivor, third]).values()) == [2, 2])
    moved = third.status()["owned"]
    third.kill()
    wait_for(all_accept, timeout_s=15)  # crash: within the session TTL (4 s here) and slack
    connection.close()


def test_draining_mark_and_drain_endpoint_hand_partitions_over(
    broker_cluster: BrokerCluster, etcd_server: object
) -> None:
    import asyncio

    from kafscale.broker.metadata import keys

    brokers = [broker_cluster.start() for _ in range(2)]
    create_topic(brokers[0].bootstrap, "drained", 4)
    wait_for(lambda: sorted(owned_counts(brokers).values()) == [2, 2])
    marked, other = brokers

    async def set_mark(present: bool) -> None:
        etcd = await harness_etcd(broker_cluster.etcd_url)
        key = keys.draining_key(broker_cluster.cluster, marked.node_id)
        if present:
            await etcd.put(key, b'{"reason":"test"}')
        else:
            await etcd.delete(key)
        await etcd.close()

    asyncio.run(set_mark(True))
    wait_for(lambda: owned_counts(brokers) == {marked.node_id: 0, other.node_id: 4})
    assert marked.process is not None and marked.process.poll() is None  # still running
    asyncio.run(set_mark(False))
    wait_for(lambda: sorted(owned_counts(brokers).values()) == [2, 2])
    # The preStop hook's own command: returns once the broker has handed everything over.

    from kafscale.broker.child_process import KAFSCALE

    drained = children.run(
        [KAFSCALE, "drain", "--admin-url", other.admin_url],
        env=settings_free_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert drained.returncode == 0, drained.stderr
    assert "drained" in drained.stdout
    assert other.status()["owned"] == []
    wait_for(lambda: len(marked.status()["owned"]) == 4)


def test_offset_for_leader_epoch_answers_from_the_epoch_history(
    broker_cluster: BrokerCluster,
) -> None:
    """After a handoff the old epoch ends where the new one starts, as truncation checks expect."""
    from harness.batches import make_batch

    first, second = broker_cluster.start(), broker_cluster.start()
    create_topic(first.bootstrap, "epochs", 1)
    wait_for(lambda: (first.status()["owned"] or second.status()["owned"]) == ["epochs-0"])
    owner = first if first.status()["owned"] == ["epochs-0"] else second
    other = second if owner is first else first
    with KafkaWire(owner.bootstrap) as wire:
        for i in range(5):
            assert produce_to(wire, "epochs", 0, make_batch(0, [b"a%d" % i]))[0] == 0
    assert owner.http("POST", "/drain", timeout_s=30)[0] == 200
    wait_for(lambda: other.status()["owned"] == ["epochs-0"])
    with KafkaWire(other.bootstrap) as wire:
        for i in range(3):
            assert produce_to(wire, "epochs", 0, make_batch(0, [b"b%d" % i]))[0] == 0

        def end_of(epoch: int) -> tuple[int, int]:
            body = {
                "replica_id": -1,
                "topics": [
                    {
                        "topic": "epochs",
                        "partitions": [
                            {"partition": 0, "current_leader_epoch": -1, "leader_epoch": epoch}
                        ],
                    }
                ],
            }
            result = wire.request(23, 4, body).topics[0].partitions[0]
            assert int(result.error_code) == 0
            return int(result.leader_epoch), int(result.end_offset)

        assert end_of(0) == (0, 5)  # the first owner's epoch ended where the second began
        assert end_of(1) == (1, 8)  # the current epoch ends at the high watermark
        assert end_of(7) == (1, 8)  # a future epoch: the largest known one


METADATA = 3
NOT_LEADER_OR_FOLLOWER = 6
UNKNOWN_TOPIC_OR_PARTITION = 3


def etcd_call(broker_cluster: BrokerCluster, call):  # type: ignore[no-untyped-def]
    """Run ``call(etcd)`` against the cluster's etcd and return what it returns."""
    import asyncio

    async def run():  # type: ignore[no-untyped-def]
        etcd = await harness_etcd(broker_cluster.etcd_url)
        try:
            return await call(etcd)
        finally:
            await etcd.close()

    return asyncio.run(run())


def metadata_leaders(bootstrap: str, topic: str, brokers: int = 3) -> dict[int, int] | None:
    """Partition -> leader id from one broker's Metadata, once it lists ``brokers`` brokers
    and the topic's six partitions."""
    from harness.kafka_wire import metadata_body

    with KafkaWire(bootstrap) as wire:
        response = wire.request(METADATA, 9, metadata_body([topic]))
    partitions = response.topics[0].partitions
    if len(response.brokers) != brokers or len(partitions) != 6:
        return None
    return {int(p.partition_index): int(p.leader_id) for p in partitions}


def assigned(broker_cluster: BrokerCluster, topic: str) -> dict[int, int] | None:
    """Partition -> broker of ``topic`` in the stored assignment, once it has all six."""
    from kafscale.broker.metadata import keys
    from kafscale.broker.metadata.assignment import Assignment

    key = keys.assignment_key(broker_cluster.cluster)
    kv = etcd_call(broker_cluster, lambda etcd: etcd.get(key))
    owners = Assignment.from_json(kv.value).owners if kv is not None else {}
    of_topic = {p: b for (t, p), b in owners.items() if t == topic}
    return of_topic if len(of_topic) == 6 else None


def produce_through(
    by_id: dict[int, BrokerProcess], topic: str, leaders: dict[int, int]
) -> dict[int, int]:
    """Partition -> error code of one record produced to each partition through the broker
    ``leaders`` names, after waiting out UNKNOWN_TOPIC_OR_PARTITION (a new topic not yet seen)."""
    from harness.batches import make_batch

    codes = {}
    for partition, leader in leaders.items():
        with KafkaWire(by_id[leader].bootstrap) as wire:
            batch = make_batch(0, [b"%d" % partition])
            code = UNKNOWN_TOPIC_OR_PARTITION
            deadline = time.monotonic() + 60
            while code == UNKNOWN_TOPIC_OR_PARTITION and time.monotonic() < deadline:
                code, _ = produce_to(wire, topic, partition, batch)
        codes[partition] = code
    return codes


def test_a_new_topics_partitions_stay_with_the_brokers_that_claimed_them(
    broker_cluster: BrokerCluster,
) -> None:
    """Produce to a new topic before the assignment exists, then let the assigner write it:
    it names the brokers that claimed the partitions on demand, so nothing is handed off and
    no produce meets NOT_LEADER_OR_FOLLOWER (it did on every topic creation)."""
    from kafscale.broker.metadata.rebalancer import assigner_key

    brokers = [broker_cluster.start() for _ in range(3)]
    by_id = {b.node_id: b for b in brokers}
    role = assigner_key(broker_cluster.cluster)
    # Hold the assigner role for the test (no broker writes the assignment meanwhile), so the
    # produces below surely come before the assignment, as they do in the race this is about.
    etcd_call(broker_cluster, lambda etcd: etcd.put(role, b"test"))
    create_topic(brokers[0].bootstrap, "fresh", 6)
    leaders = wait_for(lambda: metadata_leaders(brokers[0].bootstrap, "fresh"), timeout_s=60)

    assert produce_through(by_id, "fresh", leaders) == dict.fromkeys(leaders, 0)
    claimed = lease_holders(broker_cluster, "fresh")
    assert claimed == leaders

    etcd_call(broker_cluster, lambda etcd: etcd.delete(role))  # brokers campaign and write it

    assert wait_for(lambda: assigned(broker_cluster, "fresh"), timeout_s=60) == claimed
    assert produce_through(by_id, "fresh", leaders) == dict.fromkeys(leaders, 0)
    assert lease_holders(broker_cluster, "fresh") == claimed


def test_a_departed_brokers_partitions_stay_with_the_brokers_that_claimed_them(
    broker_cluster: BrokerCluster,
) -> None:
    """A broker leaves; until the assignment is rewritten, Metadata names a stable pick among
    the others as the leader of each of its partitions, and that broker claims it at the first
    produce. The new assignment names those same brokers: each partition moves once, not twice
    (to the claimer, then on to a broker the assignment dealt it to round-robin)."""
    from kafscale.broker.metadata.leaders import stable_pick
    from kafscale.broker.metadata.rebalancer import assigner_key

    brokers = [broker_cluster.start() for _ in range(3)]
    by_id = {b.node_id: b for b in brokers}
    create_topic(brokers[0].bootstrap, "orphans", 6)
    before = wait_for(lambda: assigned(broker_cluster, "orphans"), timeout_s=60)
    wait_for(lambda: lease_holders(broker_cluster, "orphans") == before, timeout_s=60)

    # The leaver: one whose two partitions Metadata will send to two different brokers (so
    # both can stay where they are claimed), the lower one to the higher-numbered survivor
    # (where dealing in sorted order, the old rule, would not have put it).
    def meanwhile(leaver: int) -> dict[int, int]:
        remaining = sorted(b for b in by_id if b != leaver)
        mine = sorted(p for p, b in before.items() if b == leaver)
        return {p: stable_pick(("orphans", p), remaining) for p in mine}

    def telling(leaver: int) -> bool:
        picks = meanwhile(leaver)
        highest = max(b for b in by_id if b != leaver)
        return len(picks) == len(set(picks.values())) == 2 and picks[min(picks)] == highest

    leaver = next(b for b in sorted(by_id) if telling(b))
    expected = meanwhile(leaver)
    survivors = [b for b in brokers if b.node_id != leaver]

    # Hold the assigner role (nobody rewrites the assignment) while the broker leaves and
    # clients produce to what Metadata names, as they do in the window this is about.
    role = assigner_key(broker_cluster.cluster)
    etcd_call(broker_cluster, lambda etcd: etcd.put(role, b"test"))
    assert by_id[leaver].stop() == 0  # SIGTERM: flush, release, deregister
    leaders = wait_for(
        lambda: metadata_leaders(survivors[0].bootstrap, "orphans", brokers=2), timeout_s=60
    )
    assert {p: leaders[p] for p in expected} == expected

    def claim_all() -> bool:
        codes = produce_through(by_id, "orphans", leaders)
        assert set(codes.values()) <= {0, NOT_LEADER_OR_FOLLOWER}, codes
        return set(codes.values()) == {0}  # a survivor may not have seen the release yet

    wait_for(claim_all, timeout_s=60)
    claimed = lease_holders(broker_cluster, "orphans")
    assert {p: claimed[p] for p in expected} == expected

    etcd_call(broker_cluster, lambda etcd: etcd.delete(role))  # survivors write it now

    def reassigned() -> dict[int, int] | None:
        owners = assigned(broker_cluster, "orphans")
        return owners if owners and leaver not in owners.values() else None

    after = wait_for(reassigned, timeout_s=60)
    assert after == claimed  # the claimers keep them: no second handoff
    assert produce_through(by_id, "orphans", leaders) == dict.fromkeys(leaders, 0)
    assert lease_holders(broker_cluster, "orphans") == claimed


def lease_holders(broker_cluster: BrokerCluster, topic: str) -> dict[int, int]:
    """Partition -> the broker holding its lease, for every held partition lease of ``topic``."""
    from kafscale.broker.metadata import keys

    prefix = keys.partition_leases_prefix(broker_cluster.cluster, topic)
    entries = etcd_call(broker_cluster, lambda etcd: etcd.get_prefix(prefix))
    return {int(entry.key.rsplit("/", 1)[1]): int(entry.value) for entry in entries}
