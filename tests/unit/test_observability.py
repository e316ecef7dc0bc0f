"""Pure parts of observability: histograms, record counting, lag, the JSON log line, and the
metrics' exposition as Prometheus parses it."""

from __future__ import annotations

import json
import logging

import pytest
from harness.batches import make_batch
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from kafscale.broker.groups.leases import choose_coordinator
from kafscale.broker.observability.exposition import metrics_renderer
from kafscale.broker.observability.hot_path_collector import HotPathCollector
from kafscale.broker.observability.lag import consumer_lag, reported_groups
from kafscale.broker.observability.logs import JsonFormatter, about, bind, log_context, set_node_id
from kafscale.broker.observability.metrics import Histogram, Metrics, count_records
from kafscale.broker.protocol.record_batch import read_header

pytestmark = pytest.mark.unit


def test_histogram_buckets_are_cumulative_with_le_bounds() -> None:
    histogram = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 3.0):
        histogram.observe(value)
    assert histogram.cumulative() == [("0.1", 2.0), ("1.0", 3.0), ("+Inf", 4.0)]
    assert histogram.count == 4
    assert histogram.total == pytest.approx(3.65)


def test_count_records_reads_batch_headers_and_ignores_a_torn_tail() -> None:
    batches = make_batch(0, [b"a", b"b", b"c"]) + make_batch(3, [b"d"])
    assert count_records(batches) == 4
    assert count_records(batches[:-5]) == 3
    assert count_records(b"") == 0


def test_consumer_lag_skips_deleted_topics_and_unset_commits() -> None:
    committed = [("g", {("t", 0): 5, ("t", 1): 12, ("gone", 0): 1, ("t", 2): -1})]
    lag = consumer_lag(committed, {("t", 0): 10, ("t", 1): 11, ("t", 2): 4})
    assert [(e.topic, e.partition, e.lag) for e in lag] == [("t", 0, 5), ("t", 1, 0)]


@given(
    brokers=st.sets(st.integers(1, 6), min_size=1, max_size=4),
    groups=st.dictionaries(
        st.text(min_size=1, max_size=5), st.sampled_from([None, 1, 2, 3, 7]), max_size=20
    ),
    draining=st.sets(st.integers(1, 6), max_size=2),
)
def test_every_group_is_reported_by_exactly_one_broker(
    brokers: set[int], groups: dict[str, int | None], draining: set[int]
) -> None:
    """Each broker coordinates the groups whose lease it holds and has read every group's
    offsets from etcd (``stored``): the group is reported once in the cluster, by the broker
    FindCoordinator names, from the coordinator's offsets where a live broker holds it."""
    coordinated_offsets = {("t", 0): 1}
    stored_offsets = {("t", 0): 0}

    def reporter(group: str) -> int | None:
        return choose_coordinator(group, groups[group], brokers, draining)

    counts = dict.fromkeys(groups, 0)
    for node in brokers:
        coordinated = {g: coordinated_offsets for g, holder in groups.items() if holder == node}
        stored = dict.fromkeys(groups, stored_offsets)
        for group, offsets in reported_groups(node, coordinated, stored, reporter):
            counts[group] += 1
            assert reporter(group) == node
            held_here = groups[group] == node
            assert offsets == (coordinated_offsets if held_here else stored_offsets)
    assert counts == dict.fromkeys(groups, 1)


def test_exposition_parses_with_units_and_total_suffixes() -> None:
    metrics = Metrics()
    metrics.request("Produce", 0.002, failed=False)
    metrics.request("Produce", 0.004, failed=True)
    metrics.produced("orders", 170, 1)
    metrics.fetched("orders", make_batch(0, [b"x", b"y"]))
    metrics.flushed(0.02, 4096, 2)
    metrics.store_call("put", 0.01, failed=True)
    metrics.etcd_call("txn", 0.003, failed=False)
    families = {
        f.name: f for f in text_string_to_metric_families(
            metrics_renderer(HotPathCollector(metrics))().decode()
        )
    }  # fmt: skip
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    assert samples[("kafscale_request_duration_seconds_count", (("api", "Produce"),))] == 2
    assert samples[("kafscale_request_errors_total", (("api", "Produce"),))] == 1
    assert samples[("kafscale_produce_bytes_total", (("topic", "orders"),))] == 170
    assert samples[("kafscale_fetch_records_total", (("topic", "orders"),))] == 2
    assert samples[("kafscale_flush_objects_total", ())] == 2
    assert samples[("kafscale_object_store_errors_total", (("operation", "put"),))] == 1
    assert families["kafscale_etcd_request_duration_seconds"].type == "histogram"


def test_produced_batches_counts_every_batch_of_a_partition() -> None:
    metrics = Metrics()
    batches = [make_batch(0, [b"a", b"b"]), make_batch(2, [b"c"])]
    metrics.produced_batches("t", batches, [read_header(b) for b in batches])
    metrics.produced_batches("t", batches[:1], [read_header(batches[0])])
    traffic = metrics.topics["t"]
    assert (traffic.records_in, traffic.bytes_in) == (5, 2 * len(batches[0]) + len(batches[1]))


def test_disabled_metrics_count_nothing() -> None:
    metrics = Metrics(enabled=False)
    metrics.request("Fetch", 0.1, failed=True)
    metrics.produced("t", 10, 1)
    metrics.produced_batches("t", [b"x"], [])
    assert not metrics.requests.children and not metrics.topics


def test_deleted_topics_leave_the_exposition() -> None:
    metrics = Metrics()
    metrics.produced("kept", 1, 1)
    metrics.produced("deleted", 1, 1)
    metrics.forget_topics_except(["kept"])
    assert list(metrics.topics) == ["kept"]


def test_json_log_line_carries_node_topic_partition_and_group() -> None:
    set_node_id(7)
    record = logging.LogRecord(
        "kafscale.x", logging.INFO, __file__, 1, "acquired %s", ("t-0",), None
    )
    record.__dict__.update(about(("t", 0)))
    token = log_context.set({})
    try:
        bind(group="readers")
        line = json.loads(JsonFormatter().format(record))
    finally:
        log_context.reset(token)
    assert line["message"] == "acquired t-0"
    assert (line["node_id"], line["topic"], line["partition"], line["group"]) == (
        7, "t", 0, "readers",
    )  # fmt: skip
    assert line["level"] == "INFO" and line["ts"].endswith("Z")


def test_status_table_renders_every_section() -> None:
    from kafscale.broker.observability.status import (
        BrokerRow,
        ClusterStatus,
        LagRow,
        PartitionRow,
        broker_state,
        render,
    )

    status = ClusterStatus(
        "prod",
        [
            BrokerRow(1, "10.0.0.1:9092", None, "10.0.0.1:8080", "ready", 2, 5),
            BrokerRow(2, "10.0.0.2:9092", "b", "10.0.0.2:8080", "unreachable", None, None),
        ],
        [PartitionRow("t", 0, 1, 3, 0, 10), PartitionRow("t", 1, None, 2, 0, 4)],
        [LagRow("g", "t", 0, 6, 10, 4), LagRow("g", "t", 1, 4, 4, 0)],
    )
    text = render(status)
    assert "prod: 2 brokers, 1 topics, 2 partitions (1 without owner)" in text
    assert "2   10.0.0.2:9092  b     10.0.0.2:8080  unreachable  -      -" in text
    assert "g      4" in text
    assert broker_state({"kafscale_broker_ready": 1.0}, marked_draining=False) == "ready"
    assert broker_state({"kafscale_broker_ready": 1.0}, marked_draining=True) == "draining"
    assert broker_state({}, marked_draining=False) == "starting"


async def test_admin_metrics_route_answers_text_and_survives_a_failing_renderer() -> None:
    import asyncio

    from kafscale.broker.admin_http import AdminRoutes, AdminServer, admin_request

    calls = {"n": 0}

    def render() -> bytes:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("collector broke")
        return b"# TYPE x gauge\nx 1.0\n"

    async def drain() -> None:
        return None

    server = AdminServer(AdminRoutes(lambda: True, drain, dict, render), "127.0.0.1", 0)
    await server.start()
    try:
        url = f"http://127.0.0.1:{server.port}"

        def get(path: str) -> tuple[int, str, str]:
            import urllib.error
            import urllib.request

            try:
                with urllib.request.urlopen(url + path, timeout=5) as response:
                    return (
                        response.status,
                        response.headers["Content-Type"],
                        response.read().decode(),
                    )
            except urllib.error.HTTPError as exc:
                return exc.code, exc.headers["Content-Type"], exc.read().decode()

        status, content_type, body = await asyncio.to_thread(get, "/metrics")
        assert (status, body) == (200, "# TYPE x gauge\nx 1.0\n")
        assert content_type.startswith("text/plain; version=0.0.4")
        status, _, body = await asyncio.to_thread(get, "/metrics")
        assert status == 500 and "collector broke" in body
        assert await asyncio.to_thread(admin_request, url, "GET", "/healthz") == (
            200,
            {"status": "ok"},
        )
    finally:
        await server.close()
