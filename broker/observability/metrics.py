"""The process's hot-path metrics: plain counters and histograms, exported at scrape time.

Requests, bytes, flushes, object-store and etcd calls are counted on the event loop thread
(every caller runs there), so a count is an ``int +=`` and a histogram observation a
``bisect`` and two adds: no locks, no ``labels()`` lookups per call. ``prometheus_client``
turns them into the text format only when ``/metrics`` is scraped (``hot_path_collector``,
which alone imports it: processes that count without serving ``/metrics``, such as the Spark
source's planners calling etcd, never load it).
``METRICS.enabled = False`` turns every record call into an early return; the metrics-cost
bench compares both ways.

Label values are bounded: API names come from the API table, operation names from the code,
topics from the cluster's topic set (the broker's collector drops counters of topics that no
longer exist at each scrape). There is no per-client or per-connection label.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections.abc import Iterable, Sequence, Sized
from dataclasses import dataclass, field
from typing import Protocol

# Seconds. Requests range from sub-millisecond metadata answers to long-polled fetches.
REQUEST_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
# Seconds. Object-store and etcd calls: milliseconds when well, seconds when not.
# Seconds. Quota throttle times: a few ms to the 30 s cap.
THROTTLE_BUCKETS_S = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
CALL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class HasRecordCount(Protocol):
    """A batch header (``record_batch.BatchHeader``): only its record count is read here."""

    @property
    def record_count(self) -> int: ...


class Histogram:
    """Bucket counts (``le`` semantics; the last is +Inf) and the sum of observed values."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, cumulative count)`` pairs as the exposition format wants them."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        return out


class HistogramFamily:
    """Histograms keyed by one label value (an API, an operation)."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = bounds
        self.children: dict[str, Histogram] = {}

    def child(self, label: str) -> Histogram:
        histogram = self.children.get(label)
        if histogram is None:
            histogram = self.children[label] = Histogram(self._bounds)
        return histogram


@dataclass(slots=True)
class TopicTraffic:
    """Bytes and records one topic took in (produce) and gave out (fetch)."""

    bytes_in: int = 0
    records_in: int = 0
    bytes_out: int = 0
    records_out: int = 0


@dataclass
class Metrics:
    """Everything counted on the hot path, for this process."""

    enabled: bool = True
    requests: HistogramFamily = field(default_factory=lambda: HistogramFamily(REQUEST_BUCKETS_S))
    request_errors: dict[str, int] = field(default_factory=dict)
    topics: dict[str, TopicTraffic] = field(default_factory=dict)
    flushes: Histogram = field(default_factory=lambda: Histogram(CALL_BUCKETS_S))
    flush_bytes: int = 0
    flush_objects: int = 0
    flush_failures: int = 0
    store_calls: HistogramFamily = field(default_factory=lambda: HistogramFamily(CALL_BUCKETS_S))
    store_errors: dict[str, int] = field(default_factory=dict)
    etcd_calls: HistogramFamily = field(default_factory=lambda: HistogramFamily(CALL_BUCKETS_S))
    etcd_errors: dict[str, int] = field(default_factory=dict)
    cache_hits: int = 0
    cache_misses: int = 0
    connections_accepted: int = 0
    # What a hostile or broken client causes (its log lines are limited, ``log_limit``; these
    # count every one). Rare paths: counted even when ``enabled`` is off.
    sasl_authentication_failures: int = 0
    malformed_requests: int = 0
    connections_refused: dict[str, int] = field(default_factory=dict)  # by limit reached
    client_log_lines_suppressed: dict[str, int] = field(default_factory=dict)  # by ClientEvent
    cleaner_passes: int = 0
    cleaner_bytes_read: int = 0
    cleaner_bytes_written: int = 0
    cleaner_last_pass_s: float = 0.0
    offsets_expired: int = 0
    """Committed offsets removed by offset retention (KIP-211), rare: counted even when off."""
    groups_expired: int = 0
    """Empty groups deleted by offset retention once no offset was left."""
    unreadable_group_records: int = 0
    """Loads and listings of a group that met a stored value that does not decode."""
    # Throttle times given to clients over a byte-rate quota, per quota key (two label values).
    throttles: HistogramFamily = field(default_factory=lambda: HistogramFamily(THROTTLE_BUCKETS_S))

    def request(self, api: str, seconds: float, failed: bool) -> None:
        """One answered request: every request pays this, so the histogram's child is looked
        up with one ``dict.get`` and observed inline (no method calls; measured in
        ``bench/metrics_cost.py``)."""
        if not self.enabled:
            return
        histogram = self.requests.children.get(api) or self.requests.child(api)
        histogram.counts[bisect_left(histogram.bounds, seconds)] += 1
        histogram.total += seconds
        if failed:
            self.request_errors[api] = self.request_errors.get(api, 0) + 1

    def produced(self, topic: str, nbytes: int, records: int) -> None:
        if not self.enabled:
            return
        traffic = self.topics.get(topic) or self._new_topic(topic)
        traffic.bytes_in += nbytes
        traffic.records_in += records

    def produced_batches(
        self, topic: str, batches: Sequence[Sized], headers: Sequence[HasRecordCount]
    ) -> None:
        """One partition's appended batches: bytes and records summed here, once per request
        and partition (nothing is summed when metrics are off)."""
        if not self.enabled:
            return
        traffic = self.topics.get(topic) or self._new_topic(topic)
        for batch in batches:  # two plain loops: half the cost of zip() or sum(generator)
            traffic.bytes_in += len(batch)
        for header in headers:
            traffic.records_in += header.record_count

    def _new_topic(self, topic: str) -> TopicTraffic:
        traffic = self.topics[topic] = TopicTraffic()
        return traffic

    def fetched(self, topic: str, records: bytes | memoryview) -> None:
        if not self.enabled or not records:
            return
        traffic = self.topics.get(topic) or self._new_topic(topic)
        traffic.bytes_out += len(records)
        traffic.records_out += count_records(records)

    def flushed(self, seconds: float, nbytes: int, objects: int) -> None:
        if not self.enabled:
            return
        self.flushes.observe(seconds)
        self.flush_bytes += nbytes
        self.flush_objects += objects

    def cleaned(self, seconds: float, bytes_read: int, bytes_written: int) -> None:
        """A committed compaction pass (``storage.cleaner``): rare, so counted even when off."""
        self.cleaner_passes += 1
        self.cleaner_bytes_read += bytes_read
        self.cleaner_bytes_written += bytes_written
        self.cleaner_last_pass_s = seconds

    def flush_failed(self) -> None:
        self.flush_failures += 1

    def store_call(self, operation: str, seconds: float, failed: bool) -> None:
        if not self.enabled:
            return
        self.store_calls.child(operation).observe(seconds)
        if failed:
            self.store_errors[operation] = self.store_errors.get(operation, 0) + 1

    def etcd_call(self, operation: str, seconds: float, failed: bool) -> None:
        if not self.enabled:
            return
        self.etcd_calls.child(operation).observe(seconds)
        if failed:
            self.etcd_errors[operation] = self.etcd_errors.get(operation, 0) + 1

    def etcd_watch_stalled(self) -> None:
        """A watch re-created because its member stopped delivering (``watch_progress``):
        counted as an etcd error of the operation ``watch stalled``, even when off (rare)."""
        self.etcd_errors["watch stalled"] = self.etcd_errors.get("watch stalled", 0) + 1

    def cache_lookup(self, hit: bool) -> None:
        if hit:
            self.cache_hits += 1
        else:
            self.cache_misses += 1

    def connection_refused(self, limit: str) -> None:
        self.connections_refused[limit] = self.connections_refused.get(limit, 0) + 1

    def client_log_suppressed(self, event: str) -> None:
        """A log line about a client left out (``log_limit``): labels are its fixed kinds."""
        self.client_log_lines_suppressed[event] = self.client_log_lines_suppressed.get(event, 0) + 1

    def throttled(self, quota_key: str, throttle_ms: int) -> None:
        """A response throttled for ``throttle_ms`` by the ``quota_key`` quota."""
        if not self.enabled:
            return
        self.throttles.child(quota_key).observe(throttle_ms / 1000)

    def forget_topics_except(self, topics: Iterable[str]) -> None:
        """Drop the counters of deleted topics (keeps label values bounded by live topics)."""
        keep = set(topics)
        for topic in [t for t in self.topics if t not in keep]:
            del self.topics[topic]


METRICS = Metrics()
"""The process's metrics (one per process: ``kafscale local`` brokers share it)."""

_BATCH_LENGTH = struct.Struct(">i")
_RECORD_COUNT = struct.Struct(">i")
_LENGTH_AT = 8  # baseOffset (8) then batchLength (4): the bytes after the length field
_COUNT_AT = 57  # ... magic, crc, attributes, lastOffsetDelta, timestamps, producer, records count
_HEADER = 61


def count_records(records: bytes | memoryview) -> int:
    """Records in a run of v2 record batches, read from their headers (a torn last batch, as a
    fetch may end with, is not counted)."""
    view = memoryview(records)
    total = 0
    position = 0
    end = len(view)
    while position + _HEADER <= end:
        (length,) = _BATCH_LENGTH.unpack_from(view, position + _LENGTH_AT)
        batch_end = position + 12 + length
        if length <= 0 or batch_end > end:
            break
        (count,) = _RECORD_COUNT.unpack_from(view, position + _COUNT_AT)
        total += max(count, 0)
        position = batch_end
    return total
