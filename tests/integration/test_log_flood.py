"""A flood of bad connections does not flood the broker's log (``observability/log_limit``).

A real broker process with a SASL listener is hit by 300 failed logins (a client with a wrong
password reconnecting in a loop, as librdkafka does) and 300 requests whose bodies do not
parse. Its log holds the first ten lines of each kind, and, once the window ends (here: at
shutdown), one summary line per kind whose count makes up the rest: no event is lost, none
fills the disk. The metrics count all 300 of each; a well-behaved SASL client is served
throughout and its own login line is still written. The proxy, which reads its clients'
requests itself, limits its log and counts the same way.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from harness.brokers import BrokerCluster, new_cluster
from harness.kafka_wire import API_VERSIONS, METADATA, KafkaWire, correlation_id_of, request_header
from harness.ports import listener_ports
from harness.proxy import start_proxy
from harness.s3 import S3Endpoint
from harness.secured import add_broker, consume_values, create_user, make_topics
from prometheus_client.parser import text_string_to_metric_families

from kafscale.broker.app import Broker
from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.config import BrokerSettings
from kafscale.broker.free_ports import free_port_run
from kafscale.broker.local import LocalOptions, local_settings
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.observability.log_limit import CLIENT_LOG
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
ALICE, ALICE_PASSWORD = "alice", "alice-password"
FLOOD = 300
LINES_PER_WINDOW = 10  # the default: first 10 per kind and client host per 60 s
SUMMARY = re.compile(r"suppressed ([\d,]+) similar messages within 60 s: (.+) \(last from (.+)\)")


@dataclass
class FloodedBroker:
    process: BrokerProcess
    ports: dict[str, int]
    etcd_url: str
    cluster: str

    @property
    def sasl(self) -> str:
        return f"127.0.0.1:{self.ports['SASL']}"

    @property
    def internal(self) -> str:
        return f"127.0.0.1:{self.ports['INTERNAL']}"

    def log_lines(self) -> list[str]:
        return self.process.log_path.read_text(errors="replace").splitlines()


@pytest.fixture
def flooded(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path: Path
) -> Iterator[FloodedBroker]:
    cluster = new_cluster(etcd_server.client_url, s3_server, tmp_path, "flood")
    create_user(etcd_server.client_url, cluster.cluster, ALICE, ALICE_PASSWORD)
    ports = listener_ports("INTERNAL", "SASL")
    process = add_broker(
        cluster,
        ports,
        "INTERNAL",
        "broker.log",
        KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP="INTERNAL:PLAINTEXT,SASL:SASL_PLAINTEXT",
    )
    try:
        process.start()
        yield FloodedBroker(process, ports, etcd_server.client_url, cluster.cluster)
    finally:
        cluster.stop_all()


def failed_login(bootstrap: str) -> None:
    """One connection, a PLAIN login with a wrong password, answered SASL_AUTHENTICATION_FAILED
    (and the connection closed by the broker)."""
    with KafkaWire(bootstrap) as wire:
        assert wire.request(SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}).error_code == 0
        answer = wire.request(SASL_AUTHENTICATE, 2, {"auth_bytes": b"\0alice\0wrong-password"})
        assert answer.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED


def malformed_requests(bootstrap: str, count: int) -> None:
    """``count`` Metadata v8 requests whose body does not parse, each answered under its
    correlation id (Metadata has no top-level error code to carry INVALID_REQUEST) on one
    connection, which stays open."""
    with KafkaWire(bootstrap) as wire:
        for correlation_id in range(count):
            wire.send_frame(request_header(METADATA, 8, correlation_id) + b"\xff\xff\xff\x7f\x01")
            frame = wire.recv_frame()
            assert correlation_id_of(frame) == correlation_id


def sasl_client(bootstrap: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": ALICE,
        "sasl.password": ALICE_PASSWORD,
    }


def produce_and_read_back(bootstrap: str, topic: str, value: bytes) -> list[bytes]:
    producer = Producer(sasl_client(bootstrap))
    producer.produce(topic, value)
    assert producer.flush(30) == 0
    return consume_values(sasl_client(bootstrap), topic, 1)


def counter(broker: BrokerProcess, name: str, **labels: str) -> float:
    """The value of the sample ``name`` with ``labels`` scraped from the broker's /metrics."""
    with urllib.request.urlopen(f"{broker.admin_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    raise AssertionError(f"{name}{labels} is not exported")


def windows_spanned(seconds: float) -> int:
    """How many 60 s windows a run of ``seconds`` can touch (one, unless the machine is so
    loaded that the flood outlasts a window)."""
    return int(seconds // 60) + 1


def summaries(lines: list[str], kind: str) -> list[int]:
    """The counts of the summary lines of ``kind``."""
    found = (SUMMARY.search(line) for line in lines)
    return [int(m[1].replace(",", "")) for m in found if m is not None and m[2] == kind]


def test_a_flood_of_failed_logins_and_malformed_requests_is_logged_ten_times_then_counted(
    flooded: FloodedBroker,
) -> None:
    topic = f"flood-{uuid.uuid4().hex[:8]}"
    make_topics(flooded.etcd_url, flooded.cluster, 1, topic)

    started = time.monotonic()
    for _ in range(FLOOD):
        failed_login(flooded.sasl)
    malformed_requests(flooded.internal, FLOOD)
    most = LINES_PER_WINDOW * windows_spanned(time.monotonic() - started)
    # A well-behaved client on the same listener, from the same host, is served meanwhile.
    assert produce_and_read_back(flooded.sasl, topic, b"still served") == [b"still served"]

    broker = flooded.process
    assert counter(broker, "kafscale_sasl_authentication_failures_total") == FLOOD
    assert counter(broker, "kafscale_malformed_requests_total") == FLOOD
    lines = flooded.log_lines()
    failed = [line for line in lines if "failed SASL PLAIN authentication" in line]
    bad = [line for line in lines if "bad Metadata v8 from" in line]
    closed = [line for line in lines if "authentication failed" in line and "closing" in line]
    assert LINES_PER_WINDOW <= len(failed) <= most, failed
    assert LINES_PER_WINDOW <= len(bad) <= most, bad
    assert not closed, closed  # the failure's line is the login's only one
    assert "further such lines from 127.0.0.1 are counted for 60 s" in failed[LINES_PER_WINDOW - 1]
    # The good client's login is another kind of line: its first one is written.
    assert any("authenticated as User:alice" in line for line in lines)
    suppressed = "kafscale_client_log_lines_suppressed_total"
    assert counter(broker, suppressed, kind="SASL authentication failed") == FLOOD - len(failed)
    assert counter(broker, suppressed, kind="malformed request") == FLOOD - len(bad)

    assert broker.stop() == 0  # the windows end with the process: their summaries are written
    lines = flooded.log_lines()
    failed_summaries = summaries(lines, "SASL authentication failed")
    bad_summaries = summaries(lines, "malformed request")
    assert failed_summaries and bad_summaries, lines[-20:]
    # Every event is in the log once: written, or counted in one summary.
    logins_logged = sum("failed SASL PLAIN authentication" in line for line in lines)
    requests_logged = sum("bad Metadata v8 from" in line for line in lines)
    assert logins_logged + sum(failed_summaries) == FLOOD
    assert requests_logged + sum(bad_summaries) == FLOOD
    assert any("SASL authentication failed (last from 127.0.0.1)" in line for line in lines)


def login_lines(flooded: FloodedBroker, attempt: Callable[[KafkaWire], None]) -> list[str]:
    """The broker's log lines about one connection that ``attempt`` makes fail its login
    (named by its port), once the broker has closed it."""
    with KafkaWire(flooded.sasl) as wire:
        peer = re.compile(rf"127\.0\.0\.1:{wire.sock.getsockname()[1]}\b")
        attempt(wire)
        assert wire.sock.recv(1) == b""  # closed by the broker: its lines are written
    return [line for line in flooded.log_lines() if peer.search(line)]


def test_one_failed_login_is_one_log_line(flooded: FloodedBroker) -> None:
    """A wrong password, a mechanism the listener does not offer and a login out of turn each
    close the connection and write one line: the failure (the close used to write a second)."""

    def wrong_password(wire: KafkaWire) -> None:
        assert wire.request(SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}).error_code == 0
        answer = wire.request(SASL_AUTHENTICATE, 2, {"auth_bytes": b"\0alice\0wrong"})
        assert answer.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED

    def unknown_mechanism(wire: KafkaWire) -> None:
        answer = wire.request(SASL_HANDSHAKE, 1, {"mechanism": "GSSAPI"})
        assert answer.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM

    def out_of_turn(wire: KafkaWire) -> None:
        answer = wire.request(SASL_AUTHENTICATE, 2, {"auth_bytes": b"\0alice\0x"})
        assert answer.error_code == ErrorCode.ILLEGAL_SASL_STATE

    for attempt, says in (
        (wrong_password, "failed SASL PLAIN authentication"),
        (unknown_mechanism, "asked for SASL mechanism 'GSSAPI'"),
        (out_of_turn, "sent SaslAuthenticate out of turn"),
    ):
        lines = login_lines(flooded, attempt)
        assert len(lines) == 1 and says in lines[0], lines
    assert counter(flooded.process, "kafscale_sasl_authentication_failures_total") == 3


async def test_a_local_broker_that_stops_leaves_its_siblings_limited(
    etcd_server: EmbeddedEtcd, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``kafscale local`` runs its brokers in one process, sharing one limiter: when one of
    them stops, the window of another's client goes on (it used to end, and the flood's next
    ten lines were written at once, as if the window had just started). Two brokers started
    as ``run_local`` starts them, in this process; broker 1 is flooded before and after
    broker 0 stops."""
    CLIENT_LOG.summarise_all()  # no window of an earlier test of this process
    caplog.set_level(logging.INFO, logger="kafscale")
    options = LocalOptions(tmp_path / "data", 2, free_port_run(2), "127.0.0.1")
    brokers = []
    for index in range(2):
        settings = local_settings(BrokerSettings(), options, etcd_server.client_url, index)
        brokers.append(await Broker.start(settings, cluster_size=2))
    first, second = brokers
    try:
        started = time.monotonic()
        bootstrap = f"127.0.0.1:{options.broker_port(1)}"
        await asyncio.to_thread(malformed_requests, bootstrap, FLOOD // 2)
        await first.shutdown()
        await asyncio.to_thread(malformed_requests, bootstrap, FLOOD // 2)
        most = LINES_PER_WINDOW * windows_spanned(time.monotonic() - started)
        logged = [r for r in caplog.records if "bad Metadata v8 from" in r.getMessage()]
        assert LINES_PER_WINDOW <= len(logged) <= most, len(logged)
    finally:
        await second.shutdown()
        if first.ready:  # not stopped above (a failure before)
            await first.shutdown()
    messages = [record.getMessage() for record in caplog.records]
    logged_in_all = sum("bad Metadata v8 from" in m for m in messages)
    assert logged_in_all + sum(summaries(messages, "malformed request")) == FLOOD


def test_the_proxy_logs_a_flood_of_malformed_requests_ten_times_then_counts_it(
    broker_cluster: BrokerCluster,
) -> None:
    """The proxy reads its clients' requests itself: the same limit and the same counter."""
    broker_cluster.start()
    proxy = start_proxy(broker_cluster)
    started = time.monotonic()
    malformed_requests(proxy.bootstrap, FLOOD)
    most = LINES_PER_WINDOW * windows_spanned(time.monotonic() - started)
    assert counter(proxy, "kafscale_proxy_malformed_requests_total") == FLOOD
    with KafkaWire(proxy.bootstrap) as wire:  # the proxy still serves
        assert wire.request(API_VERSIONS, 3, {}).error_code == ErrorCode.NONE

    assert proxy.stop() == 0
    lines = proxy.log_path.read_text(errors="replace").splitlines()
    logged = sum("bad Metadata v8 from" in line for line in lines)
    assert LINES_PER_WINDOW <= logged <= most
    assert logged + sum(summaries(lines, "malformed request")) == FLOOD
