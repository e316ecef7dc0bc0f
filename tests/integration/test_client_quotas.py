"""Client quotas end to end: set and described by real admin clients, enforced by brokers.

The Java AdminClient (what ``kafka-configs.sh --entity-type users|clients`` runs) alters and
describes quotas; raw kio requests describe them too, with Kafka's filter semantics. A producer
(kafka-python, and raw produce requests) over its ``producer_byte_rate`` and a fetcher over
its ``consumer_byte_rate`` get non-zero ``throttle_time_ms``, the broker's mute holds them back
for it, and the broker's Prometheus metrics count the throttles. A quota altered through one
broker is enforced by another (every broker follows etcd), and through the proxy.

Rates are asserted as upper bounds from the broker's own accounting (bytes sent against the
time asked to wait plus the time spent): load on the machine can only make them lower.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from harness.batches import make_batch
from harness.brokers import BrokerCluster, new_cluster
from harness.etcd import harness_etcd
from harness.java_client import java_program
from harness.java_session import JavaSession
from harness.kafka_wire import KafkaWire, fetch_body, produce_body
from harness.proxy import start_proxy
from harness.s3 import S3Endpoint
from harness.secured import add_broker, authorizing_cluster, grant_cluster, kafscale_cli_calls
from harness.topics import create_topic
from kafka import KafkaProducer

from kafscale.broker.child_process import BrokerProcess, free_port_run
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.assignment import Assignment
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol import codec

pytestmark = pytest.mark.integration

PRODUCE, FETCH, DESCRIBE_QUOTAS, ALTER_QUOTAS = 0, 1, 48, 49
INVALID_REQUEST, CLUSTER_DENIED = 42, 31
JAVA_SOURCE = Path(__file__).with_name("java") / "QuotaAdmin.java"
WATCH_DEADLINE_S = 20.0


@pytest.fixture(scope="module")
def cluster(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerCluster]:
    cluster = new_cluster(
        etcd_server.client_url, s3_server, tmp_path_factory.mktemp("quotas"), "quotas"
    )
    try:
        cluster.start()
        cluster.start()
        yield cluster
    finally:
        cluster.stop_all()


@pytest.fixture
def name() -> str:
    return f"q-{uuid.uuid4().hex[:10]}"


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str


class QuotaAdmin:
    """``QuotaAdmin`` calls, all answered by one JVM (``JavaSession``): the module makes ~30,
    each a new Admin as a ``kafka-configs.sh`` run would, for one JVM start instead of 30."""

    def __init__(self) -> None:
        self.session = JavaSession([*java_program(JAVA_SOURCE, "QuotaAdmin"), "serve"])

    def run(self, *args: str) -> Ran:
        code, lines = self.session.call(*args)
        return Ran(code, "".join(line + "\n" for line in lines))

    def ok(self, *args: str) -> list[str]:
        done = self.run(*args)
        assert done.returncode == 0, done.stdout
        return done.stdout.splitlines()


@pytest.fixture(scope="module")
def qa() -> Iterator[QuotaAdmin]:
    admin = QuotaAdmin()
    try:
        yield admin
    finally:
        admin.session.close()


def describe_wire(
    bootstrap: str, components: list[dict[str, Any]], strict: bool, version: int = 1
) -> Any:
    with KafkaWire(bootstrap) as wire:
        body = {"components": components, "strict": strict}
        return wire.request(DESCRIBE_QUOTAS, version, body)


def entries_of(response: Any) -> dict[tuple[tuple[str, str | None], ...], dict[str, float]]:
    return {
        tuple((e.entity_type, e.entity_name) for e in entry.entity): {
            v.key: float(v.value) for v in entry.values
        }
        for entry in response.entries
    }


def request_as(wire: KafkaWire, client_id: str, api_key: int, version: int, body: Any) -> Any:
    """A request under ``client_id`` (the header's client id is half of a quota entity)."""
    correlation_id = wire.next_correlation_id()
    wire.send_raw(codec.encode_request(api_key, version, correlation_id, body, client_id))
    received, response = wire.recv(api_key, version)
    assert received == correlation_id
    return response


def wait_for_quota(bootstrap: str, client_id: str, key: str) -> None:
    """Until ``bootstrap``'s broker describes ``client_id``'s ``key`` quota."""
    component = {"entity_type": "client-id", "match_type": 0, "match": client_id}
    deadline = time.monotonic() + WATCH_DEADLINE_S
    while key not in entries_of(describe_wire(bootstrap, [component], True)).get(
        (("client-id", client_id),), {}
    ):
        assert time.monotonic() < deadline, f"{key} of {client_id} never described"
        time.sleep(0.1)


def owner_of(cluster: BrokerCluster, topic: str) -> BrokerProcess:
    """The broker leading ``topic``'s partition 0 once it is the assigned owner (a partition
    claimed on demand may move when the assignment catches up: raw produce requests do not
    follow a move as clients do)."""

    async def settled() -> int | None:
        etcd = await harness_etcd(cluster.etcd_url)
        try:
            lease = await etcd.get(keys.partition_lease_key(cluster.cluster, topic, 0))
            assignment = await etcd.get(keys.assignment_key(cluster.cluster))
        finally:
            await etcd.close()
        if lease is None or assignment is None:
            return None
        assigned = Assignment.from_json(assignment.value).owners.get((topic, 0))
        return int(lease.value) if assigned == int(lease.value) else None

    deadline = time.monotonic() + WATCH_DEADLINE_S
    while (leader := asyncio.run(settled())) is None:
        assert time.monotonic() < deadline, f"{topic} has no settled owner"
        time.sleep(0.1)
    return next(broker for broker in cluster.brokers if broker.node_id == leader)


def metric_count(broker: BrokerProcess, quota: str) -> float:
    with urllib.request.urlopen(f"{broker.admin_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    prefix = f'kafscale_quota_throttle_seconds_count{{quota="{quota}"}} '
    return sum(float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))


# --- Alter and Describe ------------------------------------------------------------------------


def test_java_admin_sets_quotas_that_other_clients_describe(
    qa: QuotaAdmin, cluster: BrokerCluster, name: str
) -> None:
    bootstrap = cluster.brokers[0].bootstrap
    user, client = f"{name}-alice", f"{name}-app"
    qa.ok("alter", bootstrap, f"user={user}", "producer_byte_rate=1048576",
            "consumer_byte_rate=2097152")  # fmt: skip
    qa.ok("alter", bootstrap, f"user={user},client-id=<default>", "producer_byte_rate=4096")
    qa.ok("alter", bootstrap, f"client-id={client}", "consumer_byte_rate=8192")
    described = qa.ok("describe", bootstrap, f"user={user}")
    assert described == [  # sorted lines
        f"entity client-id=<default> user={user} values producer_byte_rate=4096",
        f"entity user={user} values consumer_byte_rate=2097152 producer_byte_rate=1048576",
    ]
    assert qa.ok("describe", bootstrap, "strict", f"user={user}") == described[1:]
    # Raw kio requests on another broker (it reads etcd): the filters, as Kafka applies them.
    other = cluster.brokers[1].bootstrap
    exact = {"entity_type": "user", "match_type": 0, "match": user}
    default_client = {"entity_type": "client-id", "match_type": 1, "match": None}
    found = entries_of(describe_wire(other, [exact, default_client], True))
    assert found == {(("user", user), ("client-id", None)): {"producer_byte_rate": 4096.0}}
    by_client = {"entity_type": "client-id", "match_type": 0, "match": client}
    found = entries_of(describe_wire(other, [by_client], False, version=0))
    assert found == {(("client-id", client),): {"consumer_byte_rate": 8192.0}}
    # validate_only changes nothing; removing a key keeps the others.
    qa.ok("alter", bootstrap, f"user={user}", "--validate", "producer_byte_rate=1")
    qa.ok("alter", bootstrap, f"user={user}", "consumer_byte_rate=")
    assert qa.ok("describe", bootstrap, "strict", f"user={user}") == [
        f"entity user={user} values producer_byte_rate=1048576"
    ]
    qa.ok("alter", bootstrap, f"user={user}", "producer_byte_rate=")
    qa.ok("alter", bootstrap, f"user={user},client-id=<default>", "producer_byte_rate=")
    assert qa.ok("describe", bootstrap, f"user={user}") == []


@pytest.mark.parametrize(
    "entity, op, words",
    [
        ("user={n}", "request_percentage=50", "request_percentage is not supported"),
        ("user={n}", "controller_mutation_rate=5", "not supported"),
        ("user={n}", "producer_bytes_rate=5", "unknown quota key"),
        ("client-id={n}", "producer_byte_rate=1.5", "positive whole number"),
        ("ip=127.0.0.1", "connection_creation_rate=5", "ip quotas"),
    ],
)
def test_what_is_not_enforced_is_refused_with_a_message(
    qa: QuotaAdmin, cluster: BrokerCluster, name: str, entity: str, op: str, words: str
) -> None:
    bootstrap = cluster.brokers[0].bootstrap
    refused = qa.run("alter", bootstrap, entity.format(n=name), op)
    assert refused.returncode == 1
    assert refused.stdout.startswith("error InvalidRequestException"), refused.stdout
    assert words in refused.stdout
    assert qa.ok("describe", bootstrap, entity.format(n=name).replace("127.0.0.1", "*")) == []


def test_bad_filters_get_invalid_request(cluster: BrokerCluster) -> None:
    twice = [{"entity_type": "user", "match_type": 2, "match": None}] * 2
    response = describe_wire(cluster.brokers[0].bootstrap, twice, False)
    assert response.error_code == INVALID_REQUEST and "twice" in response.error_message
    unknown = [{"entity_type": "group", "match_type": 2, "match": None}]
    assert describe_wire(cluster.brokers[0].bootstrap, unknown, False).error_code == 42


def test_alterations_are_per_entry_and_any_number_of_entities(
    cluster: BrokerCluster, name: str
) -> None:
    """150 entities in one request (more than one etcd transaction holds); an entry named
    twice or with a bad key fails alone, with its message."""
    bootstrap = cluster.brokers[0].bootstrap

    def entry(client: str, key: str = "producer_byte_rate") -> dict[str, Any]:
        entity = [{"entity_type": "client-id", "entity_name": client}]
        return {"entity": entity, "ops": [{"key": key, "value": 1000.0, "remove": False}]}

    entries = [entry(f"{name}-{i}") for i in range(150)]
    entries += [entry(f"{name}-0"), entry(f"{name}-bad", "request_percentage")]
    with KafkaWire(bootstrap) as wire:
        response = wire.request(ALTER_QUOTAS, 1, {"entries": entries, "validate_only": False})
    codes = [int(e.error_code) for e in response.entries]
    assert codes == [0] * 150 + [INVALID_REQUEST, INVALID_REQUEST]
    assert "twice" in response.entries[150].error_message
    assert "not supported" in response.entries[151].error_message
    any_client = [{"entity_type": "client-id", "match_type": 2, "match": None}]
    found = entries_of(describe_wire(bootstrap, any_client, True))
    mine = {e for e in found if str(e[0][1]).startswith(f"{name}-")}
    assert len(mine) == 150


# --- enforcement -------------------------------------------------------------------------------


def test_a_producer_over_its_byte_rate_is_throttled_and_held_to_it(
    qa: QuotaAdmin, cluster: BrokerCluster, name: str
) -> None:
    """Raw produce requests as fast as the broker reads them: each answer over the quota says
    how long to wait, the broker's mute makes the client wait that long (the wall time spent
    is at least the throttles asked before the last answer), and from the first throttled
    answer on, the bytes sent never exceed the quota over the time spent since plus the last
    throttle (the bucket was empty at that answer)."""
    quota = 100_000
    create_topic(cluster.brokers[0].bootstrap, name, 1)
    broker = owner_of(cluster, name)
    qa.ok("alter", broker.bootstrap, f"client-id={name}", f"producer_byte_rate={quota}")
    wait_for_quota(broker.bootstrap, name, "producer_byte_rate")
    before = metric_count(broker, "producer_byte_rate")
    body = produce_body(name, 0, make_batch(0, [b"x" * 1000] * 25), acks=1)  # ~25 KB
    size = len(codec.encode_request(PRODUCE, 9, 1, body, name)) - 4
    throttles: list[int] = []
    sent_at: list[float] = []
    answered: list[float] = []
    with KafkaWire(broker.bootstrap) as wire:
        for _ in range(24):
            sent_at.append(time.monotonic())
            response = request_as(wire, name, PRODUCE, 9, body)
            answered.append(time.monotonic())
            assert response.responses[0].partition_responses[0].error_code == 0
            throttles.append(codec.millis(response.throttle_time))
    assert max(throttles) > 0, throttles
    assert answered[-1] - sent_at[0] >= sum(throttles[:-1]) / 1000 * 0.95, (answered, throttles)
    first = next(i for i, t in enumerate(throttles) if t)
    sent_after = size * (len(throttles) - first - 1)
    # The broker charged request ``first`` after the client sent it: a window that can only
    # be longer than the broker's own.
    window_s = answered[-1] - sent_at[first] + throttles[-1] / 1000
    assert sent_after <= quota * window_s * 1.05, (sent_after, window_s, throttles)
    assert metric_count(broker, "producer_byte_rate") > before


def test_kafka_python_producer_sees_the_throttle(
    qa: QuotaAdmin, cluster: BrokerCluster, name: str
) -> None:
    broker = cluster.brokers[0]
    create_topic(broker.bootstrap, name, 1)
    qa.ok("alter", broker.bootstrap, f"client-id={name}", "producer_byte_rate=50000")
    wait_for_quota(broker.bootstrap, name, "producer_byte_rate")
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, client_id=name, acks=1,
                             linger_ms=5, batch_size=16384)  # fmt: skip
    try:
        for _ in range(200):
            producer.send(name, b"y" * 1000)
        producer.flush(timeout=60)
        metrics = producer.metrics()["producer-metrics"]
        assert metrics["throttle-time-max"] > 0, metrics  # the throttles it was told
    finally:
        producer.close(timeout=10)


def test_a_fetcher_over_its_byte_rate_is_throttled_on_any_broker(
    qa: QuotaAdmin, cluster: BrokerCluster, name: str
) -> None:
    """Set through one broker, enforced by the other (from its watch): fetch bytes count."""
    create_topic(cluster.brokers[0].bootstrap, name, 1)
    owner = owner_of(cluster, name)
    second = next(b for b in cluster.brokers if b is not owner)
    with KafkaWire(owner.bootstrap) as wire:
        for _ in range(8):  # ~200 KB, produced by an unthrottled client id
            batch = make_batch(0, [b"z" * 1000] * 25)
            response = wire.request(PRODUCE, 9, produce_body(name, 0, batch))
            assert response.responses[0].partition_responses[0].error_code == 0
    qa.ok("alter", owner.bootstrap, f"client-id={name}", "consumer_byte_rate=20000")
    wait_for_quota(second.bootstrap, name, "consumer_byte_rate")
    before = metric_count(second, "consumer_byte_rate")
    throttles = []
    deadline = time.monotonic() + WATCH_DEADLINE_S
    with KafkaWire(second.bootstrap) as wire:
        while not any(throttles):  # the watch may bring the quota a moment after etcd has it
            assert time.monotonic() < deadline, throttles
            response = request_as(wire, name, FETCH, 12, fetch_body(name, 0, 0, max_bytes=100_000))
            assert response.responses[0].partitions[0].error_code == 0
            throttles.append(codec.millis(response.throttle_time))
    assert metric_count(second, "consumer_byte_rate") > before


def test_quotas_through_the_proxy(qa: QuotaAdmin, cluster: BrokerCluster, name: str) -> None:
    """Alter and Describe go through the proxy; a producer behind it (its own upstream
    connections, its principal and client id forwarded) gets the brokers' throttle in the
    proxy's answers and is held back by the brokers' mute."""
    proxy = start_proxy(cluster)
    try:
        qa.ok("alter", proxy.bootstrap, f"user={name}", "producer_byte_rate=12345")
        assert qa.ok("describe", proxy.bootstrap, f"user={name}") == [
            f"entity user={name} values producer_byte_rate=12345"
        ]
        create_topic(proxy.bootstrap, name, 1)
        qa.ok("alter", proxy.bootstrap, f"client-id={name}", "producer_byte_rate=50000")
        wait_for_quota(proxy.bootstrap, name, "producer_byte_rate")
        body = produce_body(name, 0, make_batch(0, [b"p" * 1000] * 25), acks=1)
        throttles: list[int] = []
        with KafkaWire(proxy.bootstrap) as wire:
            started = time.monotonic()
            for _ in range(12):  # ~300 KB at 50 KB/s
                response = request_as(wire, name, PRODUCE, 9, body)
                assert response.responses[0].partition_responses[0].error_code == 0
                throttles.append(codec.millis(response.throttle_time))
            spent_s = time.monotonic() - started
        assert max(throttles) > 0, throttles
        # The broker muted the proxy's connection for this client (the enveloped requests
        # share its mute): the client waited out every throttle but the last.
        assert spent_s >= sum(throttles[:-1]) / 1000 * 0.95, (spent_s, throttles)
    finally:
        proxy.stop()


def _produce_as(bootstrap: str, user: str, topic: str) -> float:
    """kafka-python as ``user`` (SCRAM) sends ~200 KB; the largest throttle it was told."""
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        client_id=topic,  # one client id for both users: only the user tells them apart
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username=user,
        sasl_plain_password=f"{user}-password",
        acks=1,
        linger_ms=5,
    )
    try:
        for _ in range(200):
            producer.send(topic, b"s" * 1000)
        producer.flush(timeout=60)
        return float(producer.metrics()["producer-metrics"]["throttle-time-max"])
    finally:
        producer.close(timeout=10)


def test_the_quota_user_is_the_sasl_login(
    qa: QuotaAdmin, etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path: Path, name: str
) -> None:
    """A ``users/alice`` quota throttles alice's SCRAM logins, not bob's with the same
    client id."""
    cluster = new_cluster(etcd_server.client_url, s3_server, tmp_path, "quota-sasl")
    kafscale_cli_calls(
        cluster.etcd_url,
        cluster.cluster,
        [
            (("users", "create", user, "--password-stdin"), f"{user}-password")
            for user in ("alice", "bob")
        ],
    )
    ports = {"INTERNAL": free_port_run(), "SASL": 0}
    ports["SASL"] = free_port_run(avoid=ports.values())
    broker = add_broker(
        cluster,
        ports,
        "INTERNAL",
        "sasl-broker.log",
        KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP="INTERNAL:PLAINTEXT,SASL:SASL_PLAINTEXT",
    )
    try:
        broker.start()
        create_topic(broker.bootstrap, name, 1)
        qa.ok("alter", broker.bootstrap, "user=alice", "producer_byte_rate=50000")
        sasl = f"127.0.0.1:{ports['SASL']}"
        assert _produce_as(sasl, "bob", name) == 0
        assert _produce_as(sasl, "alice", name) > 0
    finally:
        cluster.stop_all()


# --- authorization -----------------------------------------------------------------------------


def test_describe_needs_describe_configs_and_alter_needs_alter_configs(
    qa: QuotaAdmin, etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path: Path, name: str
) -> None:
    with authorizing_cluster(etcd_server.client_url, s3_server, tmp_path, "quota-acl") as cluster:
        bootstrap = cluster.brokers[0].bootstrap
        refused = qa.run("describe", bootstrap)
        assert refused.stdout.startswith("error ClusterAuthorizationException"), refused.stdout
        grant_cluster(cluster, "DESCRIBE_CONFIGS")
        deadline = time.monotonic() + WATCH_DEADLINE_S
        while qa.run("describe", bootstrap).returncode != 0:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        refused = qa.run("alter", bootstrap, f"user={name}", "producer_byte_rate=1")
        assert refused.stdout.startswith("error ClusterAuthorizationException"), refused.stdout
        grant_cluster(cluster, "ALTER_CONFIGS")
        deadline = time.monotonic() + WATCH_DEADLINE_S
        while qa.run("alter", bootstrap, f"user={name}", "producer_byte_rate=1").returncode:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert qa.ok("describe", bootstrap) == [f"entity user={name} values producer_byte_rate=1"]
