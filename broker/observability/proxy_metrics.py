"""The proxy's state as Prometheus gauges and counters, read when ``/metrics`` is scraped:
client and upstream connections, forwarded requests, retries by reason (a bounded set named in
the code), routes, fetch sessions."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from kafscale.broker.proxy.app import Proxy


class ProxyCollector(Collector):
    def __init__(self, proxy: Proxy) -> None:
        self._proxy = proxy

    def collect(self) -> Iterator[Metric]:
        proxy = self._proxy
        stats = proxy.stats
        routes = proxy.routes
        clients = proxy.server.client_connections if proxy.server is not None else 0
        yield GaugeMetricFamily("kafscale_proxy_ready", "1 while the proxy serves.",
                                value=float(proxy.is_ready()))  # fmt: skip
        yield GaugeMetricFamily(
            "kafscale_cluster_view_following",
            "1 while the cluster view follows etcd (0: it routes from what it last saw).",
            value=float(routes.view.following),
        )
        yield GaugeMetricFamily(
            "kafscale_proxy_client_connections", "Open client connections.", value=clients
        )
        yield GaugeMetricFamily(
            "kafscale_proxy_upstream_connections", "Open connections to brokers.", value=stats.open
        )
        yield CounterMetricFamily(
            "kafscale_proxy_upstream_connect_failures",
            "Connections to brokers that could not be opened.",
            value=stats.failed,
        )
        yield CounterMetricFamily(
            "kafscale_proxy_upstream_requests", "Requests forwarded to brokers.",
            value=stats.requests,
        )  # fmt: skip
        retries = CounterMetricFamily(
            "kafscale_proxy_retries", "Forwarded requests retried, per reason.", labels=["reason"]
        )
        for reason, count in sorted(stats.retries.items()):
            retries.add_metric([reason], count)
        yield retries
        partitions = list(routes.view.partitions())
        yield GaugeMetricFamily(
            "kafscale_proxy_partitions_without_route",
            "Partitions the proxy knows no owner for.",
            value=sum(1 for tp in partitions if routes.partition_owner(tp) < 0),
        )
        yield GaugeMetricFamily(
            "kafscale_proxy_brokers_live", "Brokers registered in etcd.",
            value=len(routes.view.brokers),
        )  # fmt: skip
        yield GaugeMetricFamily(
            "kafscale_proxy_fetch_sessions", "Incremental fetch sessions cached.",
            value=len(proxy.sessions),
        )  # fmt: skip
