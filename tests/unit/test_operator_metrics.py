"""The operator's metrics without a server: handler outcomes, cluster samples and what the
exposition says about them."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest
from harness.monitoring_doc import metrics_table, served_families
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kafscale.operator.metrics import OperatorMetrics
from kafscale.operator.model_base import Condition, ConditionStatus
from kafscale.operator.model_cluster_status import BrokerStatus
from kafscale.operator.models import ClusterPhase, ClusterRef, KafScaleClusterStatus

pytestmark = pytest.mark.unit


def samples(metrics: OperatorMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def status(phase: ClusterPhase, ready: bool, degraded: bool, ready_brokers: int) -> Any:
    def condition(type_: str, value: bool) -> Condition:
        return Condition(
            type=type_,
            status=ConditionStatus.TRUE if value else ConditionStatus.FALSE,
            reason="R",
            message="",
            last_transition_time="2026-11-26T00:00:00Z",
            observed_generation=1,
        )

    return KafScaleClusterStatus(
        phase=phase,
        conditions=[condition("Ready", ready), condition("Degraded", degraded)],
        brokers=BrokerStatus(replicas=3, ready_replicas=ready_brokers),
    )


async def test_handler_runs_are_counted_per_outcome_and_keep_the_handler_name() -> None:
    metrics = OperatorMetrics()

    async def reconcile_thing(fail: BaseException | None = None, **_: Any) -> str:
        if fail is not None:
            raise fail
        return "done"

    timed = metrics.timed(reconcile_thing)
    assert timed.__name__ == "reconcile_thing"  # kopf's handler id (stored progress) stays
    assert await timed() == "done"
    for error in (kopf.TemporaryError("later"), kopf.PermanentError("never"), ValueError("bug")):
        with pytest.raises(type(error)):
            await timed(fail=error)
    with pytest.raises(asyncio.CancelledError):
        await timed(fail=asyncio.CancelledError())
    seen = samples(metrics)
    for outcome in ("success", "retry", "failed", "error"):
        labels = (("handler", "reconcile_thing"), ("outcome", outcome))
        assert seen[("kafscale_operator_reconciles_total", labels)] == 1
        assert seen[("kafscale_operator_reconcile_duration_seconds_count", labels)] == 1
    runs = sum(v for (name, _), v in seen.items() if name == "kafscale_operator_reconciles_total")
    assert runs == 4  # the cancelled run is not counted


def test_clusters_by_phase_and_brokers_desired_against_ready() -> None:
    metrics = OperatorMetrics()
    shop = ClusterRef(name="shop", namespace="a", uid="u1")
    logs = ClusterRef(name="logs", namespace="b", uid="u2")
    metrics.observe_cluster(shop, status(ClusterPhase.RUNNING, True, False, 3), 3)
    metrics.observe_cluster(logs, status(ClusterPhase.DEGRADED, False, True, 1), 2)
    seen = samples(metrics)
    assert seen[("kafscale_operator_clusters", (("phase", "Running"),))] == 1
    assert seen[("kafscale_operator_clusters", (("phase", "Degraded"),))] == 1
    assert seen[("kafscale_operator_clusters", (("phase", "Pending"),))] == 0
    logs_labels = (("kafscale_cluster", "logs"), ("namespace", "b"))
    assert seen[("kafscale_operator_cluster_degraded", logs_labels)] == 1
    assert seen[("kafscale_operator_cluster_ready", logs_labels)] == 0
    assert seen[("kafscale_operator_brokers_desired", logs_labels)] == 2
    assert seen[("kafscale_operator_brokers_ready", logs_labels)] == 1


def test_a_deleted_cluster_leaves_and_a_late_status_round_does_not_bring_it_back() -> None:
    metrics = OperatorMetrics()
    shop = ClusterRef(name="shop", namespace="a", uid="u1")
    metrics.observe_cluster(shop, status(ClusterPhase.RUNNING, True, False, 3), 3)
    metrics.forget_cluster(shop)
    metrics.observe_cluster(shop, status(ClusterPhase.RUNNING, True, False, 3), 3)
    assert not [key for key in samples(metrics) if key[0] == "kafscale_operator_brokers_desired"]
    again = ClusterRef(name="shop", namespace="a", uid="u2")  # re-created under the same name
    metrics.observe_cluster(again, status(ClusterPhase.PENDING, False, False, 0), None)
    seen = samples(metrics)
    labels = (("kafscale_cluster", "shop"), ("namespace", "a"))
    assert seen[("kafscale_operator_cluster_ready", labels)] == 0
    assert ("kafscale_operator_brokers_desired", labels) not in seen  # not known: invalid spec


def test_monitoring_page_lists_the_operators_metrics() -> None:
    """docs/monitoring.md's operator table names every KafScale family the operator serves,
    and only those, with their types (the process, platform and GC families are Python's)."""
    text = generate_latest(OperatorMetrics().registry).decode()
    served = served_families(text, skip_prefixes=("process_", "python_"))
    assert metrics_table("Operator (labels") == served
