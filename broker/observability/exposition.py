"""``GET /metrics``: a registry of collectors rendered in Prometheus's text format.

Each admin server gets a registry of its own (its process's hot-path counters, its component's
state, the process's CPU and memory), so that ``kafscale local``'s brokers, which share a
process, each still report their own ownership and groups.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
"""The classic text format (0.0.4): every Prometheus 2.x and 3.x reads it."""


def metrics_renderer(*collectors: Collector) -> Callable[[], bytes]:
    """A function that renders ``collectors`` (plus process metrics) for one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    for collector in collectors:
        registry.register(collector)
    return lambda: generate_latest(registry)
