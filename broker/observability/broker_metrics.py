"""One broker's state as Prometheus gauges, read when ``/metrics`` is scraped.

Nothing here runs on the request path: ownership, the session, the cache, connections, fetch
sessions, the groups this broker coordinates and their lag are read from the broker's own
objects at scrape time. Lag is reported for every group with committed offsets by one broker
(one series per group and committed partition in the whole cluster, so ``sum`` over brokers
never counts twice): the group's coordinator, else, for a group nobody coordinates (its
consumers gone, let go when idle, not asked for since a restart), the broker FindCoordinator
would name, from offsets a background refresh read from etcd (``groups.stored_lag``): a scrape
never waits on etcd.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kafscale.broker.groups.model import GroupState
from kafscale.broker.groups.store import CommittedOffset, TopicPartition
from kafscale.broker.metadata.session_lease import Phase, SessionLease
from kafscale.broker.metadata.topic_info import TopicInfo
from kafscale.broker.observability.lag import consumer_lag
from kafscale.broker.observability.metrics import METRICS, Metrics

if TYPE_CHECKING:
    from kafscale.broker.app import Broker


class BrokerCollector(Collector):
    def __init__(self, broker: Broker, metrics: Metrics = METRICS) -> None:
        self._broker = broker
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        broker = self._broker
        view = broker.view
        self._metrics.forget_topics_except(view.topics)
        yield _gauge("kafscale_broker_ready", "1 while the broker serves.", broker.ready)
        yield _gauge(
            "kafscale_cluster_view_following",
            "1 while the cluster view follows etcd (0: it answers from what it last saw).",
            view.following,
        )
        yield _gauge(
            "kafscale_broker_draining", "1 while the broker hands its partitions over.",
            broker.draining,
        )  # fmt: skip
        yield _gauge(
            "kafscale_session_lease_alive",
            "1 while the broker's etcd session lease is alive (0: it expired; ownership lost).",
            not broker.session.lost.is_set(),
        )
        yield from _session(broker.session)
        owned = broker.manager.owned if broker.manager is not None else {}
        yield _gauge(
            "kafscale_owned_partitions", "Partitions whose lease this broker holds.", len(owned)
        )
        partitions = list(view.partitions())
        yield _gauge("kafscale_partitions", "Partitions in the cluster.", len(partitions))
        yield _gauge(
            "kafscale_partitions_without_owner",
            "Partitions of the cluster whose lease nobody holds (cluster-wide, as this broker "
            "sees it).",
            sum(1 for tp in partitions if tp not in view.owners),
        )
        yield _gauge("kafscale_brokers_live", "Brokers registered in etcd.", len(view.brokers))
        yield _gauge(
            "kafscale_segment_cache_bytes", "Bytes of segments held in memory.",
            broker.cache.size_bytes,
        )  # fmt: skip
        yield _gauge(
            "kafscale_buffered_produce_bytes",
            "Produced bytes buffered and not yet durable.",
            broker.produce_budget.used,
        )
        connections = broker.server.open_connections if broker.server is not None else 0
        yield _gauge("kafscale_connections", "Open Kafka connections.", connections)
        yield _gauge(
            "kafscale_fetch_sessions", "Incremental fetch sessions cached.",
            len(broker.fetch_sessions),
        )  # fmt: skip
        yield from self._groups()

    def _groups(self) -> Iterator[Metric]:
        broker = self._broker
        runtimes = broker.groups.coordinated() if broker.groups is not None else []
        states = GaugeMetricFamily(
            "kafscale_consumer_groups",
            "Consumer groups this broker coordinates, per state.",
            labels=["state"],
        )
        by_state = Counter(r.group.state.value for r in runtimes if r.group is not None)
        for state in GroupState:
            states.add_metric([state.value], by_state.get(state.value, 0))
        yield states
        members = GaugeMetricFamily(
            "kafscale_consumer_group_members", "Members of each group coordinated here.",
            labels=["group"],
        )  # fmt: skip
        generation = GaugeMetricFamily(
            "kafscale_consumer_group_generation",
            "Generation of each group coordinated here (it grows by one per rebalance).",
            labels=["group"],
        )
        for runtime in runtimes:
            if runtime.group is not None:
                members.add_metric([runtime.group_id], len(runtime.group.members))
                generation.add_metric([runtime.group_id], runtime.group.generation)
        yield members
        yield generation
        yield from self._lag()

    def _lag(self) -> Iterator[Metric]:
        broker = self._broker
        groups = broker.groups
        reported = groups.lag_offsets() if groups is not None else []
        topics = broker.view.topics
        committed = [(group_id, _valid_offsets(offsets, topics)) for group_id, offsets in reported]
        wanted = {tp for _, offsets in committed for tp in offsets}
        watermarks = {tp: broker.committed_state(tp).high_watermark for tp in wanted}
        lag = GaugeMetricFamily(
            "kafscale_consumer_group_lag",
            "High watermark minus committed offset, per group and partition, for every group "
            "with committed offsets (reported by one broker: the group's coordinator, else the "
            "broker FindCoordinator would name).",
            labels=["group", "topic", "partition"],
        )
        for entry in consumer_lag(committed, watermarks):
            lag.add_metric([entry.group, entry.topic, str(entry.partition)], entry.lag)
        yield lag
        if groups is None:
            return
        stored = groups.stored_lag
        yield _gauge(
            "kafscale_consumer_group_lag_stored_groups",
            "Groups whose committed offsets this broker read from etcd to report their lag "
            "while nobody coordinates them (those it is the FindCoordinator pick of).",
            len(stored.offsets),
        )
        yield CounterMetricFamily(
            "kafscale_consumer_group_lag_refresh_reads",
            "etcd reads (pages of stored group keys) made to refresh those offsets.",
            stored.reads,
        )
        yield CounterMetricFamily(
            "kafscale_consumer_group_lag_refreshes_capped",
            "Refreshes that stopped at groups.lag_refresh_max_groups, leaving groups for the "
            "next ones.",
            stored.capped,
        )


def _valid_offsets(
    offsets: Mapping[TopicPartition, CommittedOffset], topics: Mapping[str, TopicInfo]
) -> dict[TopicPartition, int]:
    """The committed offsets of existing topics that belong to them (not to a deleted topic
    of the same name: ``CommittedOffset.still_valid``)."""
    out: dict[TopicPartition, int] = {}
    for tp, committed in offsets.items():
        info = topics.get(tp[0])
        if info is not None and committed.still_valid(info.topic_id):
            out[tp] = committed.offset
    return out


def _gauge(name: str, help_: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_, value=float(value))


def _session(session: SessionLease) -> Iterator[Metric]:
    """The session's phase, one series per phase as ``kafscale_consumer_groups`` has per state
    (1 for the current one): ``kafscale_session_lease_alive`` reads 1 while suspended, when
    the broker does not act as owner. And how often it was suspended and resumed: a suspension
    lasts at most two TTLs (20 s by default), often less than a scrape interval, and a gauge
    scraped before and after it never shows it; ``increase()`` of the counters does."""
    phase = session.phase()
    states = GaugeMetricFamily(
        "kafscale_session_lease_state",
        "1 for the phase the broker's etcd session is in: valid (it acts as owner), suspended "
        "(keepalives unanswered for a TTL: it does not), lost (it gives everything up).",
        labels=["state"],
    )
    for each in Phase:
        states.add_metric([each.value], 1 if each is phase else 0)
    yield states
    yield CounterMetricFamily(
        "kafscale_session_lease_suspensions",
        "Times the broker's etcd session was suspended (keepalives unanswered for a TTL).",
        value=session.counts.suspensions,
    )
    yield CounterMetricFamily(
        "kafscale_session_lease_resumptions",
        "Times a suspended session resumed (etcd renewed the lease in time; nothing was lost).",
        value=session.counts.resumptions,
    )
