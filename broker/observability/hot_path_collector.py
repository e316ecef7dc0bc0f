"""``METRICS`` (the process's hot-path counters, ``metrics``) in Prometheus form, for
``GET /metrics`` of a broker or a proxy. Apart from ``metrics`` so that what only counts does
not import ``prometheus_client``."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from kafscale.broker.observability.metrics import METRICS, HistogramFamily, Metrics


class HotPathCollector(Collector):
    """Exports ``METRICS`` in Prometheus form (names carry units; counters end in _total)."""

    def __init__(self, metrics: Metrics = METRICS, proxy: bool = False) -> None:
        self._metrics = metrics
        self._prefix = "kafscale_proxy" if proxy else "kafscale"

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        p = self._prefix
        yield _histograms(
            f"{p}_request_duration_seconds",
            "Time from a decoded request to its answer, per Kafka API (long polls included).",
            "api",
            m.requests,
        )
        yield _counters(
            f"{p}_request_errors",
            "Requests answered with a top-level error (an exception in the handler), per API.",
            "api",
            m.request_errors,
        )
        yield CounterMetricFamily(
            f"{p}_connections_accepted", "Kafka connections accepted.", m.connections_accepted
        )
        yield from self._client_faults()
        if self._prefix == "kafscale":
            yield from self._broker_metrics()

    def _client_faults(self) -> Iterator[Metric]:
        """What hostile or broken clients caused: each event counted, though its log line
        may have been left out (``log_limit``)."""
        m = self._metrics
        p = self._prefix
        yield CounterMetricFamily(
            f"{p}_sasl_authentication_failures",
            "Failed SASL logins (wrong credentials, unknown user or token, unsupported "
            "mechanism, out-of-order SASL requests).",
            m.sasl_authentication_failures,
        )
        yield CounterMetricFamily(
            f"{p}_malformed_requests",
            "Requests that could not be read: a body that does not parse (INVALID_REQUEST), "
            "a frame without a readable header or over the size limit (connection closed).",
            m.malformed_requests,
        )
        yield _counters(
            f"{p}_connections_refused",
            "Connections closed at once for a limit, per limit (max_connections, "
            "max_connections_per_address).",
            "limit",
            m.connections_refused,
        )
        yield _counters(
            f"{p}_client_log_lines_suppressed",
            "Log lines about clients left out by the log limit (first 10 per kind and client "
            "host per 60 s are written), per kind.",
            "kind",
            m.client_log_lines_suppressed,
        )

    def _broker_metrics(self) -> Iterator[Metric]:
        m = self._metrics
        for name, help_, attribute in (
            ("kafscale_produce_bytes", "Record-batch bytes appended, per topic.", "bytes_in"),
            ("kafscale_produce_records", "Records appended, per topic.", "records_in"),
            (
                "kafscale_fetch_bytes",
                "Record-batch bytes sent to fetchers, per topic.",
                "bytes_out",
            ),
            ("kafscale_fetch_records", "Records sent to fetchers, per topic.", "records_out"),
        ):
            family = CounterMetricFamily(name, help_, labels=["topic"])
            for topic, traffic in sorted(m.topics.items()):
                family.add_metric([topic], getattr(traffic, attribute))
            yield family
        flushes = HistogramMetricFamily(
            "kafscale_flush_duration_seconds",
            "Flush rounds: upload of segments and their etcd commit.",
        )
        flushes.add_metric([], m.flushes.cumulative(), m.flushes.total)
        yield flushes
        yield CounterMetricFamily(
            "kafscale_flush_bytes", "Segment bytes committed by flushes.", m.flush_bytes
        )
        yield CounterMetricFamily(
            "kafscale_flush_objects", "Segment objects committed by flushes.", m.flush_objects
        )
        yield CounterMetricFamily(
            "kafscale_flush_failures", "Flush rounds that failed.", m.flush_failures
        )
        yield _histograms(
            "kafscale_object_store_request_duration_seconds",
            "Object-store calls, per operation.",
            "operation",
            m.store_calls,
        )
        yield _counters(
            "kafscale_object_store_errors",
            "Object-store calls that failed (missing keys and lost races excluded).",
            "operation",
            m.store_errors,
        )
        yield _histograms(
            "kafscale_etcd_request_duration_seconds",
            "etcd calls (reads, writes, transactions, lease calls), per operation.",
            "operation",
            m.etcd_calls,
        )
        yield _counters(
            "kafscale_etcd_errors", "etcd calls that failed, per operation.", "operation",
            m.etcd_errors,
        )  # fmt: skip
        yield _histograms(
            "kafscale_quota_throttle_seconds",
            "Throttle times answered to clients over a byte-rate quota, per quota key.",
            "quota",
            m.throttles,
        )
        yield CounterMetricFamily(
            "kafscale_cleaner_passes", "Log compaction passes committed.", m.cleaner_passes
        )
        yield CounterMetricFamily(
            "kafscale_cleaner_bytes_read",
            "Bytes log compaction read (cleaned and dirty objects).",
            m.cleaner_bytes_read,
        )
        yield CounterMetricFamily(
            "kafscale_cleaner_bytes_written",
            "Bytes of cleaned objects log compaction wrote.",
            m.cleaner_bytes_written,
        )
        yield GaugeMetricFamily(
            "kafscale_cleaner_last_pass_seconds",
            "Duration of this broker's last committed compaction pass.",
            m.cleaner_last_pass_s,
        )
        yield CounterMetricFamily(
            "kafscale_group_offsets_expired",
            "Committed offsets this broker expired (offsets.retention.minutes, KIP-211).",
            m.offsets_expired,
        )
        yield CounterMetricFamily(
            "kafscale_groups_expired",
            "Empty groups this broker deleted once offset retention left them no offsets.",
            m.groups_expired,
        )
        yield CounterMetricFamily(
            "kafscale_group_records_unreadable",
            "Times a group was not served or listed because a value it has in etcd does not "
            "decode (each load, listing or retention check that met one).",
            m.unreadable_group_records,
        )
        yield CounterMetricFamily(
            "kafscale_segment_cache_hits", "Segment reads served from memory.", m.cache_hits
        )
        yield CounterMetricFamily(
            "kafscale_segment_cache_misses",
            "Segment reads that went to object storage.",
            m.cache_misses,
        )


def _histograms(name: str, help_: str, label: str, family: HistogramFamily) -> Metric:
    metric = HistogramMetricFamily(name, help_, labels=[label])
    for value, histogram in sorted(family.children.items()):
        metric.add_metric([value], histogram.cumulative(), histogram.total)
    return metric


def _counters(name: str, help_: str, label: str, values: dict[str, int]) -> Metric:
    metric = CounterMetricFamily(name, help_, labels=[label])
    for value, count in sorted(values.items()):
        metric.add_metric([value], count)
    return metric
