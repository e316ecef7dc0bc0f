"""The operator's Prometheus metrics: what its handlers did and what state its clusters are in.

``kafscale_operator_reconciles_total`` and ``kafscale_operator_reconcile_duration_seconds``
count and time every handler run by handler (the kopf handler's name) and outcome (``success``;
``retry``: a temporary error, kopf tries again; ``failed``: a permanent error, it does not;
``error``: anything unexpected, kopf retries it too). Cancelled runs (the operator stopping) are
not counted. The cluster gauges come from the last status each cluster was given: clusters per
phase, and per cluster its Ready and Degraded conditions and brokers desired against ready
(label values are the clusters' namespaces and names, bounded by the resources that exist; a
deleted cluster's series go away). The labels are ``namespace`` and ``kafscale_cluster``, the
names the chart's PodMonitor gives brokers' series, so one dashboard filter selects both (the
PodMonitor keeps the operator's own values: ``honorLabels``).

Each :class:`OperatorMetrics` has its own registry (process, platform and garbage-collector
metrics included), so an operator started in-process by a test reports only its own work.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import kopf
from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kafscale.operator.model_base import ConditionStatus
from kafscale.operator.models import ClusterPhase, ClusterRef, KafScaleClusterStatus

# Seconds: a status round reads a few objects (milliseconds); an apply or a delete that waits
# for etcd, S3 or a slow API server takes seconds.
RECONCILE_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def outcome_of(error: BaseException | None) -> str:
    """How a handler run ended, in the words of the ``outcome`` label."""
    if error is None:
        return "success"
    if isinstance(error, kopf.TemporaryError):
        return "retry"
    if isinstance(error, kopf.PermanentError):
        return "failed"
    return "error"


@dataclass(frozen=True, slots=True)
class ClusterSample:
    """What the operator last reported about one cluster."""

    phase: str
    ready: bool
    degraded: bool
    brokers_desired: int | None
    brokers_ready: int


def sample_cluster(status: KafScaleClusterStatus, brokers_desired: int | None) -> ClusterSample:
    conditions = {c.type: c.status == ConditionStatus.TRUE for c in status.conditions}
    return ClusterSample(
        phase=str(status.phase or ClusterPhase.PENDING),
        ready=conditions.get("Ready", False),
        degraded=conditions.get("Degraded", False),
        brokers_desired=brokers_desired,
        brokers_ready=status.brokers.ready_replicas,
    )


class ClusterCollector(Collector):
    """The clusters' gauges, from the samples the handlers leave (read at scrape time, from the
    metrics server's thread: hence the lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clusters: dict[tuple[str, str], ClusterSample] = {}
        # uids of deleted clusters: a status round that read the cluster before its deletion
        # and ends after it must not bring its series back.
        self._deleted: set[str] = set()

    def observe(self, ref: ClusterRef, sample: ClusterSample) -> None:
        with self._lock:
            if ref.uid not in self._deleted:
                self._clusters[(ref.namespace, ref.name)] = sample

    def forget(self, ref: ClusterRef) -> None:
        with self._lock:
            self._clusters.pop((ref.namespace, ref.name), None)
            if ref.uid:
                self._deleted.add(ref.uid)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            clusters = sorted(self._clusters.items())
        phases = GaugeMetricFamily(
            "kafscale_operator_clusters", "KafScaleClusters per phase.", labels=["phase"]
        )
        for phase in ClusterPhase:
            phases.add_metric([phase.value], sum(1 for _, s in clusters if s.phase == phase))
        yield phases
        labels = ["namespace", "kafscale_cluster"]
        families = {
            "ready": GaugeMetricFamily(
                "kafscale_operator_cluster_ready",
                "1 while the cluster's Ready condition is True.",
                labels=labels,
            ),
            "degraded": GaugeMetricFamily(
                "kafscale_operator_cluster_degraded",
                "1 while the cluster's Degraded condition is True (its reason says what to do).",
                labels=labels,
            ),
            "brokers_desired": GaugeMetricFamily(
                "kafscale_operator_brokers_desired",
                "Brokers the cluster should run (the spec's replicas, or the autoscaler's).",
                labels=labels,
            ),
            "brokers_ready": GaugeMetricFamily(
                "kafscale_operator_brokers_ready", "Broker pods that are ready.", labels=labels
            ),
        }
        for (namespace, name), sample in clusters:
            for attribute, family in families.items():
                value = getattr(sample, attribute)
                if value is not None:
                    family.add_metric([namespace, name], float(value))
        yield from families.values()


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.reconciles = Counter(
            "kafscale_operator_reconciles",
            "Handler runs, per handler and outcome (success, retry, failed, error).",
            ["handler", "outcome"],
            registry=self.registry,
        )
        self.durations = Histogram(
            "kafscale_operator_reconcile_duration_seconds",
            "Time of a handler run, per handler and outcome.",
            ["handler", "outcome"],
            buckets=RECONCILE_BUCKETS_S,
            registry=self.registry,
        )
        self.clusters = ClusterCollector()
        self.registry.register(self.clusters)

    def record(self, handler: str, seconds: float, error: BaseException | None) -> None:
        outcome = outcome_of(error)
        self.reconciles.labels(handler, outcome).inc()
        self.durations.labels(handler, outcome).observe(seconds)

    def timed(self, handler: F) -> F:
        """Wrap a kopf handler so that each run is counted and timed (its name, which kopf
        uses as the handler id in the progress it stores, is kept)."""
        name = handler.__name__

        @functools.wraps(handler)
        async def run(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                result = await handler(*args, **kwargs)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                self.record(name, time.perf_counter() - started, error)
                raise
            self.record(name, time.perf_counter() - started, None)
            return result

        return run  # type: ignore[return-value]

    def observe_cluster(
        self, ref: ClusterRef, status: KafScaleClusterStatus, desired: int | None
    ) -> None:
        self.clusters.observe(ref, sample_cluster(status, desired))

    def forget_cluster(self, ref: ClusterRef) -> None:
        self.clusters.forget(ref)
