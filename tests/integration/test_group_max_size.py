"""Group size limits with real clients against a broker process started with
``groups.max_size=2`` (Kafka's ``group.max.size``) and ``groups.consumer_max_size=2``
(``group.consumer.max.size``):

* classic groups, kafka-python and librdkafka: a third consumer's JoinGroup is refused with
  GROUP_MAX_SIZE_REACHED (kafka-python raises GroupMaxSizeReachedError from ``poll``,
  librdkafka reports the error), while the first two keep their partitions and keep consuming;
* consumer-protocol groups (KIP-848), librdkafka with ``group.protocol=consumer``: the same;
* a classic group of three formed on a broker without a limit, whose coordinator then stops:
  the broker that loads it (limit 2) rebalances it, one member is turned away
  (GroupMaxSizeReachedError) and the other two carry on with every partition;
* DescribeConfigs reports both limits under Kafka's names.

Each test waits for conditions with generous deadlines (the machine is shared), never on time.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource
from harness.brokers import BrokerCluster, BrokerProcess, new_cluster
from harness.groups import GROUP_ENV, QUIET, Feed, KafkaPythonMember, create_topic, wait_for
from harness.kafka_wire import KafkaWire
from harness.s3 import S3Endpoint
from kafka import KafkaConsumer
from kafka.errors import GroupMaxSizeReachedError

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = pytest.mark.integration

PARTITIONS = 4
LIMITED_ENV = {
    "KAFSCALE_GROUPS__MAX_SIZE": "2",
    "KAFSCALE_GROUPS__CONSUMER_MAX_SIZE": "2",
    "KAFSCALE_GROUPS__INITIAL_REBALANCE_DELAY_MS": "200",
    "KAFSCALE_GROUPS__MIN_SESSION_TIMEOUT_MS": "1000",
    "KAFSCALE_GROUPS__CONSUMER_HEARTBEAT_INTERVAL_MS": "500",
    "KAFSCALE_GROUPS__CONSUMER_SESSION_TIMEOUT_MS": "6000",
}
FULL_TEXT = "Consumer group has reached maximum size"
"""librdkafka's text for GROUP_MAX_SIZE_REACHED (``rd_kafka_err2str``)."""


@pytest.fixture(scope="module")
def limited_broker(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    """One broker whose groups take two members at most, shared by the module's tests (each
    uses its own topic and group)."""
    cluster = new_cluster(
        etcd_server.client_url, s3_server, tmp_path_factory.mktemp("max-size"), "maxsize"
    )
    try:
        yield cluster.start(**LIMITED_ENV)
    finally:
        cluster.stop_all()


class ConfluentConsumer(threading.Thread):
    """A librdkafka consumer on its own thread that keeps the errors it is told about (the
    group's harness members skip them) next to the values it read."""

    def __init__(self, name: str, bootstrap: str, topic: str, group: str, protocol: str) -> None:
        super().__init__(name=name, daemon=True)
        self.errors: list[KafkaError] = []
        """From ``poll`` and from the error callback (where a fatal error arrives)."""
        self.config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "group.protocol": protocol,
            "auto.offset.reset": "earliest",
            "log_level": QUIET,
            "error_cb": self.errors.append,
        }
        if protocol == "classic":
            self.config.update({"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
        self.topic = topic
        self.values: list[int] = []
        self.assignment: frozenset[int] = frozenset()
        self.crashed: BaseException | None = None
        self._halt = threading.Event()
        self.start()

    def run(self) -> None:
        try:
            consumer = Consumer(self.config)
            consumer.subscribe([self.topic])
            try:
                while not self._halt.is_set():
                    message = consumer.poll(0.1)
                    self.assignment = frozenset(tp.partition for tp in consumer.assignment())
                    if message is None:
                        continue
                    if message.error() is not None:
                        self.errors.append(message.error())
                        continue
                    self.values.append(int(message.value()))
            finally:
                consumer.close()
        except BaseException as exc:
            self.crashed = exc
            raise

    def refused(self) -> bool:
        """GROUP_MAX_SIZE_REACHED reported: as such (a JoinGroup's), or as the fatal error
        librdkafka raises for a ConsumerGroupHeartbeat's, whose text names it."""
        for error in self.errors:
            if error.code() == KafkaError.GROUP_MAX_SIZE_REACHED:
                return True
            if error.code() == KafkaError._FATAL and FULL_TEXT in error.str():
                return True
        return False

    def state(self) -> str:
        errors = [(e.code(), e.str(), e.fatal()) for e in self.errors]
        return f"errors {errors}, assignment {sorted(self.assignment)}, read {len(self.values)}"

    def stop(self) -> None:
        self._halt.set()
        self.join(30)
        assert not self.is_alive(), f"{self.name} did not stop"


class RefusableMember(KafkaPythonMember):
    """A kafka-python member that notes GROUP_MAX_SIZE_REACHED (raised from ``poll``, fatal)
    and ends, instead of crashing its thread."""

    refused: bool = False

    def consume(self) -> None:
        try:
            super().consume()
        except GroupMaxSizeReachedError:
            self.refused = True


def group_members(bootstrap: str, group: str) -> int:
    """The group's member count from DescribeGroups (the classic API) at its coordinator."""
    with KafkaWire(bootstrap) as wire:
        found = wire.request(10, 3, {"key": group, "key_type": 0})
    with KafkaWire(f"{found.host}:{found.port}") as wire:
        return len(wire.request(15, 5, {"groups": [group]}).groups[0].members)


def consumer_group_members(bootstrap: str, group: str) -> int:
    """The member count ConsumerGroupDescribe (KIP-848) reports (one broker: the coordinator)."""
    with KafkaWire(bootstrap) as wire:
        request = {"group_ids": [group], "include_authorized_operations": False}
        (described,) = wire.request(69, 1, request).groups
    return len(described.members)


def keep_reading(feed: Feed, readers: dict[str, Any], count: int) -> None:
    """``count`` more records produced; every one of them is read by one of ``readers``
    (name: a callable giving the values it read so far)."""
    start = feed.sent
    feed.produce(count)
    wanted = set(range(start, feed.sent))

    def all_read() -> bool:
        seen: set[int] = set()
        for values in readers.values():
            seen.update(values())
        return wanted <= seen

    wait_for(all_read, 90, f"records {start}..{feed.sent - 1} read by the two members")


def test_a_third_classic_consumer_is_refused_and_the_two_members_keep_consuming(
    limited_broker: BrokerProcess,
) -> None:
    bootstrap = limited_broker.bootstrap
    topic, group = "max-size-classic", "max-size-classic-group"
    create_topic(bootstrap, topic, PARTITIONS)
    feed = Feed(bootstrap, topic)
    feed.produce(20)
    members = [KafkaPythonMember(f"kp-{n}", bootstrap, group, topic) for n in range(2)]
    for member in members:
        member.start()
    try:

        def both_hold_partitions() -> bool:
            assignments = [m.assignment for m in members]
            return all(assignments) and len(frozenset().union(*assignments)) == PARTITIONS

        wait_for(both_hold_partitions, 120, "two kafka-python members sharing the partitions")
        assert group_members(bootstrap, group) == 2

        # kafka-python: the refusal is fatal, raised from poll.
        third = KafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
        )
        third.subscribe([topic])
        try:
            with pytest.raises(GroupMaxSizeReachedError):
                for _ in range(600):  # each poll waits up to 100 ms
                    assert not third.poll(timeout_ms=100), "the third consumer read records"
        finally:
            third.close()

        # librdkafka (classic): the error is reported to the application.
        fourth = ConfluentConsumer("rdk-3", bootstrap, topic, group, "classic")
        try:
            wait_for(fourth.refused, 120, "GROUP_MAX_SIZE_REACHED for librdkafka", fourth.state)
            assert not fourth.values and not fourth.assignment
        finally:
            fourth.stop()

        assert group_members(bootstrap, group) == 2
        assert all(m.assignment for m in members)
        readers = {m.name_: m.values for m in members}
        keep_reading(feed, readers, 40)
        assert all(m.crashed is None for m in members)
    finally:
        for member in members:
            member.stop()


def test_a_third_consumer_protocol_member_is_refused_and_the_two_keep_consuming(
    limited_broker: BrokerProcess,
) -> None:
    bootstrap = limited_broker.bootstrap
    topic, group = "max-size-kip848", "max-size-kip848-group"
    create_topic(bootstrap, topic, PARTITIONS)
    feed = Feed(bootstrap, topic)
    feed.produce(20)
    members = [ConfluentConsumer(f"rdk-{n}", bootstrap, topic, group, "consumer") for n in range(2)]
    try:

        def both_hold_partitions() -> bool:
            assignments = [m.assignment for m in members]
            return all(assignments) and len(frozenset().union(*assignments)) == PARTITIONS

        wait_for(both_hold_partitions, 120, "two consumer-protocol members sharing the partitions")
        assert consumer_group_members(bootstrap, group) == 2

        third = ConfluentConsumer("rdk-third", bootstrap, topic, group, "consumer")
        try:
            wait_for(third.refused, 120, "GROUP_MAX_SIZE_REACHED for the third", third.state)
            assert not third.values and not third.assignment
        finally:
            third.stop()

        assert consumer_group_members(bootstrap, group) == 2
        readers = {m.name: (lambda m=m: m.values) for m in members}
        keep_reading(feed, readers, 40)
        assert all(m.crashed is None for m in members)
    finally:
        for member in members:
            member.stop()


def test_describe_configs_reports_the_limits_under_kafkas_names(
    limited_broker: BrokerProcess,
) -> None:
    admin = AdminClient({"bootstrap.servers": limited_broker.bootstrap})
    node_id = str(limited_broker.status()["node_id"])
    resource = ConfigResource(ConfigResource.Type.BROKER, node_id)
    configs = admin.describe_configs([resource])[resource].result(60)
    for name in ("group.max.size", "group.consumer.max.size"):
        assert configs[name].value == "2"
        assert configs[name].source == ConfigSource.STATIC_BROKER_CONFIG.value


def coordinated_by(broker: BrokerProcess, label: str) -> str:
    """A group id whose coordinator (FindCoordinator's pick among the live brokers) is
    ``broker``."""
    for n in range(200):
        group = f"{label}-{n}"
        with KafkaWire(broker.bootstrap) as wire:
            found = wire.request(10, 3, {"key": group, "key_type": 0})
        if int(found.node_id) == broker.node_id:
            return group
    raise AssertionError(f"no group id of 200 is coordinated by broker {broker.node_id}")


def test_a_group_over_the_limit_of_its_new_coordinator_sheds_a_member_at_the_rebalance(
    broker_cluster: BrokerCluster,
) -> None:
    unlimited = broker_cluster.start(**GROUP_ENV)
    limited = broker_cluster.start(**LIMITED_ENV)
    bootstrap = f"{unlimited.bootstrap},{limited.bootstrap}"
    topic = "over-limit"
    group = coordinated_by(unlimited, "over-limit-group")
    create_topic(bootstrap, topic, PARTITIONS)
    feed = Feed(bootstrap, topic)
    feed.produce(20)
    members = [RefusableMember(f"kp-{n}", bootstrap, group, topic) for n in range(3)]
    for member in members:
        member.start()
    try:

        def hold_partitions(candidates: list[RefusableMember]) -> bool:
            assignments = [m.assignment for m in candidates]
            return all(assignments) and len(frozenset().union(*assignments)) == PARTITIONS

        wait_for(lambda: hold_partitions(members), 120, "three members sharing the partitions")
        assert group_members(unlimited.bootstrap, group) == 3
        unlimited.stop()  # SIGTERM: the group's lease goes, the limited broker loads the group

        def one_refused() -> bool:
            return sum(m.refused for m in members) == 1

        wait_for(one_refused, 120, "one member turned away by the new coordinator")
        kept = [m for m in members if not m.refused]
        wait_for(lambda: hold_partitions(kept), 120, "the two others sharing every partition")
        assert group_members(limited.bootstrap, group) == 2
        keep_reading(feed, {m.name_: m.values for m in kept}, 40)
        assert all(m.crashed is None for m in members)
    finally:
        for member in members:
            if member.is_alive():
                member.stop()
