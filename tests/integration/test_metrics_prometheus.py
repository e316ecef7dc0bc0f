"""A real Prometheus scrapes a running broker's ``/metrics``; PromQL answers match what real
clients produced and consumed: records and bytes per topic, flushes, and consumer lag after a
partial commit."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from harness.brokers import BrokerCluster, BrokerProcess
from harness.monitoring_doc import metrics_table, proxy_metric_names, served_families
from harness.prometheus import SCRAPE_INTERVAL_S, Prometheus
from harness.proxy import start_proxy

pytestmark = pytest.mark.integration

RECORDS = 40
COMMITTED = 15
VALUE = b"x" * 100


def _varint(value: int) -> bytes:
    """Kafka's zig-zag varint, to work out the size of a one-record batch by hand."""
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while zigzag >= 0x80:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def one_record_batch_bytes(value: bytes) -> int:
    """A v2 batch of one uncompressed record without key or headers: 61 header bytes, then the
    record (attributes, timestamp and offset deltas, key length -1, value, 0 headers)."""
    record = 1 + len(_varint(0)) * 2 + len(_varint(-1)) + len(_varint(len(value))) + len(value)
    record += len(_varint(0))
    return 61 + len(_varint(record)) + record


def produce_one_batch_each(bootstrap: str, topic: str) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 0,
            "compression.type": "none",
            "batch.num.messages": 1,
        }
    )
    errors = []
    for _ in range(RECORDS):
        producer.produce(
            topic, value=VALUE, partition=0, on_delivery=lambda e, _m: errors.append(e)
        )
        assert producer.flush(30) == 0
    assert errors == [None] * RECORDS


def consume_all_commit_some(bootstrap: str, topic: str, group: str) -> int:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen = 0
    for _ in range(200):
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            seen += 1
        if seen == RECORDS:
            break
    consumer.commit(offsets=[TopicPartition(topic, 0, COMMITTED)], asynchronous=False)
    consumer.close()
    return seen


def test_prometheus_sees_traffic_and_lag(
    broker: BrokerProcess, prometheus_server: Callable[[list[str]], Prometheus]
) -> None:
    prometheus = prometheus_server([f"127.0.0.1:{broker.admin_port}"])
    topic, group = "metered", "metered-readers"
    produce_one_batch_each(broker.bootstrap, topic)
    assert consume_all_commit_some(broker.bootstrap, topic, group) == RECORDS
    batch_bytes = one_record_batch_bytes(VALUE)

    def exactly(expected: float) -> Callable[[float], bool]:
        return lambda value: value == expected

    on_topic = f'{{topic="{topic}"}}'
    prometheus.wait_value(f"kafscale_produce_records_total{on_topic}", exactly(RECORDS))
    prometheus.wait_value(f"kafscale_produce_bytes_total{on_topic}", exactly(RECORDS * batch_bytes))
    prometheus.wait_value(f"kafscale_fetch_records_total{on_topic}", exactly(RECORDS))
    prometheus.wait_value(f"kafscale_fetch_bytes_total{on_topic}", exactly(RECORDS * batch_bytes))
    lag = f'sum(kafscale_consumer_group_lag{{group="{group}",topic="{topic}"}})'
    prometheus.wait_value(lag, exactly(RECORDS - COMMITTED))
    # Every acked record went through a flush: committed segment bytes cover the batches.
    prometheus.wait_value("kafscale_flush_bytes_total", lambda v: v >= RECORDS * batch_bytes)
    prometheus.wait_value("kafscale_flush_duration_seconds_count", lambda v: v >= 1)
    prometheus.wait_value(
        'kafscale_object_store_request_duration_seconds_count{operation="put"}', lambda v: v >= 1
    )
    prometheus.wait_value('kafscale_etcd_request_duration_seconds_count{operation="txn"}',
                          lambda v: v >= 1)  # fmt: skip
    prometheus.wait_value(
        'kafscale_request_duration_seconds_count{api="Produce"}', exactly(RECORDS)
    )
    prometheus.wait_value("kafscale_owned_partitions", lambda v: v >= 1)
    prometheus.wait_value("kafscale_partitions_without_owner", exactly(0))
    prometheus.wait_value("kafscale_session_lease_alive", exactly(1))


def test_metrics_endpoint_is_prometheus_text(broker: BrokerProcess) -> None:
    with urllib.request.urlopen(f"{broker.admin_url}/metrics", timeout=10) as response:
        content_type = response.headers["Content-Type"]
        body = response.read().decode()
    assert content_type.startswith("text/plain; version=0.0.4")
    assert "# TYPE kafscale_request_duration_seconds histogram" in body
    assert "# TYPE kafscale_produce_bytes_total counter" in body
    assert "process_cpu_seconds_total" in body


DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_adapter_rule_of_the_hpa_example_gives_a_produce_rate(
    broker: BrokerProcess, prometheus_server: Callable[..., Prometheus]
) -> None:
    """deploy/hpa-produce-rate.yaml's prometheus-adapter rule, expanded the way the adapter
    expands it for the HPA's pods, answers with each broker's produce bytes per second."""
    labels = {"namespace": "kafscale", "pod": "demo-broker-0"}
    prometheus = prometheus_server([f"127.0.0.1:{broker.admin_port}"], labels)
    docs = list(yaml.safe_load_all((DEPLOY / "hpa-produce-rate.yaml").read_text()))
    rule = yaml.safe_load(docs[0]["data"]["config.yaml"])["rules"][0]
    hpa = docs[1]
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == rule["name"]["as"]
    series = rule["name"]["matches"].strip("^$")
    query = (
        rule["metricsQuery"]
        .replace("<<.Series>>", series)
        .replace("<<.LabelMatchers>>", 'namespace="kafscale",pod=~"demo-broker-0"')
        .replace("<<.GroupBy>>", "pod")
    )
    prometheus.wait_scraping()
    produce_one_batch_each(broker.bootstrap, "rated")
    time.sleep(2 * SCRAPE_INTERVAL_S)  # a scrape between the two rounds sees the rise
    produce_one_batch_each(broker.bootstrap, "rated")
    rate = prometheus.wait_value(query, lambda value: value > 0)
    assert rate <= 2 * RECORDS * one_record_batch_bytes(VALUE)  # bytes/s over >= 1 s


def test_monitoring_page_lists_the_metrics_brokers_and_proxies_serve(
    broker_cluster: BrokerCluster,
) -> None:
    """docs/monitoring.md names every metric family a broker and a proxy serve, and only
    those, with the broker's types: dashboards and alerts are written from that page. (The
    proxy's cluster-view gauge is the broker's, documented in the broker table.)"""
    broker = broker_cluster.start()
    proxy = start_proxy(broker_cluster)
    assert metrics_table("Brokers.") == served_families(scrape(broker))
    proxy_served = set(served_families(scrape(proxy))) - {"kafscale_cluster_view_following"}
    assert proxy_metric_names() == proxy_served


def scrape(process: BrokerProcess) -> str:
    with urllib.request.urlopen(f"{process.admin_url}/metrics", timeout=10) as response:
        return str(response.read().decode())
