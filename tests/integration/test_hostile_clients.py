"""What a hostile or careless client can make a broker hold, against a real broker process.

* A thousand connections each announcing a 100 MiB request and sending nothing more: the
  broker's memory stays inside its request budget and a normal client is still served.
* A connection that says nothing is closed after ``connections_max_idle_ms``; one client
  address cannot open more than ``max_connections_per_address`` connections.
* acks=0 produce against a slow object store: the broker stops reading the producing connection
  instead of buffering without bound, and acks=all produce still works afterwards.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import pytest
from harness.batches import make_batch
from harness.brokers import BrokerCluster, BrokerProcess
from harness.kafka_wire import (
    API_VERSIONS,
    FETCH,
    METADATA,
    PRODUCE,
    KafkaWire,
    batches_in,
    fetch_body,
    fetch_partition,
    metadata_body,
    produce_body,
    produce_partition,
)
from harness.s3_proxy import s3_proxy
from harness.topics import create_topics

from kafscale.broker.protocol import codec

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def eventually(condition: Callable[[], bool], timeout_s: float = 15) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@contextmanager
def peak_rss(pid: int) -> Iterator[list[int]]:
    """Samples the process's RSS every 20 ms while the block runs; ``[peak]`` afterwards."""
    peak = [rss_bytes(pid)]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            try:
                peak[0] = max(peak[0], rss_bytes(pid))
            except OSError:
                return
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join()


def announce(address: tuple[str, int], source: str, size: int) -> socket.socket:
    """A connection from ``source`` that sends a length prefix of ``size`` and a few bytes."""
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(address)
    sock.sendall(struct.pack(">i", size) + b"\x00\x00\x00\x12")
    return sock


def served(wire: KafkaWire, topic: str) -> None:
    """Metadata, an acks=all produce and a fetch of it: what a normal client does."""
    assert int(wire.request(API_VERSIONS, 3, {}).error_code) == 0
    wire.request(METADATA, 12, metadata_body([topic]))
    code, offset = produce_partition(
        wire.request(PRODUCE, 9, produce_body(topic, 0, make_batch(0, [b"normal"])))
    )
    assert code == 0 and offset >= 0
    partition = fetch_partition(wire.request(FETCH, 12, fetch_body(topic, 0, offset)))
    assert batches_in(partition.records)[0].base_offset == offset


def waiting_connections(broker: BrokerProcess) -> int:
    """Connections whose announced frame waits for request memory (``GET /status``)."""
    return int(broker.status()["request_memory"]["waiting_connections"])


def test_a_thousand_announced_100_mib_frames_stay_inside_the_request_budget(
    broker_cluster: BrokerCluster,
) -> None:
    budget = 64 * MiB
    broker = broker_cluster.start(
        KAFSCALE_LIMITS__QUEUED_MAX_REQUEST_BYTES=str(budget),
        KAFSCALE_LIMITS__MAX_FRAME_BYTES=str(100 * MiB),
    )
    create_topics(broker.bootstrap, ["normal"], partitions=1)
    address = ("127.0.0.1", broker.port)
    with KafkaWire(broker.bootstrap) as wire:
        served(wire, "normal")  # warm: the broker's own working set before the attack
    before = rss_bytes(broker.pid)
    with ExitStack() as stack, peak_rss(broker.pid) as peak:
        for i in range(1000):
            # four client addresses, as the per-address limit (1000) would otherwise refuse
            source = f"127.0.0.{2 + i % 4}"
            stack.enter_context(announce(address, source, 100 * MiB - 1))
        # the broker has taken them all in: one frame reserved, the others waiting for budget
        assert eventually(lambda: waiting_connections(broker) >= 990, 120), broker.status()
        status = broker.status()
        with KafkaWire(broker.bootstrap) as wire:
            served(wire, "normal")
    memory = status["request_memory"]
    assert memory["peak_bytes"] <= 100 * MiB  # one frame reserved alone, the rest waiting
    assert memory["waiting_connections"] >= 990
    assert peak[0] - before < budget + 64 * MiB, (before, peak[0])
    # given back on disconnect
    assert eventually(lambda: broker.status()["request_memory"]["used_bytes"] == 0)


def test_an_idle_connection_is_closed_and_a_busy_one_is_not(
    broker_cluster: BrokerCluster,
) -> None:
    broker = broker_cluster.start(KAFSCALE_LIMITS__CONNECTIONS_MAX_IDLE_MS="600")
    with KafkaWire(broker.bootstrap) as idle, KafkaWire(broker.bootstrap) as busy:
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            assert int(busy.request(API_VERSIONS, 3, {}).error_code) == 0
            time.sleep(0.1)
        assert idle.is_closed_by_peer(timeout_s=5)
        assert int(busy.request(API_VERSIONS, 3, {}).error_code) == 0


def test_one_address_cannot_open_more_than_its_share_of_connections(
    broker_cluster: BrokerCluster,
) -> None:
    broker = broker_cluster.start(KAFSCALE_LIMITS__MAX_CONNECTIONS_PER_ADDRESS="5")
    address = ("127.0.0.1", broker.port)
    with ExitStack() as stack:
        wires = [stack.enter_context(KafkaWire(broker.bootstrap)) for _ in range(5)]
        for wire in wires:
            assert int(wire.request(API_VERSIONS, 3, {}).error_code) == 0
        with KafkaWire(broker.bootstrap) as sixth:
            assert sixth.is_closed_by_peer()
        other = socket.socket()
        other.bind(("127.0.0.2", 0))
        other.connect(address)
        with other:  # another address is not affected
            other.sendall(codec.encode_request(API_VERSIONS, 3, 1, {}))
            assert len(other.recv(4)) == 4

    def served_again() -> bool:  # once the broker has seen the five hang up
        try:
            with KafkaWire(broker.bootstrap) as again:
                return int(again.request(API_VERSIONS, 3, {}).error_code) == 0
        except ConnectionError:
            return False

    assert eventually(served_again)


def test_acks_0_flood_against_a_slow_store_is_held_back_not_buffered(
    broker_cluster: BrokerCluster,
) -> None:
    """Every upload waits 1.5 s; a producer sends acks=0 as fast as the socket takes it for
    8 s. The broker holds at most its produce budget (plus what one connection may have in
    flight) and stops reading; afterwards acks=all produce is answered and readable."""
    budget = 32 * MiB
    with s3_proxy(broker_cluster.s3.url, delay_s=1.5) as proxy:
        proxy.hold = __import__("re").compile(".*")
        broker = broker_cluster.start(
            KAFSCALE_STORAGE__ENDPOINT=proxy.url,
            KAFSCALE_LIMITS__MAX_BUFFERED_PRODUCE_BYTES=str(budget),
            KAFSCALE_LIMITS__MAX_IN_FLIGHT_BYTES_PER_CONNECTION=str(8 * MiB),
            KAFSCALE_LOG__CACHE_BYTES=str(8 * MiB),
        )
        create_topics(broker.bootstrap, ["flood"], partitions=1)
        with KafkaWire(broker.bootstrap) as wire:
            served(wire, "flood")
        before = rss_bytes(broker.pid)
        value = b"x" * 1000
        batch = make_batch(0, [value] * 1000)  # ~1 MiB
        frame = codec.encode_request(PRODUCE, 9, 1, produce_body("flood", 0, batch, acks=0))
        sent = 0
        with peak_rss(broker.pid) as peak:
            flood = socket.create_connection(("127.0.0.1", broker.port))
            flood.settimeout(0.5)
            deadline = time.monotonic() + 8
            with flood:
                while time.monotonic() < deadline:
                    try:
                        flood.sendall(frame)
                        sent += len(frame)
                    except TimeoutError:
                        continue  # the broker is not reading: back-pressure
                status = broker.status()
        assert status["buffered_produce_bytes"] <= budget + len(frame)
        assert peak[0] - before < budget + 8 * MiB + 120 * MiB, (sent, before, peak[0])
        with KafkaWire(broker.bootstrap, timeout_s=60) as wire:
            served(wire, "flood")
