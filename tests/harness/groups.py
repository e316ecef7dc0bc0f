"""Consumer-group tests' shared pieces: a producer thread feeding numbered records while members
join and leave, a wait that fails at once when a member thread crashed, and group members of the
three Python clients (kafka-python, aiokafka, confluent-kafka), each on its own thread.

Both the classic-group tests (kafka-python, aiokafka, confluent-kafka, directly and through the
proxy) and the consumer-protocol (KIP-848) tests check "nothing lost" the same way: record values
are sequence numbers; "nothing committed read twice" from what each member consumed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import CommitFailedError, KafkaError
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from kafka import ConsumerRebalanceListener, KafkaConsumer
from kafka.errors import KafkaError as KpKafkaError

from harness import topics

QUIET = 2
"""librdkafka log level: critical only (brokers are killed on purpose in these tests)."""

PARTITIONS = 6
"""Partitions of a group test's topic (``create_topic``); ``split_evenly`` covers them all."""
GROUP_ENV = {
    "KAFSCALE_GROUPS__INITIAL_REBALANCE_DELAY_MS": "200",
    "KAFSCALE_GROUPS__MIN_SESSION_TIMEOUT_MS": "1000",
}
"""Broker settings for group tests: a short initial rebalance delay, short sessions allowed."""
SESSION_MS = 6000
SHARED_CLIENT_ID = "shared-client"


def wait_for(
    check: Callable[[], bool], timeout_s: float, what: str, state: Callable[[], str] | None = None
) -> None:
    """Poll ``check`` until it holds. A thread that recorded an exception in ``crashed`` (a
    group member) fails the wait at once; after ``timeout_s`` it fails naming ``what`` and,
    when given, ``state()``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert_no_thread_crashed()
        if time.monotonic() > deadline:
            detail = f"; {state()}" if state is not None else ""
            raise AssertionError(f"timed out waiting for {what}{detail}")
        time.sleep(0.05)


def assert_no_thread_crashed() -> None:
    """Fail at once when a thread recorded an exception in ``crashed`` (a group member)."""
    crashed = [t for t in threading.enumerate() if getattr(t, "crashed", None) is not None]
    assert not crashed, f"{crashed[0].name} crashed: {crashed[0].crashed!r}"  # type: ignore[attr-defined]


def wait_while_progressing(
    check: Callable[[], bool],
    progress: Callable[[], object],
    what: str,
    state: Callable[[], str],
    *,
    stall_s: float,
    max_s: float,
) -> None:
    """Poll ``check`` until it holds, failing only once ``progress()`` has not changed for
    ``stall_s`` (stuck) or after ``max_s`` in all. A fixed bound on work that goes at the
    machine's pace (records read, each committed synchronously) failed slow consumers at load
    30-60 that were still reading; a stuck one still fails in ``stall_s``. The failure says
    which, and ``state()``."""
    start = time.monotonic()
    last, moved_at = progress(), start
    while not check():
        assert_no_thread_crashed()
        now, seen = time.monotonic(), progress()
        if seen != last:
            last, moved_at = seen, now
        if now - moved_at > stall_s:
            raise AssertionError(f"no progress for {stall_s:g} s waiting for {what}; {state()}")
        if now - start > max_s:
            raise AssertionError(f"timed out after {max_s:g} s waiting for {what}; {state()}")
        time.sleep(0.05)


class Feed(threading.Thread):
    """Produces numbered records (value = sequence number) until stopped; ``acked`` holds the
    values delivered, ``failed`` the deliveries that failed. ``config`` adds to (or overrides)
    the producer's settings."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        rate_per_s: float = 200,
        config: dict[str, Any] | None = None,
        flush_timeout_s: float = 30,
    ) -> None:
        super().__init__(daemon=True)
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 5,
                "acks": "all",
                "log_level": QUIET,
                **(config or {}),
            }
        )
        self.topic = topic
        self.interval_s = 1 / rate_per_s
        self.flush_timeout_s = flush_timeout_s
        self.sent = 0
        self.acked: list[int] = []
        self.failed: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.producer.produce(
                self.topic, value=str(self.sent).encode(), on_delivery=self._delivered
            )
            self.sent += 1
            self.producer.poll(0)
            time.sleep(self.interval_s)
        assert self.producer.flush(self.flush_timeout_s) == 0

    def _delivered(self, error: Any, message: Any) -> None:
        if error is not None:
            self.failed.append(str(error))
        else:
            self.acked.append(int(message.value()))

    def produce(self, count: int) -> None:
        """``count`` more numbered records at once (without starting the thread)."""
        for _ in range(count):
            self.producer.produce(self.topic, value=str(self.sent).encode())
            self.sent += 1
        assert self.producer.flush(30) == 0

    def stop(self, timeout_s: float = 40) -> None:
        self._halt.set()
        self.join(timeout_s)


# --- group members --------------------------------------------------------------------------------


def create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    topics.create_topic(bootstrap, topic, partitions, log_level=QUIET)


def wait_for_members(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    """``wait_for`` whose timeout names each live member's assignment and records read."""
    wait_for(check, timeout_s, what, members_state)


def members_state() -> str:
    """Each live member's assignment and how many records it read (for a timeout's message)."""
    members = [t for t in threading.enumerate() if isinstance(t, Member)]
    state = {m.name_: (sorted(m.assignment), len(m.consumed)) for m in members}
    return f"members {state}"


_EVENTS = itertools.count()
"""One order over every member's reads and commits (``next`` on a count is atomic in CPython)."""


@dataclass
class Consumed:
    """One record read by a member: ``read_at`` and ``committed_at`` (when its commit returned)
    are places in one order over all members, so a re-read can be told from a read that came
    first."""

    partition: int
    offset: int
    value: int
    read_at: int = field(default_factory=lambda: next(_EVENTS))
    committed_at: int | None = None

    @property
    def committed(self) -> bool:
        return self.committed_at is not None

    def mark_committed(self) -> None:
        self.committed_at = next(_EVENTS)


@dataclass
class Member(threading.Thread):
    """One group member on its own thread; subclasses wrap a client library."""

    name_: str
    bootstrap: str
    group: str
    topic: str
    config: dict[str, Any] = field(default_factory=dict)
    consumed: list[Consumed] = field(default_factory=list)
    assignment: frozenset[int] = frozenset()
    assigned: list[list[int]] = field(default_factory=list)
    revoked: list[list[int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    crashed: BaseException | None = None

    def __post_init__(self) -> None:
        threading.Thread.__init__(self, name=self.name_, daemon=True)

    def __hash__(self) -> int:
        return id(self)

    def run(self) -> None:
        try:
            self.consume()
        except BaseException as exc:
            self.crashed = exc
            raise

    def consume(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)
        assert not self.is_alive(), f"{self.name_} did not stop"

    def values(self) -> list[int]:
        return [c.value for c in self.consumed]


class ConfluentMember(Member):
    def consume(self) -> None:
        config = {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.group,
            "client.id": SHARED_CLIENT_ID,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": 500,
            "log_level": QUIET,
            **self.config,
        }
        consumer = Consumer(config)
        consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke)
        try:
            while not self.stopping.is_set():
                message = consumer.poll(0.1)
                if message is None or message.error() is not None:
                    continue
                record = Consumed(message.partition(), message.offset(), int(message.value()))
                self.consumed.append(record)
                try:
                    consumer.commit(message=message, asynchronous=False)
                    record.mark_committed()
                except KafkaException as exc:
                    self.errors.append(str(exc))
                self.assignment = frozenset(tp.partition for tp in consumer.assignment())
        finally:
            consumer.close()

    def _on_assign(self, consumer: Consumer, partitions: list[CkTopicPartition]) -> None:
        self.assigned.append(sorted(tp.partition for tp in partitions))
        self.assignment = self.assignment | {tp.partition for tp in partitions}

    def _on_revoke(self, consumer: Consumer, partitions: list[CkTopicPartition]) -> None:
        self.revoked.append(sorted(tp.partition for tp in partitions))
        self.assignment = self.assignment - {tp.partition for tp in partitions}


class _PythonClientMember(Member):
    """kafka-python and aiokafka: the same setting names and the same shape of poll result."""

    def client_config(self) -> dict[str, Any]:
        return {
            "bootstrap_servers": self.bootstrap,
            "group_id": self.group,
            "client_id": SHARED_CLIENT_ID,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            "session_timeout_ms": SESSION_MS,
            "heartbeat_interval_ms": 500,
            **self.config,
        }

    def note(self, batches: dict[Any, list[Any]]) -> list[Consumed]:
        """A poll's records, noted as consumed (not yet committed)."""
        records = [
            Consumed(tp.partition, m.offset, int(m.value))
            for tp, messages in batches.items()
            for m in messages
        ]
        self.consumed.extend(records)
        return records


class KafkaPythonMember(_PythonClientMember):
    def consume(self) -> None:
        consumer = KafkaConsumer(**self.client_config())
        consumer.subscribe([self.topic], listener=_Listener(self))
        try:
            while not self.stopping.is_set():
                batches = consumer.poll(timeout_ms=100)
                records = self.note(batches)
                if records:
                    try:
                        consumer.commit()
                        for record in records:
                            record.mark_committed()
                    except KpKafkaError as exc:
                        self.errors.append(repr(exc))
                self.assignment = frozenset(tp.partition for tp in consumer.assignment())
        finally:
            consumer.close()


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, member: Member) -> None:
        self.member = member

    def on_partitions_assigned(self, assigned: list[Any]) -> None:
        self.member.assigned.append(sorted(tp.partition for tp in assigned))

    def on_partitions_revoked(self, revoked: list[Any]) -> None:
        self.member.revoked.append(sorted(tp.partition for tp in revoked))


class AioKafkaMember(_PythonClientMember):
    def consume(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        consumer = AIOKafkaConsumer(self.topic, **self.client_config())
        await consumer.start()
        try:
            while not self.stopping.is_set():
                batches = await consumer.getmany(timeout_ms=100)
                records = self.note(batches)
                if records:
                    try:
                        await consumer.commit()
                        for record in records:
                            record.mark_committed()
                    except (CommitFailedError, KafkaError) as exc:
                        self.errors.append(repr(exc))
                self.assignment = frozenset(tp.partition for tp in consumer.assignment())
        finally:
            await consumer.stop()


@contextlib.contextmanager
def running(*members: Member) -> Iterator[None]:
    for member in members:
        member.start()
    try:
        yield
    finally:
        for member in members:
            if member.is_alive():
                member.stop()
    for member in members:
        assert member.crashed is None, f"{member.name_} crashed: {member.crashed!r}"


def split_evenly(members: list[Member]) -> bool:
    """Disjoint assignments covering every partition, every member holding some."""
    assignments = [m.assignment for m in members]
    union = frozenset().union(*assignments)
    disjoint = sum(len(a) for a in assignments) == len(union)
    return disjoint and union == frozenset(range(PARTITIONS)) and all(assignments)


def assert_no_committed_record_seen_twice(live: list[Member]) -> None:
    """A record consumed and committed is never consumed again by a live member: no read of a
    position comes after a commit of it returned."""
    reads: dict[tuple[int, int], list[tuple[int, str, Consumed]]] = {}
    for member in live:
        for record in member.consumed:
            reads.setdefault((record.partition, record.offset), []).append(
                (record.read_at, member.name_, record)
            )
    bad = {}
    for position, seen in reads.items():
        commits = [r.committed_at for _, _, r in seen if r.committed_at is not None]
        if commits and any(at > min(commits) for at, _, _ in seen):
            bad[position] = sorted((at, name, r.committed_at) for at, name, r in seen)
    assert not bad, (
        "committed records consumed again (position: [(read at, member, committed at)]): "
        f"{dict(sorted(bad.items())[:10])}"
    )


def report(members: list[Member], extra: set[int] = frozenset()) -> None:  # type: ignore[assignment]
    """What happened, for the test log (shown with -s or on failure)."""
    seen = Counter((r.partition, r.offset) for m in members for r in m.consumed)
    failed = sum(1 for m in members for r in m.consumed if not r.committed)
    print(
        f"consumed {sum(seen.values())} ({len(seen)} distinct, {len(extra)} by killed members), "
        f"repeated {sum(1 for n in seen.values() if n > 1)}, uncommitted {failed}, "
        f"rebalances {[(m.name_, len(m.assigned), len(m.revoked)) for m in members]}"
    )


@contextlib.contextmanager
def open_transaction(
    bootstrap: str, group: str, topic: str, produce_to: int, offsets: dict[int, int]
) -> Iterator[Producer]:
    """A transaction (confluent-kafka) that produced to ``produce_to`` and sent ``offsets``
    (partition: offset) for ``group`` (send_offsets_to_transaction), still open. The group
    metadata is that of a consumer that never joined (generation -1)."""
    member = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    transactional_id = f"x-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    try:
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(topic, b"in the transaction", partition=produce_to)
        sent = [CkTopicPartition(topic, p, offset) for p, offset in offsets.items()]
        producer.send_offsets_to_transaction(sent, member.consumer_group_metadata(), 30)
        yield producer
    finally:
        member.close()
