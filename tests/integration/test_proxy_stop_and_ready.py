"""A standalone ``kafscale proxy``: its stop is bounded whatever etcd does, and its ``/readyz``
says whether it can route, the way Kubernetes reads it.

Real processes: an etcd of the test's own (frozen with SIGSTOP, continued with SIGCONT), a
broker on moto's S3 and a ``kafscale proxy`` in front, configured as the manifests configure it.

* Stop: the proxy promises what a broker does (``stop_bound_s(limits.shutdown_grace_s)`` from
  SIGTERM, the watchdog thread ``THREAD_SLACK_S`` later still); until now only the proxy inside
  ``kafscale local`` was tested for it.
* Readiness (docs/proxy.md, "Admin endpoint"): 200 while its routing tables are loaded, some
  broker is registered and its cluster view follows etcd; 503 while it cannot route: no broker
  registered, or etcd not answering for ``etcd.timeout_s`` (its probe read fails); 200 again
  once it can, without a restart. Before the probe (``broker/proxy/etcd_probe.py``) a frozen
  etcd was noticed only when gRPC's keepalive ended the watch streams, ~70 s later.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from harness.brokers import BrokerCluster, new_cluster
from harness.children import freeze
from harness.proxy import start_proxy
from harness.s3 import S3Endpoint
from harness.topics import create_topics

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.stop_deadline import EXIT_STOP_DEADLINE, THREAD_SLACK_S, stop_bound_s

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

GRACE_S = 2.0
ETCD_TIMEOUT_S = 30.0  # each etcd call would wait this long for the frozen etcd
SCHEDULING_SLACK_S = 15.0
"""Beyond the promised bound, for a loaded machine to run the exit and reap the process: a
margin on the wait, not a speed."""
DEADLINE_S = 120.0
"""For a state to show (a bound on a wait, not a speed): room for a machine other runs share."""
PROBE_TIMEOUT_S = 2.0  # the proxy's etcd.timeout_s: its probe read fails after this long
NOT_READY_DEADLINE_S = 30.0
"""For 503 once etcd is frozen: promised within ``etcd.timeout_s`` + 1 s (3 s here), so ten
times that is room for a loaded machine; gRPC's keepalive alone took ~70 s."""


@pytest.fixture
def cluster(
    etcd_server_private: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path: Path
) -> Iterator[BrokerCluster]:
    brokers = new_cluster(etcd_server_private.client_url, s3_server, tmp_path, "proxy-stop")
    try:
        yield brokers
    finally:
        brokers.stop_all()


@contextlib.contextmanager
def frozen(etcd: EmbeddedEtcd) -> Iterator[None]:
    """etcd stopped with SIGSTOP for the block, continued whatever happens."""
    pid = etcd.pid
    assert pid is not None
    freeze(pid)  # stopped, not only signalled: the block's asserts need it silent
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def readyz(proxy: BrokerProcess) -> int:
    try:
        return proxy.http("GET", "/readyz", timeout_s=5)[0]
    except OSError:
        return -1


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        time.sleep(0.2)


def produce_through(proxy: BrokerProcess, topic: str) -> None:
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "all"})
    producer.produce(topic, b"through the proxy")
    assert producer.flush(60) == 0


def test_a_proxy_exits_by_its_bound_while_etcd_is_frozen(
    cluster: BrokerCluster, etcd_server_private: EmbeddedEtcd
) -> None:
    """etcd frozen for the whole stop, each etcd call waiting up to 30 s for it: the proxy,
    with a client's upstream connections open, still ends by its bound after SIGTERM."""
    broker = cluster.start()
    proxy = start_proxy(
        cluster,
        KAFSCALE_LIMITS__SHUTDOWN_GRACE_S=str(GRACE_S),
        KAFSCALE_ETCD__TIMEOUT_S=str(ETCD_TIMEOUT_S),
    )
    create_topics(broker.bootstrap, ["proxy-stop"], 2)
    produce_through(proxy, "proxy-stop")
    bound_s = stop_bound_s(GRACE_S) + THREAD_SLACK_S
    with frozen(etcd_server_private):
        proxy.signal(signal.SIGTERM)
        try:
            code = proxy.wait(bound_s + SCHEDULING_SLACK_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"proxy still running {bound_s + SCHEDULING_SLACK_S:g} s after SIGTERM "
                f"(promised: {bound_s:g} s):\n{proxy.tail()}"
            ) from None
    assert code in (0, EXIT_STOP_DEADLINE), proxy.tail()
    assert "proxy stopped" in proxy.tail() or "stopping took over" in proxy.tail(200)


def test_proxy_readyz_follows_what_it_can_route(
    cluster: BrokerCluster, etcd_server_private: EmbeddedEtcd
) -> None:
    broker = cluster.start()
    # Started means /readyz said 200: tables loaded, a broker registered, etcd answering.
    proxy = start_proxy(cluster, KAFSCALE_ETCD__TIMEOUT_S=str(PROBE_TIMEOUT_S))
    create_topics(broker.bootstrap, ["proxy-ready"], 1)
    produce_through(proxy, "proxy-ready")
    assert proxy.http("GET", "/readyz") == (200, {"ready": True})

    with frozen(etcd_server_private):
        wait_for(
            lambda: readyz(proxy) == 503,
            "/readyz 503 while etcd does not answer",
            NOT_READY_DEADLINE_S,
        )
        status = proxy.status()
        assert status["ready"] is False
        assert status["cluster_view_following"] is False
        assert "etcd reads" in status["cluster_view_stopped"]
    wait_for(lambda: readyz(proxy) == 200, "/readyz 200 once etcd answers again")
    produce_through(proxy, "proxy-ready")  # it routes again

    assert broker.stop() == 0  # graceful: its registration goes with its session
    wait_for(lambda: readyz(proxy) == 503, "/readyz 503 with no broker to route to")
    assert proxy.status()["brokers"] == {}
    cluster.start()
    wait_for(lambda: readyz(proxy) == 200, "/readyz 200 once a broker registers")
    produce_through(proxy, "proxy-ready")
    assert proxy.alive
