"""Kafka Connect in distributed mode against KafScale brokers, as its users run it.

Two ``ConnectDistributed`` workers (Apache Kafka 4.3.0) form one Connect cluster on two brokers:
the Connect group protocol (``connect`` protocol type, sessioned subprotocol, incremental
cooperative rebalancing), the leader writing the config topic, internal topics created with
``cleanup.policy=compact`` and checked through DescribeConfigs, source offsets in the offsets
topic, sink offsets committed by a consumer group. A FileStreamSource → topic → FileStreamSink
pipeline copies lines exactly; a SIGKILLed worker's tasks move to the other and resume from the
stored offsets; a restarted worker takes them back the same way. docs/kafka-connect.md.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource
from harness.brokers import BrokerCluster
from harness.kafka_connect import (
    ConnectWorker,
    compiled_plugin,
    put_connector,
    rest,
    running_on,
    status,
    wait_for,
    worker_classpath,
)
from harness.postgres import PostgresServer
from harness.topics import create_topic

# Up to four JVM starts a test (5-40 s each on two loaded cores) and the waits below: the
# suite's 300 s would cut a slow run short before its own bounds say what it waited for.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

GROUP = "connect-cluster"
TOPIC = "lines"
WAIT_S = 90.0  # upper bounds for a loaded machine; a passing run waits far less
# A crashed worker's tasks wait this long for it to come back before they move (Connect's
# default is 5 minutes); the session timeout bounds how long a crash goes unnoticed.
FAST_FAILOVER = {
    "scheduled.rebalance.max.delay.ms": "1000",
    "session.timeout.ms": "6000",
    "heartbeat.interval.ms": "1000",
    "offset.flush.interval.ms": "500",
}
# The brokers let a group that forms from empty (the first worker, and a restarted worker once
# the crashed one's session ended) go on after 200 ms rather than Kafka's 3 s: what the tests
# check is the failover, not how long a new group waits for more members.
BROKER_ENV = {"KAFSCALE_GROUPS__INITIAL_REBALANCE_DELAY_MS": "200"}


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[ConnectWorker]]:
    """Workers a test starts (appended to the list); SIGKILLed at teardown."""
    started: list[ConnectWorker] = []
    try:
        yield started
    finally:
        for worker in started:
            worker.kill()


def new_worker(
    started: list[ConnectWorker],
    cluster: BrokerCluster,
    tmp_path: Path,
    name: str,
    extra: dict[str, str] | None = None,
    plugins: Path | None = None,
) -> ConnectWorker:
    classpath = worker_classpath() + (f"{os.pathsep}{plugins}" if plugins else "")
    worker = ConnectWorker(name, tmp_path, cluster.bootstrap, GROUP, classpath)
    worker.extra.update({**FAST_FAILOVER, **(extra or {})})
    started.append(worker)
    return worker.launch()


def write_lines(path: Path, first: int, last: int) -> None:
    with path.open("a") as out:
        out.writelines(f"line-{i}\n" for i in range(first, last + 1))


def expected(last: int) -> list[str]:
    return [f"line-{i}" for i in range(1, last + 1)]


def sink_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def wait_sink(path: Path, last: int, worker: ConnectWorker) -> None:
    """Until the sink file holds at least ``last`` lines; the caller compares them exactly."""
    wait_for(
        lambda: len(sink_lines(path)) >= last,
        WAIT_S,
        lambda: f"sink has {len(sink_lines(path))} lines, want {last}:\n{worker.tail()}",
    )


def topic_values(bootstrap: str, count: int) -> list[str]:
    """The values of the topic's first ``count`` records (JSON strings, as JsonConverter
    writes them)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "check", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    values: list[str] = []
    try:
        wait_for(
            lambda: _poll_into(consumer, values) >= count,
            WAIT_S,
            lambda: f"topic has {len(values)} records, want {count}",
        )
    finally:
        consumer.close()
    return values


def _poll_into(consumer: Consumer, values: list[str]) -> int:
    for message in consumer.consume(100, 0.5):
        assert message.error() is None, message.error()
        values.append((message.value() or b"").decode())
    return len(values)


def source_position(worker: ConnectWorker) -> int | None:
    """The file position stored in the offsets topic for the source (KIP-875's REST read)."""
    try:
        offsets: dict[str, Any] = rest("GET", f"{worker.url}/connectors/source/offsets")
    except urllib.error.HTTPError:  # busy rebalancing: ask again
        return None
    found = offsets["offsets"]
    return int(found[0]["offset"]["position"]) if found else None


def sink_committed(bootstrap: str) -> int:
    """The sink's committed offset (its consumer group is ``connect-<connector>``)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "connect-sink"})
    try:
        [tp] = consumer.committed([TopicPartition(TOPIC, 0)], timeout=10)
        return int(tp.offset)
    finally:
        consumer.close()


def wait_offsets_stored(worker: ConnectWorker, source: Path, bootstrap: str, last: int) -> None:
    """Until both pipelines' positions are stored: the source's file position in the offsets
    topic and the sink group's committed offset. A crash after that must cost no duplicate."""
    size = source.stat().st_size
    wait_for(
        lambda: source_position(worker) == size and sink_committed(bootstrap) == last,
        WAIT_S,
        lambda: f"offsets not stored ({source_position(worker)} of {size}):\n{worker.tail()}",
    )


def internal_topic_policies(bootstrap: str) -> dict[str, str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = [f"{GROUP}-{kind}" for kind in ("configs", "offsets", "status")]
    futures = admin.describe_configs([ConfigResource("topic", n) for n in names])
    return {r.name: f.result(30)["cleanup.policy"].value for r, f in futures.items()}


def test_file_pipeline_survives_worker_crash_and_restart(
    broker_cluster: BrokerCluster, workers: list[ConnectWorker], tmp_path: Path
) -> None:
    broker_cluster.start(**BROKER_ENV)
    broker_cluster.start(**BROKER_ENV)
    bootstrap = broker_cluster.bootstrap
    create_topic(bootstrap, TOPIC, 1)  # one partition: the sink sees the file's order
    source, sink = tmp_path / "in.txt", tmp_path / "out.txt"
    source.touch()

    a = new_worker(workers, broker_cluster, tmp_path, "a")
    b = new_worker(workers, broker_cluster, tmp_path, "b")
    a.wait_ready()
    b.wait_ready()
    # Connect created its internal topics compacted and checked them (it refuses to start
    # otherwise); KafScale keeps every record of them, which Connect reads correctly.
    assert set(internal_topic_policies(bootstrap).values()) == {"compact"}

    put_connector(
        a,
        "source",
        {
            "connector.class": "org.apache.kafka.connect.file.FileStreamSourceConnector",
            "file": str(source),
            "topic": TOPIC,
        },
    )
    put_connector(
        b,  # through the follower: forwarded to the leader over REST
        "sink",
        {
            "connector.class": "org.apache.kafka.connect.file.FileStreamSinkConnector",
            "file": str(sink),
            "topics": TOPIC,
        },
    )
    write_lines(source, 1, 40)
    wait_sink(sink, 40, a)
    assert sink_lines(sink) == expected(40)
    assert topic_values(bootstrap, 40) == [f'"{line}"' for line in expected(40)]

    # Crash the worker running the source task once every position is stored.
    wait_offsets_stored(a, source, bootstrap, 40)
    owner = wait_for(lambda: running_on(a, "source"), WAIT_S, a.tail)
    crashed, survivor = (a, b) if owner == a.worker_id else (b, a)
    crashed.kill()
    write_lines(source, 41, 80)
    for connector in ("source", "sink"):
        wait_for(
            lambda: running_on(survivor, connector) == survivor.worker_id,  # noqa: B023
            WAIT_S,
            lambda: f"{connector} did not move:\n{survivor.tail()}",  # noqa: B023
        )
    wait_sink(sink, 80, survivor)
    assert sink_lines(sink) == expected(80)  # resumed from the stored offsets: no duplicate

    # Restart the crashed worker, stop the survivor: the tasks move back and resume again.
    restarted = new_worker(workers, broker_cluster, tmp_path, f"{crashed.name}-restarted")
    restarted.wait_ready()
    survivor.stop()
    write_lines(source, 81, 120)
    for connector in ("source", "sink"):
        wait_for(
            lambda: running_on(restarted, connector) == restarted.worker_id,  # noqa: B023
            WAIT_S,
            lambda: f"{connector} did not move back:\n{restarted.tail()}",  # noqa: B023
        )
    wait_sink(sink, 120, restarted)
    assert sink_lines(sink) == expected(120)


def committed_values(
    bootstrap: str, topic: str, count: int, until: Callable[[list[str]], bool] | None = None
) -> list[str]:
    """The values a read_committed consumer reads from ``topic`` (partition 0), waiting for
    ``count`` of them (and for ``until`` to hold), then half a second more for any surplus."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "check-committed",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[str] = []

    def enough() -> bool:
        return _poll_into(consumer, values) >= count and (until is None or until(values))

    try:
        wait_for(
            enough, WAIT_S, lambda: f"{topic} has {len(values)} committed records, want {count}"
        )
        _poll_into(consumer, values)
    finally:
        consumer.close()
    return values


def test_exactly_once_source_survives_a_crash_mid_stream(
    broker_cluster: BrokerCluster, workers: list[ConnectWorker], tmp_path: Path
) -> None:
    """``exactly.once.source.support=enabled``: the source task writes each poll's records and
    its file position in one transaction (the offsets topic is read read_committed). A worker
    SIGKILLed while lines stream in leaves an open transaction; the restarted worker's task
    fences it (InitProducerId on the same transactional id) and resumes from the committed
    position: a read_committed reader sees every line exactly once."""
    broker_cluster.start(KAFSCALE_TRANSACTIONS__CHECK_INTERVAL_MS="200", **BROKER_ENV)
    bootstrap = broker_cluster.bootstrap
    create_topic(bootstrap, TOPIC, 1)
    source = tmp_path / "in.txt"
    source.touch()
    eos = {"exactly.once.source.support": "enabled"}
    plugins = compiled_plugin(Path(__file__).with_name("java") / "CountingSource.java")

    worker = new_worker(workers, broker_cluster, tmp_path, "eos", eos)
    worker.wait_ready()
    put_connector(
        worker,
        "source",
        {
            "connector.class": "org.apache.kafka.connect.file.FileStreamSourceConnector",
            "file": str(source),
            "topic": TOPIC,
            "exactly.once.support": "required",
            "transaction.boundary": "poll",
        },
    )
    write_lines(source, 1, 20)
    assert committed_values(bootstrap, TOPIC, 20) == [f'"{x}"' for x in expected(20)]

    for first in range(21, 400, 20):  # lines keep coming while the worker dies
        write_lines(source, first, first + 19)
        time.sleep(0.05)
        if first == 201:
            worker.kill()
    restarted = new_worker(workers, broker_cluster, tmp_path, "eos-restarted", eos, plugins)
    restarted.wait_ready()
    assert committed_values(bootstrap, TOPIC, 400) == [f'"{x}"' for x in expected(400)]

    # Zombie fencing: a connector whose task count changes has the previous generation's
    # transactional producers fenced (Admin.fenceProducers → InitProducerId) before its new
    # tasks start; a failed fencing round leaves the new tasks unstarted.
    create_topic(bootstrap, "counts", 1)
    counting = {"connector.class": "CountingSource", "topic": "counts"}
    put_connector(restarted, "counting", {**counting, "tasks.max": "2"})
    wait_for(lambda: running_tasks(restarted, "counting") == 2, WAIT_S, restarted.tail)
    put_connector(restarted, "counting", {**counting, "tasks.max": "3"})
    wait_for(lambda: running_tasks(restarted, "counting") == 3, WAIT_S, restarted.tail)
    values = committed_values(
        bootstrap, "counts", 100, lambda seen: any("task-2-" in v for v in seen)
    )
    by_task: dict[str, list[int]] = {}
    for value in values:
        _, task, count = json.loads(value).split("-")
        by_task.setdefault(task, []).append(int(count))
    assert set(by_task) == {"0", "1", "2"}, by_task.keys()
    for counts in by_task.values():  # each task resumed where its fenced predecessor stopped
        assert counts == list(range(len(counts)))


def running_tasks(worker: ConnectWorker, name: str) -> int:
    """How many of the connector's tasks run (0 while any is not RUNNING)."""
    now = status(worker, name)
    if not now or any(task["state"] != "RUNNING" for task in now["tasks"]):
        return 0
    return len(now["tasks"])


def change_events(bootstrap: str, topic: str, count: int) -> list[tuple[Any, Any]]:
    """(key, value) of the first ``count`` records of ``topic``, JSON-decoded; a tombstone's
    value is None."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "check-cdc", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    events: list[tuple[Any, Any]] = []

    def poll() -> bool:
        for message in consumer.consume(100, 0.5):
            if message.error() is not None:  # the topic may not exist yet
                continue
            value = message.value()
            events.append((json.loads(message.key()), None if value is None else json.loads(value)))
        return len(events) >= count

    try:
        wait_for(poll, WAIT_S, lambda: f"{topic} has {len(events)} events, want {count}")
    finally:
        consumer.close()
    return events


def test_debezium_postgres_changes_arrive_with_tombstones(
    broker_cluster: BrokerCluster,
    workers: list[ConnectWorker],
    postgres_server: PostgresServer,
    tmp_path: Path,
) -> None:
    """Debezium's PostgreSQL connector (pgoutput) on a distributed worker: the snapshot, an
    insert, an update and a delete arrive as change events, the delete followed by its
    tombstone, in the topic Connect created for the table through CreateTopics with
    ``cleanup.policy=compact`` (read back through DescribeConfigs); heartbeats go to
    Debezium's heartbeat topic."""
    broker_cluster.start(**BROKER_ENV)
    bootstrap = broker_cluster.bootstrap
    postgres_server.sql(
        "CREATE TABLE customers (id int PRIMARY KEY, name text);"
        "ALTER TABLE customers REPLICA IDENTITY FULL;"  # updates carry the old row too
        "INSERT INTO customers VALUES (1, 'ann'), (2, 'bob');"
    )
    worker = ConnectWorker("cdc", tmp_path, bootstrap, GROUP, worker_classpath(debezium=True))
    workers.append(worker)
    worker.launch().wait_ready()
    put_connector(
        worker,
        "pg",
        {
            "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "database.hostname": "127.0.0.1",
            "database.port": str(postgres_server.port),
            "database.user": "postgres",
            "database.password": "unused",  # trust authentication on loopback
            "database.dbname": "postgres",
            "topic.prefix": "pg",
            "plugin.name": "pgoutput",
            "table.include.list": "public.customers",
            "topic.creation.default.partitions": "1",
            "topic.creation.default.replication.factor": "1",
            "topic.creation.default.cleanup.policy": "compact",
            "heartbeat.interval.ms": "500",
        },
    )
    topic = "pg.public.customers"
    snapshot = change_events(bootstrap, topic, 2)
    assert [(k["id"], v["op"]) for k, v in snapshot] == [(1, "r"), (2, "r")]

    postgres_server.sql(
        "INSERT INTO customers VALUES (3, 'cy');"
        "UPDATE customers SET name = 'ANN' WHERE id = 1;"
        "DELETE FROM customers WHERE id = 2;"
    )
    events = change_events(bootstrap, topic, 6)[2:]
    assert [(k["id"], v and v["op"]) for k, v in events] == [
        (3, "c"),
        (1, "u"),
        (2, "d"),
        (2, None),  # the tombstone: compaction's signal to forget key 2
    ]
    assert events[1][1]["before"]["name"] == "ann" and events[1][1]["after"]["name"] == "ANN"
    assert events[2][1]["before"]["id"] == 2 and events[2][1]["after"] is None

    admin = AdminClient({"bootstrap.servers": bootstrap})
    [future] = admin.describe_configs([ConfigResource("topic", topic)]).values()
    assert future.result(30)["cleanup.policy"].value == "compact"
    heartbeats = change_events(bootstrap, "__debezium-heartbeat.pg", 1)
    assert heartbeats[0][0] == {"serverName": "pg"}
