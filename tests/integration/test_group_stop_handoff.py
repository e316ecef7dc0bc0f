"""A broker that stops gracefully hands its groups (and transactional ids) over without sending
clients back to itself.

Kafka's coordinator that unloads a group answers COORDINATOR_NOT_AVAILABLE / NOT_COORDINATOR,
and FindCoordinator names the new coordinator once there is one. Here the stopping broker used
to refuse the group ("shutting down") and then, asked FindCoordinator on a connection still open,
name itself for the rest of its stop (its lease watch was closed with the group holding it, and
its own pick still counted itself): a client looped FindCoordinator -> NOT_COORDINATOR until the
broker was gone, then met "Connection refused" (librdkafka's commit retry made it worse,
librdkafka#3645).

The stop is held open on purpose: a produce's upload is held back by the S3 proxy, and the
hand-off's flush waits for it, so the stopping broker answers on its open connection for
seconds after it let its groups go.

``POST /drain`` (the pod's preStop hook, run before SIGTERM) hands them over the same way, the
broker still running: it used to keep its groups and transactional ids until the SIGTERM, and
every broker named it meanwhile (a live lease holder is always named).
"""

from __future__ import annotations

import itertools
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import Producer
from harness.brokers import STEADY_SESSION_TTL_S, BrokerCluster
from harness.groups import wait_for
from harness.kafka_wire import KafkaWire
from harness.log_cleaner import poll_all
from harness.s3_proxy import s3_proxy
from harness.topics import create_topics

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.groups.leases import choose_coordinator
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration

OFFSET_COMMIT, OFFSET_FETCH, METADATA, FIND_COORDINATOR, INIT_PRODUCER_ID = 8, 9, 3, 10, 22
TOPIC, HELD_TOPIC, GROUP, TXN_ID = "committed", "held", "handed-over", "handed-over-txn"
GROUP_KEY, TXN_KEY = (GROUP, 0), (TXN_ID, 1)
HELD_UPLOAD_S = 6.0
"""How long the proxy holds the upload the stopping broker's hand-off flushes: the window in
which it still answers on its open connection after letting its groups go."""
GRACE_S = "20"  # the hand-off's share (15 s) outlasts the held upload: the stop is graceful
STEADY = {"KAFSCALE_ETCD__SESSION_TTL_S": STEADY_SESSION_TTL_S}
DEADLINE_S = 60.0
PRODUCER_CLOSE_S = 10.0


def commit_body(offset: int, group: str = GROUP) -> dict[str, Any]:
    """A simple commit (no membership, as ``assign()`` users and admin tools make)."""
    partition = {"partition_index": 0, "committed_offset": offset}
    return {
        "group_id": group,
        "generation_id_or_member_epoch": -1,
        "member_id": "",
        "topics": [{"name": TOPIC, "partitions": [partition]}],
    }


def commit(wire: KafkaWire, offset: int, group: str = GROUP) -> int:
    answer = wire.request(OFFSET_COMMIT, 8, commit_body(offset, group))
    return int(answer.topics[0].partitions[0].error_code)


def committed(wire: KafkaWire, group: str = GROUP) -> int:
    asked = [{"name": TOPIC, "partition_indexes": [0]}]
    body = {"group_id": group, "topics": asked, "require_stable": False}
    answer = wire.request(OFFSET_FETCH, 7, body)
    assert answer.error_code == ErrorCode.NONE, answer
    return int(answer.topics[0].partitions[0].committed_offset)


def find_coordinator(wire: KafkaWire, key: tuple[str, int] = GROUP_KEY) -> tuple[int, int]:
    """(error code, node id) of FindCoordinator for a (key, key type): the group by default."""
    answer = wire.request(FIND_COORDINATOR, 3, {"key": key[0], "key_type": key[1]})
    return int(answer.error_code), int(answer.node_id)


def init_producer_id(wire: KafkaWire) -> int:
    body = {
        "transactional_id": TXN_ID,
        "transaction_timeout": 10_000,
        "producer_id": -1,
        "producer_epoch": -1,
    }
    return int(wire.request(INIT_PRODUCER_ID, 3, body).error_code)


def node_ids(broker: BrokerProcess) -> dict[int, int]:
    """Port -> node id, from Metadata."""
    with KafkaWire(broker.bootstrap) as wire:
        listed = wire.request(METADATA, 1, {"topics": []}).brokers
    return {int(b.port): int(b.node_id) for b in listed}


def leaving_and_staying(
    broker_cluster: BrokerCluster,
) -> tuple[BrokerProcess, BrokerProcess, int, int]:
    """Two brokers (the one to drain first) and their node ids, ``TOPIC`` created."""
    leaving = broker_cluster.start(**STEADY)
    staying = broker_cluster.start(**STEADY)
    ids = node_ids(leaving)
    create_topics(leaving.bootstrap, [TOPIC], 1)
    return leaving, staying, ids[leaving.port], ids[staying.port]


def leaders(broker: BrokerProcess, topic: str) -> dict[int, int]:
    """Partition -> leader, from Metadata."""
    with KafkaWire(broker.bootstrap) as wire:
        answer = wire.request(METADATA, 1, {"topics": [{"name": topic}]})
    return {int(p.partition_index): int(p.leader_id) for p in answer.topics[0].partitions}


def answers_until_named_elsewhere(
    wire: KafkaWire, leaving: int
) -> Iterator[dict[tuple[str, int], tuple[int, int]]]:
    """FindCoordinator answers at the stopping broker for the group and the transactional id,
    until both name another broker or the broker closes the connection (its stop ended)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        try:
            answers = {key: find_coordinator(wire, key) for key in (GROUP_KEY, TXN_KEY)}
        except (ConnectionError, OSError):
            return
        yield answers
        if all(code == ErrorCode.NONE and node != leaving for code, node in answers.values()):
            return
        time.sleep(0.01)


def in_runs(answers: list[dict[tuple[str, int], tuple[int, int]]]) -> list[str]:
    """The answers in order, each run of equal ones once with its length (a failure's text)."""
    runs = [(answer, len(list(group))) for answer, group in itertools.groupby(answers)]
    return [f"{ {key[0]: found for key, found in answer.items()} } x{n}" for answer, n in runs]


@pytest.fixture
def producers() -> Iterator[Callable[[dict[str, Any]], Producer]]:
    """Makes a test's confluent producers and closes each when the test ends, passed or not: a
    failed test's producer (a transactional one mid-transaction) otherwise lived on with the
    failure's traceback, its librdkafka threads retrying against the stopped brokers."""
    made: list[Producer] = []

    def make(config: dict[str, Any]) -> Producer:
        made.append(Producer(config))
        return made[-1]

    yield make
    for producer in made:
        producer.close(PRODUCER_CLOSE_S)


def test_a_stopping_coordinator_never_names_itself_and_the_next_commit_lands_elsewhere(
    broker_cluster: BrokerCluster, producers: Callable[[dict[str, Any]], Producer]
) -> None:
    """From the moment the stopping coordinator refuses the group (NOT_COORDINATOR), its
    FindCoordinator answers for the group and for a transactional id it coordinated are
    COORDINATOR_NOT_AVAILABLE (retried) or the surviving broker, never itself; the group's
    next commit lands at the survivor, and the id is initialised there."""
    with s3_proxy(broker_cluster.s3.url, HELD_UPLOAD_S) as s3:
        leaving = broker_cluster.start(
            KAFSCALE_STORAGE__ENDPOINT=s3.url, KAFSCALE_LIMITS__SHUTDOWN_GRACE_S=GRACE_S, **STEADY
        )
        staying = broker_cluster.start(**STEADY)
        ids = node_ids(leaving)
        leaving_id, staying_id = ids[leaving.port], ids[staying.port]
        create_topics(leaving.bootstrap, [TOPIC], 1)
        create_topics(leaving.bootstrap, [HELD_TOPIC], 2)
        bootstrap = f"{leaving.bootstrap},{staying.bootstrap}"
        producer = producers({"bootstrap.servers": bootstrap, "acks": "1"})
        for partition in (0, 1):
            producer.produce(HELD_TOPIC, b"claims the partition", partition=partition)
        assert producer.flush(30) == 0
        wait_for(  # all the test needs: one partition whose flush the stop must finish
            lambda: leaving_id in leaders(leaving, HELD_TOPIC).values(),
            DEADLINE_S,
            "a partition led by the broker that will stop",
        )
        # the stopping broker's hand-off flushes this one
        held = next(p for p, b in leaders(leaving, HELD_TOPIC).items() if b == leaving_id)

        with KafkaWire(leaving.bootstrap, timeout_s=60) as wire:
            assert commit(wire, 3) == ErrorCode.NONE  # the group's lease is taken here
            assert init_producer_id(wire) == ErrorCode.NONE  # and the transactional id's
            assert find_coordinator(wire) == (ErrorCode.NONE, leaving_id)
            assert find_coordinator(wire, TXN_KEY) == (ErrorCode.NONE, leaving_id)
            s3.hold = re.compile(rf"/topics/{HELD_TOPIC}/.*\.kfs")
            producer.produce(HELD_TOPIC, b"flushed by the hand-off", partition=held)
            producer.poll(0)
            wait_for(lambda: bool(s3.held), 30, "the upload is held (the hand-off waits)")
            leaving.signal(signal.SIGTERM)
            refusal = ErrorCode.NONE
            deadline = time.monotonic() + DEADLINE_S
            while refusal == ErrorCode.NONE:  # served until the group is let go at the stop
                assert time.monotonic() < deadline, leaving.tail()
                refusal = commit(wire, 3)
            assert refusal == ErrorCode.NOT_COORDINATOR, refusal
            answers = list(answers_until_named_elsewhere(wire, leaving_id))

        named_itself = [a for a in answers if (ErrorCode.NONE, leaving_id) in a.values()]
        assert not named_itself, (
            f"FindCoordinator at the stopping broker {leaving_id} named itself after refusing "
            f"the group: {in_runs(answers)}"
        )
        assert answers and answers[-1] == dict.fromkeys(
            (GROUP_KEY, TXN_KEY), (ErrorCode.NONE, staying_id)
        ), in_runs(answers)
        retried = {code for answer in answers for code, node in answer.values() if node < 0}
        assert retried <= {ErrorCode.COORDINATOR_NOT_AVAILABLE}, in_runs(answers)
        with KafkaWire(staying.bootstrap, timeout_s=60) as wire:
            assert commit(wire, 7) == ErrorCode.NONE  # the next commit lands at once
            assert committed(wire) == 7
            assert find_coordinator(wire) == (ErrorCode.NONE, staying_id)
            assert init_producer_id(wire) == ErrorCode.NONE  # the id's next coordinator
        assert leaving.wait(60) == 0, leaving.tail(80)
        assert producer.flush(30) == 0


def named_everywhere(brokers: list[BrokerProcess], key: tuple[str, int]) -> set[tuple[int, int]]:
    """FindCoordinator's (error code, node id) for ``key`` at each broker, as a set."""
    found = set()
    for broker in brokers:
        with KafkaWire(broker.bootstrap) as wire:
            found.add(find_coordinator(wire, key))
    return found


def test_a_drained_coordinator_hands_its_group_and_transactional_id_over_without_a_stop(
    broker_cluster: BrokerCluster,
) -> None:
    """After ``POST /drain`` (no SIGTERM: the broker keeps running), the drained broker refuses
    the group it coordinated on a connection opened before (NOT_COORDINATOR, which clients
    follow), FindCoordinator at every broker names the other one for the group and for the
    transactional id, and the group's next commit lands there with its offsets."""
    leaving, staying, leaving_id, staying_id = leaving_and_staying(broker_cluster)
    with KafkaWire(leaving.bootstrap, timeout_s=60) as wire:
        assert commit(wire, 3) == ErrorCode.NONE  # the group's lease is taken here
        assert init_producer_id(wire) == ErrorCode.NONE  # and the transactional id's
        assert find_coordinator(wire) == (ErrorCode.NONE, leaving_id)
        assert leaving.http("POST", "/drain", timeout_s=60)[0] == 200
        assert commit(wire, 4) == ErrorCode.NOT_COORDINATOR, "still coordinated after the drain"
        assert init_producer_id(wire) == ErrorCode.NOT_COORDINATOR
        assert committed(wire) == 3  # read from etcd: nothing was lost
    assert leaving.status()["client_state"]["groups"] == 0
    assert leaving.status()["client_state"]["transactional_ids"] == 0
    moved = {(ErrorCode.NONE, staying_id)}
    for key in (GROUP_KEY, TXN_KEY):  # each broker's watch sees the released lease
        wait_for(
            lambda key=key: named_everywhere([leaving, staying], key) == moved,
            DEADLINE_S,
            f"FindCoordinator({key}) to name {staying_id} at every broker, not the drained "
            f"{leaving_id}",
            lambda key=key: str(named_everywhere([leaving, staying], key)),
        )
    with KafkaWire(staying.bootstrap, timeout_s=60) as wire:
        assert committed(wire) == 3
        assert commit(wire, 7) == ErrorCode.NONE
        assert committed(wire) == 7
        assert init_producer_id(wire) == ErrorCode.NONE  # the id's next coordinator
    assert named_everywhere([leaving, staying], GROUP_KEY) == moved
    assert leaving.alive, "drained, not stopped"


def test_a_transaction_begun_before_its_coordinator_drains_commits_after_it(
    broker_cluster: BrokerCluster, producers: Callable[[dict[str, Any]], Producer]
) -> None:
    """A transaction whose coordinator is drained mid-way goes on at the next coordinator,
    which loads its state from etcd: the producer's later records and its commit succeed and
    a read_committed consumer reads every record of it. The coordinator moves at the drain
    (FindCoordinator names the other broker at both), not at a later SIGTERM."""
    leaving, staying, leaving_id, staying_id = leaving_and_staying(broker_cluster)
    with KafkaWire(leaving.bootstrap, timeout_s=60) as wire:
        assert init_producer_id(wire) == ErrorCode.NONE  # the id's coordinator is `leaving`
    producer = producers(
        {
            "bootstrap.servers": f"{leaving.bootstrap},{staying.bootstrap}",
            "transactional.id": TXN_ID,
            "transaction.timeout.ms": 60_000,
        }
    )
    producer.init_transactions(60)
    assert named_everywhere([leaving, staying], TXN_KEY) == {(ErrorCode.NONE, leaving_id)}
    producer.begin_transaction()
    for n in range(3):
        producer.produce(TOPIC, f"before {n}".encode(), partition=0)
    assert producer.flush(30) == 0
    assert leaving.http("POST", "/drain", timeout_s=60)[0] == 200
    wait_for(
        lambda: named_everywhere([leaving, staying], TXN_KEY) == {(ErrorCode.NONE, staying_id)},
        DEADLINE_S,
        f"the transactional id's coordinator to move from the drained {leaving_id}",
        lambda: str(named_everywhere([leaving, staying], TXN_KEY)),
    )
    for n in range(3):
        producer.produce(TOPIC, f"after {n}".encode(), partition=0)
    assert producer.flush(30) == 0
    producer.commit_transaction(60)
    values = [value for _, _, value in poll_all(staying.bootstrap, TOPIC, "read_committed")]
    assert values == [b"before 0", b"before 1", b"before 2", b"after 0", b"after 1", b"after 2"]
    assert leaving.alive, "drained, not stopped"


DRAINED_GROUPS = 6
"""Groups the drained broker coordinates: each hand-off is one more chance for a broker to name
it in the moment between the draining mark and the group's release."""


def groups_picked_at(node: int, brokers: list[int], count: int, prefix: str) -> list[str]:
    """``count`` group ids whose stable pick (FindCoordinator's answer while nobody holds the
    lease) among ``brokers`` is ``node``: a broker that took the drained broker for a live one
    would name it for these."""
    picked = (f"{prefix}-{n}" for n in itertools.count())
    return list(
        itertools.islice((g for g in picked if choose_coordinator(g, None, brokers) == node), count)
    )


Snapshot = dict[str, tuple[int, int]]


def find_all(wire: KafkaWire, groups: list[str]) -> Snapshot:
    """One FindCoordinator v4 for every group at once: group -> (error code, node id)."""
    body = {"key_type": 0, "coordinator_keys": groups}
    answer = wire.request(FIND_COORDINATOR, 4, body)
    return {c.key: (int(c.error_code), int(c.node_id)) for c in answer.coordinators}


@dataclass
class Poller:
    """FindCoordinator for ``groups`` (and the ``probe`` group nobody holds) at every broker,
    over and over on a thread, until ``stop``: each broker's answers in order."""

    brokers: list[BrokerProcess]
    groups: list[str]
    probe: str
    seen: dict[int, list[Snapshot]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def run(self) -> None:
        try:
            wires = [KafkaWire(b.bootstrap, timeout_s=60) for b in self.brokers]
            try:
                while not self.stop.is_set():
                    for broker, wire in zip(self.brokers, wires, strict=True):
                        answer = find_all(wire, [self.probe, *self.groups])
                        self.seen.setdefault(broker.port, []).append(answer)
            finally:
                for wire in wires:
                    wire.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


def named_after_knowing(answers: list[Snapshot], probe: str, drained: int) -> list[Snapshot]:
    """The answers, from the first in which the broker left the drained broker out of the
    probe group's pick (it knows of the drain from then on), that name the drained broker for
    a group."""
    knows = itertools.dropwhile(lambda a: a[probe] == (ErrorCode.NONE, drained), answers)
    return [a for a in knows if any(node == drained for _, node in a.values())]


def test_no_broker_names_a_drained_coordinator_for_its_groups_during_the_handoff(
    broker_cluster: BrokerCluster,
) -> None:
    """While ``POST /drain`` hands the drained broker's groups over, FindCoordinator at every
    broker (the drained one too), asked over and over, never names the drained broker for a
    group once that broker knows of the drain (its pick for a group nobody holds leaves the
    drained broker out): not while the drained broker still holds the group's lease (it refuses
    the group already), nor after the release. Each group's commit then lands at the other
    broker with its offsets. The groups are ones whose pick among both brokers is the drained
    one, so a broker that saw a release before the draining mark would name it."""
    leaving = broker_cluster.start(**STEADY)
    staying = broker_cluster.start(**STEADY)
    ids = node_ids(leaving)
    leaving_id, staying_id = ids[leaving.port], ids[staying.port]
    both = [leaving_id, staying_id]
    groups = groups_picked_at(leaving_id, both, DRAINED_GROUPS, "drained")
    probe = groups_picked_at(leaving_id, both, 1, "probe")[0]
    create_topics(leaving.bootstrap, [TOPIC], 1)
    with KafkaWire(leaving.bootstrap, timeout_s=60) as wire:
        for offset, group in enumerate(groups):  # each group's lease is taken at `leaving`
            assert commit(wire, offset, group) == ErrorCode.NONE
        assert set(find_all(wire, groups).values()) == {(ErrorCode.NONE, leaving_id)}
    poller = Poller([leaving, staying], groups, probe)
    thread = threading.Thread(target=poller.run, name="find-coordinator-poller", daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(poller.seen) == 2, DEADLINE_S, "the poller's first answers")
        assert leaving.http("POST", "/drain", timeout_s=60)[0] == 200
        moved = dict.fromkeys([probe, *groups], (ErrorCode.NONE, staying_id))
        wait_for(
            lambda: all(poller.seen[b.port][-1] == moved for b in (leaving, staying)),
            DEADLINE_S,
            f"every broker to name {staying_id} for every group",
            lambda: str({b.port: poller.seen[b.port][-1] for b in (leaving, staying)}),
        )
    finally:
        poller.stop.set()
        thread.join(60)
    assert poller.error is None, poller.error
    for broker in (leaving, staying):
        named = named_after_knowing(poller.seen[broker.port], probe, leaving_id)
        assert not named, (
            f"FindCoordinator at broker {ids[broker.port]} named the drained {leaving_id} "
            f"after leaving it out of its pick ({len(named)} of "
            f"{len(poller.seen[broker.port])} answers), first: {named[0]}"
        )
    with KafkaWire(staying.bootstrap, timeout_s=60) as wire:
        for offset, group in enumerate(groups):
            assert committed(wire, group) == offset  # nothing lost at the hand-off
            assert commit(wire, offset + 10, group) == ErrorCode.NONE
            assert committed(wire, group) == offset + 10
    assert leaving.alive, "drained, not stopped"
