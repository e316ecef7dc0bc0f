"""What KafkaJS's own integration suite found (docs/client-suites.md), each as a check of our
own with a real client (or kio-level requests where no Python client takes the path) against
real broker and proxy processes.

* A topic name that can never exist (``bad)(*&^%``) gets INVALID_TOPIC_EXCEPTION from Metadata,
  as from Kafka, so clients fail at once. Through the proxy it was UNKNOWN_TOPIC_OR_PARTITION
  (retriable): KafkaJS retried and failed with the wrong error, librdkafka held the message
  until ``message.timeout.ms``. A broker asked not to auto-create answered the same.
* A client that disconnects with requests still in flight (KafkaJS's ``disconnect()``) left an
  ERROR with a traceback in the log of the broker or proxy it talked to: once the first late
  answer met the closed socket's reset, uvloop raised RuntimeError on the next write.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import KafkaError, Producer
from harness.brokers import BrokerProcess, new_cluster
from harness.kafka_wire import KafkaWire, fetch_body, metadata_body
from harness.proxy import start_proxy
from harness.s3 import S3Endpoint

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration

FETCH, METADATA = 1, 3
INVALID_NAME = "kafkajs-bad)(*&^%"


@dataclass(frozen=True)
class Endpoints:
    broker: BrokerProcess
    proxy: BrokerProcess


@pytest.fixture(scope="module")
def endpoints(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Endpoints]:
    cluster = new_cluster(
        etcd_server.client_url, s3_server, tmp_path_factory.mktemp("kafkajs"), "kafkajs"
    )
    try:
        broker = cluster.start()
        yield Endpoints(broker, start_proxy(cluster))
    finally:
        cluster.stop_all()


def _produce_error(bootstrap: str, topic: str) -> KafkaError | None:
    """The delivery error of one message to ``topic`` (None: delivered)."""
    errors: list[KafkaError | None] = []
    producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 20000})
    producer.produce(topic, b"value", on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(30) == 0
    return errors[0]


@pytest.mark.parametrize("via", ["broker", "proxy"])
def test_producing_to_an_invalid_topic_name_fails_with_invalid_topic(
    endpoints: Endpoints, via: str
) -> None:
    bootstrap = getattr(endpoints, via).bootstrap
    error = _produce_error(bootstrap, INVALID_NAME)
    assert error is not None and error.code() == KafkaError.TOPIC_EXCEPTION, error
    # and the client goes on to a valid topic (auto-created)
    assert _produce_error(bootstrap, "kafkajs-valid-after-invalid") is None


@pytest.mark.parametrize("via", ["broker", "proxy"])
@pytest.mark.parametrize("auto_create", [True, False])
def test_metadata_tells_an_invalid_name_from_an_unknown_topic(
    endpoints: Endpoints, via: str, auto_create: bool
) -> None:
    unknown = f"kafkajs-unknown-{via}-{auto_create}".lower()
    names = [INVALID_NAME, "."] + ([] if auto_create else [unknown])
    with KafkaWire(getattr(endpoints, via).bootstrap) as wire:
        response = wire.request(METADATA, 9, metadata_body(names, auto_create))
    codes = {t.name: t.error_code for t in response.topics}
    assert codes[INVALID_NAME] == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert codes["."] == ErrorCode.INVALID_TOPIC_EXCEPTION
    if not auto_create:
        assert codes[unknown] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


@pytest.mark.parametrize("via", ["broker", "proxy"])
@pytest.mark.parametrize("close", ["fin", "reset"])
def test_a_client_gone_with_requests_in_flight_leaves_no_error_in_the_log(
    endpoints: Endpoints, via: str, close: str
) -> None:
    process = getattr(endpoints, via)
    topic = f"kafkajs-gone-{via}-{close}"
    assert _produce_error(process.bootstrap, topic) is None  # the topic exists, one record
    log_before = process.log_path.read_text(errors="replace")
    for _ in range(3):
        with KafkaWire(process.bootstrap) as wire:
            # long polls past the end, answered one after another once the client is gone
            for max_wait_ms in (200, 500, 800):
                wire.send(FETCH, 11, fetch_body(topic, 0, 1, max_wait_ms=max_wait_ms))
            if close == "reset":
                wire.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    time.sleep(1.5)  # every long poll has expired and been answered (or dropped)
    with KafkaWire(process.bootstrap) as wire:  # and it serves on
        response = wire.request(METADATA, 9, metadata_body([topic], False))
        assert response.topics[0].error_code == ErrorCode.NONE
    logged = process.log_path.read_text(errors="replace")[len(log_before) :]
    assert "Traceback" not in logged and " ERROR " not in logged, logged
