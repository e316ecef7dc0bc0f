"""A group whose record in etcd does not decode fails alone (``groups/store``, ``coordinator``).

etcd is written by hand sometimes (a restore, an ``etcdctl put`` gone wrong, a tool of another
version): a group's metadata key may hold garbage bytes, or JSON of another shape. What a user
relies on, checked here with a real etcd, a real broker process and real clients:

- offset retention goes on: the good groups' expired offsets are removed, the corrupt group is
  reported (a limited WARNING naming its key, ``kafscale_group_records_unreadable_total``), its
  keys are left as they are for an operator, and its lease is not held for ever;
- requests about it get an error code for that group only (UNKNOWN_SERVER_ERROR: a client would
  retry a retriable code for ever), and requests naming good groups with it answer those; the
  connection stays open;
- DeleteGroups (``kafka-consumer-groups.sh --delete``, an admin client) removes it whole: every
  key under its prefix and its lease; the good groups keep theirs, and the group id then works
  from scratch, under the normal DeleteGroups rules again.

Before, the retention check that met the record failed as a whole ("offset retention check
failed" with a traceback) and the broker kept the corrupt group's lease for its whole session;
DescribeGroups, OffsetFetch and ListGroups failed for every group they named or listed; and
DeleteGroups answered UNKNOWN_SERVER_ERROR for the corrupt group, leaving ``etcdctl`` the only
way to remove it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from harness.brokers import BrokerCluster, metric_value, new_cluster
from harness.etcd import harness_etcd
from harness.groups import wait_for
from harness.kafka_wire import API_VERSIONS, KafkaWire
from harness.s3 import S3Endpoint
from harness.share import produce
from harness.topics import create_topics
from kafka import KafkaAdminClient, KafkaConsumer, OffsetAndMetadata, TopicPartition
from kafka.errors import UnknownError

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration

FIND_COORDINATOR, JOIN_GROUP, OFFSET_FETCH, DESCRIBE_GROUPS, LIST_GROUPS = 10, 11, 9, 15, 16
RETENTION_ENV = {
    "KAFSCALE_GROUPS__OFFSETS_RETENTION_MINUTES": "0.07",  # 4.2 s
    "KAFSCALE_GROUPS__OFFSETS_RETENTION_CHECK_INTERVAL_MS": "300",
}
DEADLINE_S = 90.0
GARBAGE = {
    "bytes": b"\xff\xfe\x00 not json",
    "shape": b'{"generation": "seven", "members": "nobody"}',
}
UNREADABLE = "kafscale_group_records_unreadable_total"


@pytest.fixture
def cluster(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerCluster]:
    cluster = new_cluster(
        etcd_server.client_url,
        s3_server,
        tmp_path_factory.mktemp("unreadable"),
        "unreadable",
        extra_env=RETENTION_ENV,
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop_all()


def standalone_commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    """``assign()`` + commit with kafka-python: offsets that expire one retention after."""
    member = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, 0)
        member.assign([tp])
        member.commit({tp: OffsetAndMetadata(offset, "", -1)})
    finally:
        member.close()


def corrupt(cluster: BrokerCluster, group: str, value: bytes, topic: str) -> None:
    """A group as a broken restore leaves it: a committed offset that reads, and a metadata
    record that does not."""

    async def write() -> None:
        etcd = await harness_etcd(cluster.etcd_url)
        try:
            offset = b'{"offset":1,"leader_epoch":-1,"metadata":"","commit_timestamp_ms":1}'
            await etcd.put(keys.group_offset_key(cluster.cluster, group, topic, 0), offset)
            await etcd.put(keys.group_metadata_key(cluster.cluster, group), value)
        finally:
            await etcd.close()

    asyncio.run(write())


def stored(cluster: BrokerCluster, group: str) -> list[str]:
    prefix = keys.group_prefix(cluster.cluster, group)
    return cluster.etcd_keys(prefix[len(keys.cluster_prefix(cluster.cluster)) :])


def lease_held(cluster: BrokerCluster, group: str) -> bool:
    lease = keys.group_lease_key(cluster.cluster, group)
    return bool(cluster.etcd_keys(lease[len(keys.cluster_prefix(cluster.cluster)) :]))


def reported(broker: BrokerProcess, group: str) -> list[str]:
    lines = broker.log_path.read_text(errors="replace").splitlines()
    return [line for line in lines if f"group {group} is not served" in line]


def names(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:6]}"


def test_retention_goes_on_past_a_corrupt_group_and_lets_its_lease_go(
    cluster: BrokerCluster,
) -> None:
    """Corrupt groups sort first (the check meets them before the good ones); the broker that
    coordinated the good groups is replaced, so the new one takes every group on through the
    retention check (adoption): the good groups expire, the corrupt ones are reported, keep
    their keys and hold no lease."""
    topic = names("t")
    create_topics(cluster.bootstrap, [topic], 1)
    bad = {kind: names(f"a-bad-{kind}") for kind in GARBAGE}
    good = [names("b-good"), names("c-good")]
    for group in good:
        standalone_commit(cluster.bootstrap, group, topic, 1)
    for kind, group in bad.items():
        corrupt(cluster, group, GARBAGE[kind], topic)
    old = cluster.brokers[-1]
    old.stop()
    broker = cluster.start(port=old.port)

    for group in good:
        wait_until_deadline(lambda g=group: not stored(cluster, g), f"good group {group} to expire")
    # Every check took the corrupt groups on before the good ones: their leases are given
    # back (a later check takes them on again, and gives them back again).
    for group in bad.values():
        wait_until_deadline(lambda g=group: not lease_held(cluster, g), f"{group}'s lease to go")
        wait_until_deadline(lambda g=group: bool(reported(broker, g)), f"{group} to be reported")
        assert len(stored(cluster, group)) == 2  # left for an operator to repair
    assert metric_value(broker, UNREADABLE) >= len(bad)
    line = reported(broker, bad["bytes"])[0]
    assert "WARNING" in line and keys.group_metadata_key(cluster.cluster, bad["bytes"]) in line
    log = broker.log_path.read_text(errors="replace")
    assert "offset retention check failed" not in log
    assert "Traceback" not in log


def test_requests_about_a_corrupt_group_get_its_error_and_the_others_their_answers(
    broker_cluster: BrokerCluster,
) -> None:
    """(Kafka's default retention here: the good group keeps its offset throughout.)"""
    cluster = broker_cluster
    broker = cluster.start()
    topic = names("t")
    create_topics(broker.bootstrap, [topic], 1)
    good, bad = names("good"), names("bad")
    standalone_commit(broker.bootstrap, good, topic, 2)
    corrupt(cluster, bad, GARBAGE["bytes"], topic)
    unknown = ErrorCode.UNKNOWN_SERVER_ERROR

    with KafkaWire(broker.bootstrap) as wire:
        found = wire.request(FIND_COORDINATOR, 1, {"key": bad, "key_type": 0})
        assert int(found.error_code) == ErrorCode.NONE  # where to ask: that is known
        join = {
            "group_id": bad,
            "session_timeout": 10_000,
            "rebalance_timeout": 10_000,
            "member_id": "",
            "group_instance_id": None,
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}],
        }
        assert int(wire.request(JOIN_GROUP, 5, join).error_code) == unknown
        fetched = wire.request(
            OFFSET_FETCH, 8, {"groups": [{"group_id": g, "topics": None} for g in (bad, good)]}
        )
        codes = {g.group_id: int(g.error_code) for g in fetched.groups}
        assert codes == {bad: unknown, good: ErrorCode.NONE}
        offsets = [
            p.committed_offset for g in fetched.groups for t in g.topics for p in t.partitions
        ]
        assert offsets == [2]  # the good group's
        described = wire.request(
            DESCRIBE_GROUPS, 5, {"groups": [bad, good], "include_authorized_operations": False}
        )
        codes = {g.group_id: int(g.error_code) for g in described.groups}
        assert codes == {bad: unknown, good: ErrorCode.NONE}
        listed = wire.request(LIST_GROUPS, 4, {"states_filter": []})
        assert int(listed.error_code) == ErrorCode.NONE
        listed_ids = {g.group_id for g in listed.groups}
        assert good in listed_ids and bad not in listed_ids
        assert int(wire.request(API_VERSIONS, 3, {}).error_code) == ErrorCode.NONE  # still open

    wait_until_deadline(lambda: not lease_held(cluster, bad), f"{bad}'s lease to go")
    assert reported(broker, bad)
    assert metric_value(broker, UNREADABLE) >= 4  # join, fetch, describe, list


def etcd_revision(cluster: BrokerCluster) -> int:
    async def read() -> int:
        etcd = await harness_etcd(cluster.etcd_url)
        try:
            return await etcd.revision()
        finally:
            await etcd.close()

    return asyncio.run(read())


def test_a_client_asking_for_a_corrupt_group_in_a_loop_costs_no_etcd_writes_each_time(
    broker_cluster: BrokerCluster,
) -> None:
    """Each load of a corrupt group takes its lease and gives it back (two etcd writes, and an
    event on every broker's watch): answered from memory for a while, a retry loop writes
    nothing more. Before, 40 requests made 80 writes."""
    cluster = broker_cluster
    broker = cluster.start()
    topic, bad = names("t"), names("bad")
    create_topics(broker.bootstrap, [topic], 1)
    corrupt(cluster, bad, GARBAGE["bytes"], topic)
    describe = {"groups": [bad], "include_authorized_operations": False}
    with KafkaWire(broker.bootstrap) as wire:
        (first,) = wire.request(DESCRIBE_GROUPS, 5, describe).groups
        assert int(first.error_code) == ErrorCode.UNKNOWN_SERVER_ERROR
        before = etcd_revision(cluster)
        for _ in range(40):
            (again,) = wire.request(DESCRIBE_GROUPS, 5, describe).groups
            assert int(again.error_code) == ErrorCode.UNKNOWN_SERVER_ERROR
        written = etcd_revision(cluster) - before
    assert written < 20, f"{written} etcd writes for 40 requests about one corrupt group"
    assert metric_value(broker, UNREADABLE) >= 41  # each refusal is still counted


def put_keys(cluster: BrokerCluster, values: dict[str, bytes]) -> None:
    async def write() -> None:
        etcd = await harness_etcd(cluster.etcd_url)
        try:
            for key, value in values.items():
                await etcd.put(key, value)
        finally:
            await etcd.close()

    asyncio.run(write())


def stored_values(cluster: BrokerCluster, group: str) -> dict[str, bytes]:
    async def read() -> dict[str, bytes]:
        etcd = await harness_etcd(cluster.etcd_url)
        try:
            entries = await etcd.get_prefix(keys.group_prefix(cluster.cluster, group))
            return {entry.key: entry.value for entry in entries}
        finally:
            await etcd.close()

    return asyncio.run(read())


def delete_groups(bootstrap: str, groups: list[str]) -> dict[str, int]:
    """``kafka-consumer-groups.sh --delete`` through librdkafka's admin API: each group's
    error code (0 when deleted)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    codes = {}
    for group, future in admin.delete_consumer_groups(groups, request_timeout=60).items():
        try:
            future.result(90)
            codes[group] = ErrorCode.NONE
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            codes[group] = error.code()
    return codes


def test_delete_groups_removes_a_corrupt_group_whole_and_its_id_starts_afresh(
    broker_cluster: BrokerCluster,
) -> None:
    """Two corrupt groups (garbage metadata; a committed offset of another shape), each with
    an offset pending in a transaction and a key of no known kind under its prefix, beside a
    good group, all on one broker."""
    cluster = broker_cluster
    broker = cluster.start()
    topic = names("t")
    create_topics(broker.bootstrap, [topic], 1)
    produce(broker.bootstrap, topic, [b"v%d" % i for i in range(5)])
    good = names("good")
    standalone_commit(broker.bootstrap, good, topic, 2)
    bad_record, bad_offset = names("bad-record"), names("bad-offset")
    corrupt(cluster, bad_record, GARBAGE["bytes"], topic)
    name = cluster.cluster  # bad_offset: written here only, never loaded by the broker
    put_keys(cluster, {keys.group_offset_key(name, bad_offset, topic, 0): GARBAGE["shape"]})
    for group in (bad_record, bad_offset):
        put_keys(
            cluster,
            {
                keys.group_txn_offset_key(name, group, 7, topic, 0): b'{"offset":4}',
                keys.group_prefix(name, group) + "left-by-another-tool": b"?",
            },
        )
    # metadata (bad_record's only: the other one has committed offsets only), offset,
    # pending, unknown
    assert (len(stored(cluster, bad_record)), len(stored(cluster, bad_offset))) == (4, 3)
    good_before = stored_values(cluster, good)
    assert len(good_before) == 1

    # OffsetDelete needs the group's subscriptions, which do not decode: the group's error.
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        with pytest.raises(UnknownError):
            admin.delete_group_offsets(bad_record, [TopicPartition(topic, 0)])
    finally:
        admin.close()
    assert len(stored(cluster, bad_record)) == 4

    # Kafka's tool deletes them: before, both got UNKNOWN_SERVER_ERROR and kept every key.
    codes = delete_groups(broker.bootstrap, [bad_record, bad_offset])
    assert codes == {bad_record: ErrorCode.NONE, bad_offset: ErrorCode.NONE}
    for group in (bad_record, bad_offset):
        assert stored(cluster, group) == []
        assert not lease_held(cluster, group)
    assert stored_values(cluster, good) == good_before
    assert delete_groups(broker.bootstrap, [bad_record]) == {
        bad_record: ErrorCode.GROUP_ID_NOT_FOUND
    }

    # The id works from scratch: no offset of the old group (the corrupt one stored 1), so
    # the consumer starts at its auto.offset.reset; the good group still has its own.
    member = KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        group_id=bad_record,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    try:
        member.subscribe([topic])
        seen: list[int] = []

        def read_all() -> bool:
            seen.extend(r.offset for rs in member.poll(500).values() for r in rs)
            return len(seen) >= 5

        wait_until_deadline(read_all, "the new group's member to read the topic")
        assert seen == [0, 1, 2, 3, 4]
        member.commit()
        # A live member: the normal rule holds for the re-created group.
        codes = delete_groups(broker.bootstrap, [bad_record])
        assert codes == {bad_record: ErrorCode.NON_EMPTY_GROUP}
    finally:
        member.close()
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        tp = TopicPartition(topic, 0)
        offsets = admin.list_group_offsets({good: [tp], bad_record: [tp]})
        assert (offsets[good][tp].offset, offsets[bad_record][tp].offset) == (2, 5)
    finally:
        admin.close()
    log = broker.log_path.read_text(errors="replace")
    assert f"deleted group {bad_record}, whose stored record did not decode" in log
    assert "Traceback" not in log


def wait_until_deadline(check: Callable[[], bool], what: str) -> None:
    """``harness.groups.wait_for`` with this file's deadline."""
    wait_for(check, DEADLINE_S, what)
