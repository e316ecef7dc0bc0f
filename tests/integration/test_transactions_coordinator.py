"""The transaction coordinator on the wire, against broker processes and etcd.

FindCoordinator key type 1, InitProducerId with a transactional id (epoch bumps fence the older
producer), AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit (offsets pending until the
transaction commits, dropped on abort), EndTxn, timeouts that abort, recovery of a transaction
left prepared by a coordinator that died, DescribeTransactions and ListTransactions.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from harness.brokers import BrokerCluster, BrokerProcess, new_cluster
from harness.etcd import harness_etcd
from harness.kafka_wire import KafkaWire, metadata_body, share_heartbeat
from harness.proxy import start_proxy
from harness.s3 import S3Endpoint

from kafscale.broker.groups.store import CommittedOffset, encode_offset
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.transactions.state import TxnMetadata, TxnState
from kafscale.broker.transactions.store import encode_metadata

pytestmark = pytest.mark.integration

FIND, OFFSET_FETCH, INIT = 10, 9, 22
ADD_PARTITIONS, ADD_OFFSETS, END_TXN, TXN_OFFSET_COMMIT = 24, 25, 26, 28
DESCRIBE_TXNS, LIST_TXNS = 65, 66
NONE, UNKNOWN_TOPIC, NOT_COORDINATOR, ILLEGAL_GENERATION = 0, 3, 16, 22
INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE, INVALID_MAPPING, INVALID_TIMEOUT = 47, 48, 49, 50
OPERATION_NOT_ATTEMPTED, UNSTABLE_OFFSET_COMMIT, PRODUCER_FENCED = 55, 88, 90
GROUP_ID_NOT_FOUND, TRANSACTIONAL_ID_NOT_FOUND = 69, 105
TXN_ENV = {"KAFSCALE_TRANSACTIONS__CHECK_INTERVAL_MS": "100"}
TOPIC = "txn-topic"


def start(cluster: BrokerCluster) -> BrokerProcess:
    return cluster.start(**TXN_ENV)


def find(wire: KafkaWire, key: str, version: int = 4) -> Any:
    if version >= 4:
        response = wire.request(FIND, version, {"key_type": 1, "coordinator_keys": [key]})
        (entry,) = response.coordinators
        return entry
    return wire.request(FIND, version, {"key": key, "key_type": 1})


def init(wire: KafkaWire, txn_id: str, timeout_ms: int = 60_000, version: int = 3) -> Any:
    body = {"transactional_id": txn_id, "transaction_timeout": timeout_ms}
    return wire.request(INIT, version, body)


def add_offsets(wire: KafkaWire, txn_id: str, pid: int, epoch: int, group: str, v: int = 3) -> int:
    body = {"transactional_id": txn_id, "producer_id": pid, "producer_epoch": epoch,
            "group_id": group}  # fmt: skip
    return int(wire.request(ADD_OFFSETS, v, body).error_code)


def add_partitions(
    wire: KafkaWire, txn_id: str, pid: int, epoch: int, parts: dict[str, list[int]], v: int = 3
) -> dict[tuple[str, int], int]:
    body = {
        "v3_and_below_transactional_id": txn_id,
        "v3_and_below_producer_id": pid,
        "v3_and_below_producer_epoch": epoch,
        "v3_and_below_topics": [{"name": t, "partitions": ps} for t, ps in parts.items()],
    }
    response = wire.request(ADD_PARTITIONS, v, body)
    return {
        (str(t.name), int(p.partition_index)): int(p.partition_error_code)
        for t in response.results_by_topic_v3_and_below
        for p in t.results_by_partition
    }


def end(wire: KafkaWire, txn_id: str, pid: int, epoch: int, commit: bool, v: int = 3) -> int:
    body = {"transactional_id": txn_id, "producer_id": pid, "producer_epoch": epoch,
            "committed": commit}  # fmt: skip
    return int(wire.request(END_TXN, v, body).error_code)


def txn_commit_offset(
    wire: KafkaWire,
    txn_id: str,
    pid: int,
    epoch: int,
    group: str,
    offset: int,
    v: int = 3,
    generation_id: int = -1,
) -> int:
    body = {
        "transactional_id": txn_id,
        "group_id": group,
        "producer_id": pid,
        "producer_epoch": epoch,
        "generation_id": generation_id,
        "member_id": "",
        "group_instance_id": None,
        "topics": [
            {
                "name": TOPIC,
                "partitions": [
                    {"partition_index": 0, "committed_offset": offset,
                     "committed_leader_epoch": -1, "committed_metadata": "m"}
                ],
            }
        ],
    }  # fmt: skip
    response = wire.request(TXN_OFFSET_COMMIT, v, body)
    ((code,),) = [[int(p.error_code) for p in t.partitions] for t in response.topics]
    return code


def fetch_offset(wire: KafkaWire, group: str, require_stable: bool) -> tuple[int, int]:
    """(error code, committed offset) of TOPIC/0 in ``group`` (OffsetFetch v7)."""
    body = {"group_id": group, "topics": [{"name": TOPIC, "partition_indexes": [0]}],
            "require_stable": require_stable}  # fmt: skip
    response = wire.request(OFFSET_FETCH, 7, body)
    assert response.error_code == NONE
    (part,) = response.topics[0].partitions
    return int(part.error_code), int(part.committed_offset)


@dataclass(frozen=True)
class Described:
    error_code: int
    transaction_state: str
    timeout_ms: int
    start_ms: int
    producer_id: int
    producer_epoch: int
    topics: list[tuple[str, list[int]]]


def describe(wire: KafkaWire, txn_id: str) -> Described:
    (state,) = describe_many(wire, [txn_id]).values()
    return state


def describe_many(wire: KafkaWire, txn_ids: list[str]) -> dict[str, Described]:
    """DescribeTransactions v0, read by hand: Kafka sends a start time of -1 for a transaction
    that is not ongoing, which kio's datetime reader refuses."""
    wire.send(DESCRIBE_TXNS, 0, {"transactional_ids": txn_ids})
    reader = _Reader(wire.recv_frame())
    reader.take(">i")  # correlation id
    reader.tags()
    reader.take(">i")  # throttle
    states = dict(_described(reader) for _ in range(reader.uvarint() - 1))
    reader.tags()
    assert reader.at == len(reader.data)
    return states


def _described(r: _Reader) -> tuple[str, Described]:
    error, name = r.take(">h"), r.string()
    assert name is not None
    state, timeout, start = r.string() or "", r.take(">i"), r.take(">q")
    pid, epoch = r.take(">q"), r.take(">h")
    topics = []
    for _ in range(r.uvarint() - 1):
        topic = r.string() or ""
        topics.append((topic, [r.take(">i") for _ in range(r.uvarint() - 1)]))
        r.tags()
    r.tags()
    return name, Described(error, state, timeout, start, pid, epoch, topics)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return int(value)

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            byte = self.data[self.at]
            self.at += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def string(self) -> str | None:
        length = self.uvarint() - 1
        if length < 0:
            return None
        text = self.data[self.at : self.at + length].decode()
        self.at += length
        return text

    def tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.at += self.uvarint()


def wait_for(check: Any, timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def make_topic(wire: KafkaWire) -> None:
    response = wire.request(3, 9, metadata_body([TOPIC]))
    assert response.topics[0].error_code == NONE


@pytest.fixture(scope="module")
def shared_broker(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    """One broker for the tests that only use transactional ids and groups of their own (not
    those listing every transaction, nor those stopping or reconfiguring brokers)."""
    cluster = new_cluster(etcd_server.client_url, s3_server, tmp_path_factory.mktemp("txn"), "txn")
    try:
        yield cluster.start()
    finally:
        cluster.stop_all()


# --- tests ------------------------------------------------------------------------------------


def test_find_coordinator_names_one_broker_for_a_transactional_id(
    broker_cluster: BrokerCluster,
) -> None:
    first, second = start(broker_cluster), start(broker_cluster)
    answers = set()
    for broker in (first, second):
        with KafkaWire(broker.bootstrap) as wire:
            entry = find(wire, "app-1")
            assert entry.error_code == NONE
            old = find(wire, "app-1", version=1)
            assert old.error_code == NONE and old.node_id == entry.node_id
            answers.add((int(entry.node_id), int(entry.port)))
    assert len(answers) == 1
    ((node_id, port),) = answers
    coordinator = first if first.port == port else second
    other = second if coordinator is first else first
    # The named broker takes the lease on the first request; then the other one refuses.
    with KafkaWire(coordinator.bootstrap) as wire:
        assert init(wire, "app-1").error_code == NONE
    with KafkaWire(other.bootstrap) as wire:
        assert init(wire, "app-1").error_code == NOT_COORDINATOR
    # Once the lease is held, every broker names its holder.
    with KafkaWire(other.bootstrap) as wire:
        assert int(find(wire, "app-1").node_id) == node_id


def test_epoch_bumps_fence_the_older_producer(shared_broker: BrokerProcess) -> None:
    with KafkaWire(shared_broker.bootstrap) as wire:
        first = init(wire, "fence-me")
        assert first.error_code == NONE and first.producer_epoch == 0
        second = init(wire, "fence-me")
        assert second.error_code == NONE
        assert (second.producer_id, second.producer_epoch) == (first.producer_id, 1)
        pid = int(first.producer_id)
        # The zombie (epoch 0) is fenced: PRODUCER_FENCED, or INVALID_PRODUCER_EPOCH for
        # clients from before KIP-588.
        assert add_offsets(wire, "fence-me", pid, 0, "g", v=3) == PRODUCER_FENCED
        assert add_offsets(wire, "fence-me", pid, 0, "g", v=1) == INVALID_PRODUCER_EPOCH
        assert end(wire, "fence-me", pid, 0, commit=True) == PRODUCER_FENCED
        assert add_offsets(wire, "fence-me", pid + 1000, 1, "g") == INVALID_MAPPING
        assert add_offsets(wire, "fence-me", pid, 1, "g") == NONE
        # A new producer while a transaction is open aborts it first, with the epoch bumped
        # (epoch 2 fences the old producer on every partition), then gets the next epoch.
        third = init(wire, "fence-me")
        assert third.error_code == NONE
        assert (third.producer_id, third.producer_epoch) == (pid, 3)
        assert end(wire, "fence-me", pid, 1, commit=True) == PRODUCER_FENCED
        state = describe(wire, "fence-me")
        assert (state.transaction_state, state.producer_epoch) == ("Empty", 3)
        # Distinct transactional ids get distinct producer ids.
        assert init(wire, "someone-else").producer_id != pid


def test_state_machine_errors(shared_broker: BrokerProcess) -> None:
    with KafkaWire(shared_broker.bootstrap) as wire:
        make_topic(wire)
        assert init(wire, "bad-timeout", timeout_ms=0).error_code == INVALID_TIMEOUT
        assert init(wire, "too-long", timeout_ms=10**9).error_code == INVALID_TIMEOUT
        started = init(wire, "states")
        pid, epoch = int(started.producer_id), int(started.producer_epoch)
        assert end(wire, "states", pid, epoch, commit=True) == INVALID_TXN_STATE  # none open
        # TxnOffsetCommit before AddOffsetsToTxn: the offsets are in no transaction.
        assert txn_commit_offset(wire, "states", pid, epoch, "g1", 5) == INVALID_TXN_STATE
        codes = add_partitions(wire, "states", pid, epoch, {TOPIC: [0], "no-such-topic": [0]})
        assert codes == {(TOPIC, 0): OPERATION_NOT_ATTEMPTED, ("no-such-topic", 0): UNKNOWN_TOPIC}
        assert describe(wire, "states").transaction_state == "Empty"
        assert add_offsets(wire, "states", pid, epoch, "g1") == NONE
        assert end(wire, "states", pid, epoch, commit=True) == NONE
        assert end(wire, "states", pid, epoch, commit=True) == NONE  # a retry: same answer
        assert end(wire, "states", pid, epoch, commit=False) == INVALID_TXN_STATE
        missing = describe(wire, "never-seen")
        assert missing.error_code == TRANSACTIONAL_ID_NOT_FOUND


def test_offsets_committed_in_a_transaction_show_only_when_it_commits(
    shared_broker: BrokerProcess,
) -> None:
    with KafkaWire(shared_broker.bootstrap) as wire:
        make_topic(wire)
        started = init(wire, "ctp")
        pid, epoch = int(started.producer_id), int(started.producer_epoch)
        assert add_offsets(wire, "ctp", pid, epoch, "ctp-group") == NONE
        assert txn_commit_offset(wire, "ctp", pid, epoch, "ctp-group", 42) == NONE
        # Pending: a read_committed consumer is told to retry, others see the last commit.
        assert fetch_offset(wire, "ctp-group", require_stable=True) == (UNSTABLE_OFFSET_COMMIT, -1)
        assert fetch_offset(wire, "ctp-group", require_stable=False) == (NONE, -1)
        assert txn_commit_offset(wire, "ctp", pid, epoch + 1, "ctp-group", 43) == PRODUCER_FENCED
        assert end(wire, "ctp", pid, epoch, commit=True) == NONE
        assert fetch_offset(wire, "ctp-group", require_stable=True) == (NONE, 42)
        # An aborted transaction's offsets never show.
        assert add_offsets(wire, "ctp", pid, epoch, "ctp-group") == NONE
        assert txn_commit_offset(wire, "ctp", pid, epoch, "ctp-group", 99) == NONE
        assert end(wire, "ctp", pid, epoch, commit=False) == NONE
        assert fetch_offset(wire, "ctp-group", require_stable=True) == (NONE, 42)
        # A late TxnOffsetCommit after the transaction ended is refused, not left pending.
        assert txn_commit_offset(wire, "ctp", pid, epoch, "ctp-group", 100) == INVALID_TXN_STATE
        assert fetch_offset(wire, "ctp-group", require_stable=True) == (NONE, 42)


def test_a_generation_for_a_group_nobody_joined_is_illegal_generation(
    shared_broker: BrokerProcess,
) -> None:
    """Kafka's ``validateTransactionalOffsetCommit``: a TxnOffsetCommit naming a generation
    (a consumer in a group) for a group that does not exist is ILLEGAL_GENERATION and leaves
    nothing pending; generation -1 (a producer outside group management) creates the group."""
    with KafkaWire(shared_broker.bootstrap) as wire:
        make_topic(wire)
        started = init(wire, "gen")
        pid, epoch = int(started.producer_id), int(started.producer_epoch)
        assert add_offsets(wire, "gen", pid, epoch, "gen-group") == NONE
        for generation in (0, 5):
            code = txn_commit_offset(wire, "gen", pid, epoch, "gen-group", 7, 3, generation)
            assert code == ILLEGAL_GENERATION
        assert fetch_offset(wire, "gen-group", require_stable=True) == (NONE, -1)
        assert txn_commit_offset(wire, "gen", pid, epoch, "gen-group", 8) == NONE
        assert end(wire, "gen", pid, epoch, commit=True) == NONE
        assert fetch_offset(wire, "gen-group", require_stable=True) == (NONE, 8)


def test_offsets_sent_in_a_transaction_to_a_share_group_are_refused(
    shared_broker: BrokerProcess,
) -> None:
    """A share group keeps no committed offsets (KIP-932): Kafka's
    ``ShareGroup.validateOffsetCommit`` answers GROUP_ID_NOT_FOUND, transactional or not, as
    OffsetCommit here does. A TxnOffsetCommit naming a share group used to be taken: once its
    transaction committed, the next OffsetFetch that settled the offsets made a classic group
    beside the share group, and its members' heartbeats were GROUP_ID_NOT_FOUND from then on."""
    group = "txn-share-group"
    with KafkaWire(shared_broker.bootstrap) as wire:
        make_topic(wire)
        joined = share_heartbeat(wire, group, "share-m1", 0, TOPIC)
        assert joined.error_code == NONE, joined
        started = init(wire, "share-txn")
        pid, epoch = int(started.producer_id), int(started.producer_epoch)
        assert add_offsets(wire, "share-txn", pid, epoch, group) == NONE
        assert txn_commit_offset(wire, "share-txn", pid, epoch, group, 9) == GROUP_ID_NOT_FOUND
        assert end(wire, "share-txn", pid, epoch, commit=True) == NONE
        fetched = {"group_id": group, "topics": [{"name": TOPIC, "partition_indexes": [0]}],
                   "require_stable": True}  # fmt: skip
        wire.request(OFFSET_FETCH, 7, fetched)  # what OffsetFetch answers is the next test's
        again = share_heartbeat(wire, group, "share-m1", int(joined.member_epoch), TOPIC)
        assert again.error_code == NONE, again


def test_offset_fetch_of_a_share_group_is_group_id_not_found(
    shared_broker: BrokerProcess,
) -> None:
    """Kafka's ``ShareGroup.validateOffsetFetch``: a share group has no committed offsets to
    answer (an admin's ``listConsumerGroupOffsets`` of it is an error, not an empty map), and
    the OffsetFetch must leave the share group as it is."""
    group = "fetched-share-group"
    with KafkaWire(shared_broker.bootstrap) as wire:
        make_topic(wire)
        joined = share_heartbeat(wire, group, "share-m1", 0, TOPIC)
        assert joined.error_code == NONE, joined
        fetched = {"group_id": group, "topics": [{"name": TOPIC, "partition_indexes": [0]}],
                   "require_stable": True}  # fmt: skip
        answer = wire.request(OFFSET_FETCH, 7, fetched)
        assert answer.error_code == GROUP_ID_NOT_FOUND, answer
        again = share_heartbeat(wire, group, "share-m1", int(joined.member_epoch), TOPIC)
        assert again.error_code == NONE, again


def test_a_timed_out_transaction_is_aborted_and_its_producer_fenced(
    broker_cluster: BrokerCluster,
) -> None:
    broker = start(broker_cluster)
    with KafkaWire(broker.bootstrap) as wire:
        make_topic(wire)
        started = init(wire, "slow", timeout_ms=300)
        pid, epoch = int(started.producer_id), int(started.producer_epoch)
        assert add_offsets(wire, "slow", pid, epoch, "slow-group") == NONE
        assert txn_commit_offset(wire, "slow", pid, epoch, "slow-group", 7) == NONE
        aborted = wait_for(lambda: describe(wire, "slow").transaction_state == "CompleteAbort")
        assert aborted, describe(wire, "slow")
        assert describe(wire, "slow").producer_epoch == epoch + 1
        assert end(wire, "slow", pid, epoch, commit=True) == PRODUCER_FENCED
        assert fetch_offset(wire, "slow-group", require_stable=True) == (NONE, -1)


def test_describe_and_list_transactions(broker: BrokerProcess) -> None:
    with KafkaWire(broker.bootstrap) as wire:
        make_topic(wire)
        started = init(wire, "listed", timeout_ms=45_000)
        pid, epoch = int(started.producer_id), int(started.producer_epoch)
        assert add_partitions(wire, "listed", pid, epoch, {TOPIC: [0]}) == {(TOPIC, 0): NONE}
        state = describe(wire, "listed")
        assert state.error_code == NONE and state.transaction_state == "Ongoing"
        assert (state.producer_id, state.producer_epoch) == (pid, epoch)
        assert state.topics == [(TOPIC, [0])]
        assert state.timeout_ms == 45_000 and state.start_ms > 0
        init(wire, "idle")
        listed = wire.request(LIST_TXNS, 1, {"state_filters": [], "producer_id_filters": [],
                                             "duration_filter": -1})  # fmt: skip
        assert listed.error_code == NONE
        by_id = {t.transactional_id: t.transaction_state for t in listed.transaction_states}
        assert by_id == {"listed": "Ongoing", "idle": "Empty"}
        ongoing = wire.request(LIST_TXNS, 0, {"state_filters": ["Ongoing", "Nope"],
                                              "producer_id_filters": []})  # fmt: skip
        assert [t.transactional_id for t in ongoing.transaction_states] == ["listed"]
        assert list(ongoing.unknown_state_filters) == ["Nope"]


def _seed_prepared(cluster: BrokerCluster, txn_id: str, group: str) -> None:
    """What a coordinator that died right after writing PREPARE_COMMIT leaves in etcd (its
    lease went with its session): the decision and a pending offset of producer 777."""
    prepared = TxnMetadata(
        transactional_id=txn_id,
        producer_id=777,
        producer_epoch=3,
        timeout_ms=60_000,
        state=TxnState.PREPARE_COMMIT,
        groups=frozenset({group}),
        start_ms=int(time.time() * 1000),
    )

    async def seed() -> None:
        etcd = await harness_etcd(cluster.etcd_url)
        try:
            await etcd.put(keys.transaction_key(cluster.cluster, txn_id), encode_metadata(prepared))
            pending = keys.group_txn_offset_key(cluster.cluster, group, 777, TOPIC, 0)
            await etcd.put(pending, encode_offset(CommittedOffset(offset=11)))
        finally:
            await etcd.close()

    asyncio.run(seed())


def test_a_retried_end_txn_completes_a_transaction_left_prepared(
    broker_cluster: BrokerCluster,
) -> None:
    """The client retries EndTxn at the new coordinator before its periodic check ran: the new
    coordinator finishes the prepared commit and answers the retry with success."""
    broker = broker_cluster.start(KAFSCALE_TRANSACTIONS__CHECK_INTERVAL_MS="600000")
    with KafkaWire(broker.bootstrap) as wire:
        make_topic(wire)
        _seed_prepared(broker_cluster, "retried", "retried-group")
        assert end(wire, "retried", 777, 3, commit=True) == NONE
        assert describe(wire, "retried").transaction_state == "CompleteCommit"
        assert fetch_offset(wire, "retried-group", require_stable=True) == (NONE, 11)


def test_a_prepared_transaction_is_finished_by_the_next_coordinator(
    broker_cluster: BrokerCluster,
) -> None:
    """A coordinator that died after writing PREPARE_COMMIT (its lease gone with its session):
    a live broker takes the transactional id over and completes the commit."""
    broker = start(broker_cluster)
    with KafkaWire(broker.bootstrap) as wire:
        make_topic(wire)
    _seed_prepared(broker_cluster, "orphan", "orphan-group")
    with KafkaWire(broker.bootstrap) as wire:
        done = wait_for(lambda: describe(wire, "orphan").transaction_state == "CompleteCommit")
        assert done, describe(wire, "orphan")
        assert fetch_offset(wire, "orphan-group", require_stable=True) == (NONE, 11)
    assert broker_cluster.etcd_keys("groups/orphan-group/txn-offsets/") == []


def test_a_transaction_through_the_proxy(broker_cluster: BrokerCluster) -> None:
    """Behind the proxy the client sees one broker: FindCoordinator key type 1 names the proxy,
    which sends each transaction request to the transactional id's coordinator."""
    start(broker_cluster), start(broker_cluster)
    proxy = start_proxy(broker_cluster)
    with KafkaWire(proxy.bootstrap) as wire:
        make_topic(wire)
        entry = find(wire, "via-proxy")
        assert (entry.error_code, entry.port) == (NONE, proxy.port)
        ids = [f"via-proxy-{i}" for i in range(4)]  # spread over both brokers
        for txn_id in ids:
            started = init(wire, txn_id)
            assert started.error_code == NONE
            pid, epoch = int(started.producer_id), int(started.producer_epoch)
            group = f"{txn_id}-group"
            assert add_offsets(wire, txn_id, pid, epoch, group) == NONE
            assert txn_commit_offset(wire, txn_id, pid, epoch, group, 5) == NONE
            assert fetch_offset(wire, group, require_stable=True) == (UNSTABLE_OFFSET_COMMIT, -1)
            assert end(wire, txn_id, pid, epoch, commit=True) == NONE
            assert fetch_offset(wire, group, require_stable=True) == (NONE, 5)
            described = describe(wire, txn_id)
            assert described.transaction_state == "CompleteCommit", described
        listed = wire.request(LIST_TXNS, 1, {"state_filters": [], "producer_id_filters": [],
                                             "duration_filter": -1})  # fmt: skip
        assert sorted(t.transactional_id for t in listed.transaction_states) == ids
        # Several ids at once: split by coordinator, the answers joined.
        described = describe_many(wire, [*ids, "unknown-id"])
        assert {t: d.transaction_state for t, d in described.items() if t in ids} == dict.fromkeys(
            ids, "CompleteCommit"
        )
        assert described["unknown-id"].error_code == TRANSACTIONAL_ID_NOT_FOUND
    holders = {k.rsplit("/", 1)[-1] for k in broker_cluster.etcd_keys("leases/transactions/")}
    assert set(ids) <= holders


def test_every_advertised_version(broker: BrokerProcess) -> None:
    """Each version of each coordinator API, through a whole transaction: InitProducerId 0-5,
    AddPartitionsToTxn 0-3 (and the batched v4 with verify_only), AddOffsetsToTxn 0-4,
    TxnOffsetCommit 0-4, EndTxn 0-4, ListTransactions 0-1."""
    with KafkaWire(broker.bootstrap) as wire:
        make_topic(wire)
        for version in range(6):
            txn_id = f"versions-{version}"
            started = init(wire, txn_id, version=version)
            assert started.error_code == NONE, version
            pid, epoch = int(started.producer_id), int(started.producer_epoch)
            v = min(version, 4)
            if version <= 3:
                codes = add_partitions(wire, txn_id, pid, epoch, {TOPIC: [0]}, v=version)
                assert codes == {(TOPIC, 0): NONE}, version
            assert add_offsets(wire, txn_id, pid, epoch, f"{txn_id}-g", v=v) == NONE, version
            commit_v = min(version, 4)
            assert (
                txn_commit_offset(wire, txn_id, pid, epoch, f"{txn_id}-g", 3, v=commit_v) == NONE
            ), version
            assert end(wire, txn_id, pid, epoch, commit=False, v=v) == NONE, version
            assert describe(wire, txn_id).transaction_state == "CompleteAbort"
        # The batched form (v4, from brokers): two transactions in one request, then verify_only.
        first, second = init(wire, "batched-a"), init(wire, "batched-b")
        transactions = [
            {
                "transactional_id": name,
                "producer_id": int(r.producer_id),
                "producer_epoch": int(r.producer_epoch),
                "verify_only": False,
                "topics": [{"name": TOPIC, "partitions": [0]}],
            }
            for name, r in (("batched-a", first), ("batched-b", second))
        ]
        response = wire.request(ADD_PARTITIONS, 4, {"transactions": transactions})
        assert response.error_code == NONE
        results = {
            r.transactional_id: [p.partition_error_code for t in r.topic_results
                                 for p in t.results_by_partition]
            for r in response.results_by_transaction
        }  # fmt: skip
        assert results == {"batched-a": [NONE], "batched-b": [NONE]}
        verify = [{**transactions[0], "verify_only": True, "topics": [
            {"name": TOPIC, "partitions": [0, 1]}]}]  # fmt: skip
        response = wire.request(ADD_PARTITIONS, 4, {"transactions": verify})
        (result,) = response.results_by_transaction
        codes = {int(p.partition_index): int(p.partition_error_code)
                 for p in result.topic_results[0].results_by_partition}  # fmt: skip
        assert codes == {0: NONE, 1: INVALID_TXN_STATE}  # partition 1 was never added
        for version in (0, 1):
            listed = wire.request(LIST_TXNS, version, {"state_filters": ["Ongoing"],
                                                       "producer_id_filters": []})  # fmt: skip
            names = sorted(t.transactional_id for t in listed.transaction_states)
            assert names == ["batched-a", "batched-b"], version


def test_an_unused_transactional_id_expires_and_comes_back_as_a_new_producer(
    broker_cluster: BrokerCluster,
) -> None:
    """transactions.id_expiration_ms (Kafka's transactional.id.expiration.ms), short here: the
    record of an id that committed and then stayed unused is deleted with its lease, so brokers
    stop reading it; an ongoing transaction's id is kept; the expired id's next InitProducerId
    gets a new producer id at epoch 0."""
    broker = start_with(broker_cluster, KAFSCALE_TRANSACTIONS__ID_EXPIRATION_MS="1500")
    with KafkaWire(broker.bootstrap) as wire:
        make_topic(wire)
        first = init(wire, "idle")
        pid, epoch = int(first.producer_id), int(first.producer_epoch)
        assert add_partitions(wire, "idle", pid, epoch, {TOPIC: [0]}) == {(TOPIC, 0): NONE}
        assert end(wire, "idle", pid, epoch, commit=True) == NONE
        busy = init(wire, "busy", timeout_ms=60_000)
        busy_pid, busy_epoch = int(busy.producer_id), int(busy.producer_epoch)
        assert add_offsets(wire, "busy", busy_pid, busy_epoch, "busy-group") == NONE
        record = keys.transaction_key(broker_cluster.cluster, "idle")
        lease = keys.transaction_lease_key(broker_cluster.cluster, "idle")
        assert record in etcd_keys(broker_cluster)

        def gone() -> bool:
            present = etcd_keys(broker_cluster)
            return record not in present and lease not in present

        assert wait_for(gone), etcd_keys(broker_cluster)
        # Ongoing for longer than the expiration, yet not expired: only settled ids go.
        assert keys.transaction_key(broker_cluster.cluster, "busy") in etcd_keys(broker_cluster)
        assert describe(wire, "busy").transaction_state == "Ongoing"
        again = init(wire, "idle")
        assert int(again.error_code) == NONE
        assert int(again.producer_id) != pid and int(again.producer_epoch) == 0
        assert add_partitions(wire, "idle", int(again.producer_id), 0, {TOPIC: [0]}) == {
            (TOPIC, 0): NONE
        }
        assert end(wire, "idle", int(again.producer_id), 0, commit=True) == NONE


def start_with(cluster: BrokerCluster, **extra: str) -> BrokerProcess:
    return cluster.start(**TXN_ENV, **extra)


def etcd_keys(cluster: BrokerCluster) -> set[str]:
    return set(cluster.etcd_keys(""))
