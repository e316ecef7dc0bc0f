"""A model-based test of the read path (issue 29): Hypothesis drives real broker processes.

Random interleavings of produce (one record per request, awaited, so one segment each; whole
batches; several producers at once), consumers at random positions with random ``max_bytes``,
with and without incremental fetch sessions, DeleteRecords (the log start moves; the janitor
deletes objects below it every second), retention by time and by size (``retention.ms`` or
``retention.bytes`` set on the topic until the janitor moves the log start, then removed),
ListOffsets by timestamp (the partition's time marks),
and broker restarts, graceful (a handoff) or SIGKILL, each one moving partition ownership.
Partitions get past every window the read path keeps: the 32 segments named in the state, the
listing windows cached by the reader (a stale one hid acked records on a running broker), the
segment cache (one broker runs with none, the other with the default), the time marks, the
janitor's size ledger.

The model is the list of acked batches per partition (base offset, record count, timestamp)
and the log start. After every step, on every broker: every acked record from the log start
up is read at its offset, in the batch it was acked in, and a fetch returns data whenever the
high watermark is ahead of the position (a fetch always may return its first batch).
"""

from __future__ import annotations

import os
import random
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from harness.batches import make_batch
from harness.brokers import BrokerCluster
from harness.kafka_wire import FETCH, PRODUCE, KafkaWire, fetch_body, produce_body
from harness.topics import create_topics

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration

READ_WHOLE_MS = 30_000  # a max_wait no read of the model's few hundred segments outlasts

LIST_OFFSETS, DELETE_RECORDS = 2, 21
PARTITIONS = 2
_HEADER = struct.Struct(">qiibIhiqqqhii")  # a v2 batch's 61-byte header


@dataclass(frozen=True)
class Batch:
    base: int
    count: int
    timestamp: int  # of its first record; record i has timestamp + i
    size: int  # bytes, as produced and as stored


@dataclass
class PartitionModel:
    batches: dict[int, Batch] = field(default_factory=dict)  # by base offset
    high_watermark: int = 0
    log_start: int = 0
    acked_at_ms: dict[int, int] = field(default_factory=dict)  # wall clock, by base offset

    def batch_holding(self, offset: int) -> Batch:
        return max((b for b in self.batches.values() if b.base <= offset), key=lambda b: b.base)

    def first_at_or_after(self, timestamp: int) -> int:
        """ListOffsets' answer: the first offset from the log start with a timestamp at or
        after ``timestamp`` (-1: none)."""
        for base in sorted(self.batches):
            batch = self.batches[base]
            for i in range(batch.count):
                offset = base + i
                if offset >= self.log_start and batch.timestamp + i >= timestamp:
                    return offset
        return -1


def read_batches(records: bytes | None) -> list[Batch]:
    data = records or b""
    found, position = [], 0
    while len(data) - position >= _HEADER.size:
        fields = _HEADER.unpack_from(data, position)
        if position + 12 + fields[1] > len(data):
            break
        found.append(Batch(fields[0], fields[12], fields[7], 12 + fields[1]))
        position += 12 + fields[1]
    return found


class Cluster:
    """Two brokers, one of them with no segment cache; requests go to whichever answers."""

    def __init__(self, cluster: BrokerCluster) -> None:
        self.cluster = cluster
        self.brokers: list[BrokerProcess] = cluster.brokers

    def produce(self, topic: str, partition: int, batch: bytes) -> int:
        """The base offset the batch was acked at, trying the brokers until the owner takes it
        (a partition moves while a restarted broker's lease ends). A broker that has not seen a
        new topic from the etcd watch yet answers UNKNOWN_TOPIC_OR_PARTITION, which Kafka
        clients retry too (librdkafka creates the topic through whichever broker it calls the
        controller)."""
        deadline = time.monotonic() + 30
        while True:
            for broker in self.brokers:
                with KafkaWire(broker.bootstrap) as wire:
                    response = wire.request(PRODUCE, 9, produce_body(topic, partition, batch))
                answer = response.responses[0].partition_responses[0]
                if answer.error_code == ErrorCode.NONE:
                    return int(answer.base_offset)
                assert answer.error_code in (
                    ErrorCode.NOT_LEADER_OR_FOLLOWER,
                    ErrorCode.REQUEST_TIMED_OUT,
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                ), answer
            assert time.monotonic() < deadline, "no broker took the produce"
            time.sleep(0.1)


class FetchModel:
    """The model and the steps; each step acts on the brokers and checks their answers."""

    def __init__(self, cluster: Cluster, topic: str) -> None:
        self.cluster = cluster
        self.topic = topic
        self.model = [PartitionModel() for _ in range(PARTITIONS)]
        self.clock = 1_700_000_000_000
        create_topics(cluster.brokers[0].bootstrap, [topic], partitions=PARTITIONS)

    # --- producing -----------------------------------------------------------------------

    def _acked(self, partition: int, base: int, count: int, timestamp: int, size: int) -> None:
        model = self.model[partition]
        model.batches[base] = Batch(base, count, timestamp, size)
        model.acked_at_ms[base] = int(time.time() * 1000)
        model.high_watermark = max(model.high_watermark, base + count)

    def _batch(self, count: int) -> tuple[bytes, int]:
        self.clock += 1000
        timestamp = self.clock
        return make_batch(0, [b"v%d" % i for i in range(count)], timestamp_ms=timestamp), timestamp

    def produce_one_by_one(self, partition: int, count: int) -> None:
        """Each record its own awaited produce: one segment each."""
        for _ in range(count):
            batch, timestamp = self._batch(1)
            base = self.cluster.produce(self.topic, partition, batch)
            self._acked(partition, base, 1, timestamp, len(batch))

    def produce_a_batch(self, partition: int, count: int) -> None:
        batch, timestamp = self._batch(count)
        base = self.cluster.produce(self.topic, partition, batch)
        self._acked(partition, base, count, timestamp, len(batch))

    def produce_concurrently(self, partition: int, producers: int, each: int) -> None:
        batches = [[self._batch(1 + (i + n) % 3) for n in range(each)] for i in range(producers)]
        acked: list[tuple[int, int, int, int]] = []
        lock = threading.Lock()
        failures: list[BaseException] = []

        def run(mine: list[tuple[bytes, int]]) -> None:
            try:
                for batch, timestamp in mine:
                    base = self.cluster.produce(self.topic, partition, batch)
                    with lock:
                        acked.append((base, _count(batch), timestamp, len(batch)))
            except BaseException as exc:  # reported below, in the test's thread
                failures.append(exc)

        threads = [threading.Thread(target=run, args=(mine,)) for mine in batches]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures, failures
        for base, count, timestamp, size in acked:
            self._acked(partition, base, count, timestamp, size)

    # --- reading -------------------------------------------------------------------------

    def fetch_at_a_random_position(
        self, broker: int, partition: int, where: float, max_bytes: int, version: int
    ) -> None:
        model = self.model[partition]
        position = model.log_start + int(where * (model.high_watermark - model.log_start))
        # The fill is checked within a max_wait no read outlasts (past it a read answers with
        # what it holds: test_fetch_backlog.py); a fetch with records is answered when its
        # read ends, and one at the high watermark waits for nothing.
        wait_ms = READ_WHOLE_MS if position < model.high_watermark else 0
        body = fetch_body(self.topic, partition, position, wait_ms, max_bytes=max_bytes)
        with KafkaWire(self.cluster.brokers[broker].bootstrap) as wire:
            answer = wire.request(FETCH, version, body).responses[0].partitions[0]
        assert answer.error_code == ErrorCode.NONE, answer.error_code
        batches = read_batches(answer.records)
        self._check_run(model, position, batches)
        self._check_fill(model, position, batches, max_bytes, int(answer.high_watermark))

    def consume_through_a_session(self, broker: int, where: list[float], max_bytes: int) -> None:
        """An incremental fetch session over every partition: each response carries records
        while any partition is behind, and every partition is read to its end."""
        positions = {
            p: m.log_start + int(w * (m.high_watermark - m.log_start))
            for p, (m, w) in enumerate(zip(self.model, where, strict=True))
        }
        ends = {p: m.high_watermark for p, m in enumerate(self.model)}
        session, epoch = 0, 0
        with KafkaWire(self.cluster.brokers[broker].bootstrap) as wire:
            for _ in range(sum(ends.values()) + 5):
                if positions == ends and epoch > 0:
                    break
                body = _session_body(self.topic, session, epoch, positions, max_bytes)
                response = wire.request(FETCH, 12, body)
                assert response.error_code == ErrorCode.NONE
                session, epoch = response.session_id, epoch + 1
                served = 0
                for part in response.responses[0].partitions if response.responses else []:
                    p = int(part.partition_index)
                    assert part.error_code == ErrorCode.NONE
                    batches = read_batches(part.records)
                    self._check_run(self.model[p], positions[p], batches)
                    if batches:
                        positions[p] = batches[-1].base + batches[-1].count
                        served += 1
                if positions != ends:
                    assert served, f"a session response without records at {positions} < {ends}"
        assert positions == ends

    def list_offsets_by_timestamp(self, partition: int, back: int) -> None:
        model = self.model[partition]
        targets = sorted({b.timestamp for b in model.batches.values()})
        target = targets[-1 - min(back, len(targets) - 1)] + 1 if targets else self.clock
        for broker in self.cluster.brokers:
            body = {
                "replica_id": -1,
                "isolation_level": 0,
                "topics": [
                    {
                        "name": self.topic,
                        "partitions": [
                            {
                                "partition_index": partition,
                                "current_leader_epoch": -1,
                                "timestamp": target,
                            }
                        ],
                    }
                ],
            }
            with KafkaWire(broker.bootstrap) as wire:
                answer = wire.request(LIST_OFFSETS, 7, body).topics[0].partitions[0]
            assert answer.error_code == ErrorCode.NONE
            assert int(answer.offset) == model.first_at_or_after(target)

    # --- the log start, and the brokers ----------------------------------------------------

    def delete_records(self, partition: int, where: float) -> None:
        model = self.model[partition]
        offset = model.log_start + int(where * (model.high_watermark - model.log_start))
        body = {
            "topics": [
                {
                    "name": self.topic,
                    "partitions": [{"partition_index": partition, "offset": offset}],
                }
            ],
            "timeout": 10_000,
        }
        deadline = time.monotonic() + 30
        while True:
            codes = []
            for broker in self.cluster.brokers:
                with KafkaWire(broker.bootstrap) as wire:
                    answer = wire.request(DELETE_RECORDS, 2, body).topics[0].partitions[0]
                codes.append(int(answer.error_code))
                if answer.error_code == ErrorCode.NONE:
                    model.log_start = max(model.log_start, offset)
                    assert int(answer.low_watermark) == model.log_start
                    return
            assert time.monotonic() < deadline, codes
            time.sleep(0.1)

    def retain(self, partition: int, by_bytes: bool, where: float) -> None:
        """Retention by size (``retention.bytes`` at a fraction of what ``partition`` holds) or
        by time (``retention.ms`` reaching back to a batch of it acked midway), set on the topic
        until the janitor moves that partition's log start, then removed. It applies to every
        partition: each new log start is a batch boundary (whole segments go), never past the
        high watermark; by size, what stays of each fits the limit."""
        model = self.model[partition]
        kept = [b for b in model.batches.values() if b.base + b.count > model.log_start]
        if len(kept) < 2:
            return
        if by_bytes:
            name, value = "retention.bytes", max(1, int(sum(b.size for b in kept) * where))
        else:
            middle = sorted(kept, key=lambda b: b.base)[int(where * (len(kept) - 1))]
            age_ms = int(time.time() * 1000) - model.acked_at_ms[middle.base]
            name, value = "retention.ms", max(1, age_ms)
        before = [m.log_start for m in self.model]
        self._alter_topic(name, str(value))
        try:
            moved = self._wait_for_log_start(partition, lambda start: start > model.log_start, 15)
        finally:
            self._alter_topic(name, None)
        time.sleep(1.5)  # a check that read the limit before it went may still finish
        for p, m in enumerate(self.model):
            start = self._log_start(p)
            assert start >= before[p], (p, start, before[p])
            assert start == m.high_watermark or start in m.batches, (p, start, before[p])
            if by_bytes and start > before[p]:
                assert sum(b.size for b in m.batches.values() if b.base >= start) <= value
            m.log_start = start
        assert model.log_start >= moved
        if not by_bytes:
            assert model.log_start > before[partition], "retention.ms expired nothing"

    def _alter_topic(self, name: str, value: str | None) -> None:
        operation = AlterConfigOpType.DELETE if value is None else AlterConfigOpType.SET
        entry = ConfigEntry(name, value or "", incremental_operation=operation)
        resource = ConfigResource(ResourceType.TOPIC, self.topic, incremental_configs=[entry])
        admin = AdminClient({"bootstrap.servers": self.cluster.brokers[0].bootstrap})
        admin.incremental_alter_configs([resource])[resource].result(30)

    def _log_start(self, partition: int) -> int:
        """The log start the partition's owner answers with (the brokers agree on it after
        every step: the check after it waits for that)."""
        starts = []
        for broker in self.cluster.brokers:
            body = fetch_body(self.topic, partition, self.model[partition].high_watermark)
            with KafkaWire(broker.bootstrap) as wire:
                answer = wire.request(FETCH, 11, body).responses[0].partitions[0]
            starts.append(int(answer.log_start_offset))
        return max(starts)

    def _wait_for_log_start(
        self, partition: int, done: Callable[[int], bool], bound_s: float
    ) -> int:
        deadline = time.monotonic() + bound_s
        while True:
            start = self._log_start(partition)
            if done(start) or time.monotonic() > deadline:
                return start
            time.sleep(0.2)

    def restart_a_broker(self, broker: int, crash: bool) -> None:
        """Its partitions move to the other broker (a handoff, or after a crash on the
        restart, which ends the dead broker's session); its memory (caches, listings,
        sessions) is gone."""
        process = self.cluster.brokers[broker]
        if crash:
            process.kill()
        else:
            process.stop()
        process.start()

    # --- after every step ----------------------------------------------------------------

    def every_acked_record_is_read_from_every_broker(self) -> None:
        for broker in self.cluster.brokers:
            with KafkaWire(broker.bootstrap) as wire:
                for partition in range(PARTITIONS):
                    self._read_everything(wire, partition)

    def _read_everything(self, wire: KafkaWire, partition: int) -> None:
        model = self.model[partition]
        position = model.log_start
        while position < model.high_watermark:
            body = fetch_body(self.topic, partition, position, READ_WHOLE_MS)
            answer = wire.request(FETCH, 11, body).responses[0].partitions[0]
            assert answer.error_code == ErrorCode.NONE, (position, answer.error_code)
            batches = read_batches(answer.records)
            self._check_run(model, position, batches)
            self._check_fill(model, position, batches, 1 << 20, int(answer.high_watermark))
            position = batches[-1].base + batches[-1].count
        # At the end: the high watermark and log start as acked (the view of a broker that
        # does not own the partition follows etcd's watch: a moment's lag is allowed).
        deadline = time.monotonic() + 5
        while True:
            at_end = fetch_body(self.topic, partition, model.high_watermark)
            answer = wire.request(FETCH, 11, at_end).responses[0].partitions[0]
            below = fetch_body(self.topic, partition, model.log_start - 1)
            under = wire.request(FETCH, 11, below).responses[0].partitions[0]
            settled = (
                answer.error_code == ErrorCode.NONE
                and int(answer.high_watermark) == model.high_watermark
                and int(answer.log_start_offset) == model.log_start
                and not answer.records
                and (model.log_start == 0 or under.error_code == ErrorCode.OFFSET_OUT_OF_RANGE)
            )
            if settled:
                return
            assert time.monotonic() < deadline, (answer, under)
            time.sleep(0.05)

    def _check_fill(
        self,
        model: PartitionModel,
        position: int,
        batches: list[Batch],
        max_bytes: int,
        high_watermark: int,
    ) -> None:
        """Kafka's limit: the batches from ``position`` while they fit in ``max_bytes``, the
        first one whatever its size, up to the high watermark the broker answered with (a
        broker that does not own the partition may see a commit a moment late, never one
        that did not happen)."""
        assert high_watermark <= model.high_watermark
        end = min(high_watermark, model.high_watermark)
        if position >= end:
            assert not batches
            return
        expected: list[Batch] = []
        total = 0
        batch = model.batch_holding(position)
        while True:
            if expected and total + batch.size > max_bytes:
                break
            expected.append(batch)
            total += batch.size
            following = batch.base + batch.count
            if following >= end:
                break
            batch = model.batches[following]
        assert batches == expected, (position, max_bytes, len(batches), len(expected))

    def _check_run(self, model: PartitionModel, position: int, batches: list[Batch]) -> None:
        """``batches`` are the acked ones, in order, from the one holding ``position``."""
        if not batches:
            return
        expected = model.batch_holding(position)
        for batch in batches:
            assert batch == expected, (position, batch, expected)
            following = expected.base + expected.count
            if following >= model.high_watermark:
                break
            expected = model.batches[following]


def _count(batch: bytes) -> int:
    return int(_HEADER.unpack_from(batch)[12])


def _session_body(
    topic: str, session: int, epoch: int, positions: dict[int, int], max_bytes: int
) -> dict[str, Any]:
    body: dict[str, Any] = fetch_body(topic, 0, 0, max_bytes=max_bytes)
    template = body["topics"][0]["partitions"][0]
    body["session_id"], body["session_epoch"] = session, epoch
    body["topics"] = [
        {
            "topic": topic,
            "partitions": [
                template | {"partition": p, "fetch_offset": o, "partition_max_bytes": 1 << 20}
                for p, o in positions.items()
            ],
        }
    ]
    return body


Run = Callable[[FetchModel, random.Random], None]
STEPS: list[tuple[str, int, Run]] = []  # (name, weight, run with random arguments)


def step(weight: int) -> Callable[[Run], Run]:
    def register(run: Run) -> Run:
        STEPS.append((run.__name__, weight, run))
        return run

    return register


@step(5)
def produce_one_by_one(m: FetchModel, r: random.Random) -> None:
    """Mostly to partition 0, often past the 32 segments the state names."""
    m.produce_one_by_one(r.choice([0, 0, 1]), r.choice([1, 3, 20, 40]))


@step(2)
def produce_a_batch(m: FetchModel, r: random.Random) -> None:
    m.produce_a_batch(r.randrange(PARTITIONS), r.randint(2, 60))


@step(2)
def produce_concurrently(m: FetchModel, r: random.Random) -> None:
    m.produce_concurrently(r.randrange(PARTITIONS), r.randint(2, 4), r.randint(1, 8))


@step(5)
def fetch(m: FetchModel, r: random.Random) -> None:
    max_bytes = r.choice([1, 100, 700, 5000, 1 << 20])
    version = r.choice([4, 11, 12])
    m.fetch_at_a_random_position(
        r.randrange(2), r.randrange(PARTITIONS), r.random(), max_bytes, version
    )


@step(3)
def session(m: FetchModel, r: random.Random) -> None:
    where = [r.random() for _ in range(PARTITIONS)]
    m.consume_through_a_session(r.randrange(2), where, r.choice([1, 300, 4000, 1 << 20]))


@step(2)
def list_offsets_by_time(m: FetchModel, r: random.Random) -> None:
    m.list_offsets_by_timestamp(r.randrange(PARTITIONS), r.randint(0, 3))


@step(2)
def delete_records(m: FetchModel, r: random.Random) -> None:
    m.delete_records(r.randrange(PARTITIONS), r.random() * 0.5)


@step(1)
def retain(m: FetchModel, r: random.Random) -> None:
    m.retain(r.randrange(PARTITIONS), by_bytes=r.random() < 0.5, where=0.3 + r.random() * 0.5)


@step(1)
def restart(m: FetchModel, r: random.Random) -> None:
    m.restart_a_broker(r.randrange(2), crash=r.random() < 0.3)


# Seeds whose walks take every kind of step between them (the test checks it), in ~40 s.
# More walks by hand: FETCH_MODEL_SEEDS=1,2,3 .venv/bin/pytest tests/integration/test_fetch_model.py
DEFAULT_SEEDS, STEPS_PER_WALK = (2, 4, 29), 14
SEEDS = tuple(int(s) for s in os.environ.get("FETCH_MODEL_SEEDS", "").split(",") if s)


def walk(cluster: Cluster, seed: int) -> list[str]:
    """``STEPS_PER_WALK`` random steps on a new topic, checking every broker after each; the
    steps taken so far are in the assertion message of a failure (replay with the seed)."""
    rng = random.Random(seed)
    machine = FetchModel(cluster, f"model-{seed}-{time.monotonic_ns()}")
    # Every walk starts past the state's 32 recent segments: the reads after each step keep
    # listing windows that later commits must not make stale.
    machine.produce_one_by_one(0, 40)
    machine.every_acked_record_is_read_from_every_broker()
    done: list[str] = ["produce_one_by_one"]
    weights = [weight for _, weight, _ in STEPS]
    for _ in range(STEPS_PER_WALK):
        ((name, _, run),) = rng.choices(STEPS, weights)
        done.append(name)
        try:
            run(machine, rng)
            machine.every_acked_record_is_read_from_every_broker()
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}, after {done}: {exc}") from exc
    print(f"seed {seed}: {done}")  # shown with -s: what a walk covered
    return done


def test_acked_records_stay_readable_under_random_interleavings(
    broker_cluster: BrokerCluster,
) -> None:
    broker_cluster.extra_env.update(
        {
            "KAFSCALE_LOG__FLUSH_INTERVAL_MS": "20",
            "KAFSCALE_LOG__RETENTION_CHECK_INTERVAL_S": "1",
        }
    )
    broker_cluster.start(KAFSCALE_LOG__CACHE_BYTES="0")
    broker_cluster.start()
    cluster = Cluster(broker_cluster)
    taken = [walk(cluster, seed) for seed in SEEDS or DEFAULT_SEEDS]
    assert all(len(steps) == STEPS_PER_WALK + 1 for steps in taken)
    if not SEEDS:
        assert {name for name, _, _ in STEPS} == {name for steps in taken for name in steps}
