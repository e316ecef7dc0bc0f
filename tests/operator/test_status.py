"""Pure decisions: status and conditions, lease distribution, assignment plans, topic changes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from harness.cluster_specs import cluster_spec

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.assignment import Assignment
from kafscale.broker.metadata.etcd_txn import KeyValue
from kafscale.operator.model_cluster_status import LeaseStatus
from kafscale.operator.models import ClusterRef, parse_cluster_spec, parse_topic_spec
from kafscale.operator.snapshot import (
    ClusterSnapshot,
    lease_status,
    parse_snapshot,
    plan_assignment,
)
from kafscale.operator.status import (
    ClusterObservation,
    compute_cluster_status,
    compute_topic_status,
    invalid_spec_status,
)
from kafscale.operator.topics import TopicRecord, decide_topic

pytestmark = pytest.mark.operator

REF = ClusterRef(name="demo", namespace="kafka", uid="u", generation=4)
EXTERNAL_ETCD = {"mode": "External", "endpoints": ["http://e:1"]}
SPEC = parse_cluster_spec(cluster_spec(etcd=EXTERNAL_ETCD))
T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def deployment(
    replicas: int,
    ready: int,
    updated: int,
    *,
    generation: int = 1,
    observed: int = 1,
    spec_replicas: int | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": spec_replicas if spec_replicas is not None else replicas},
        "status": {
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "observedGeneration": observed,
        },
    }


def conditions(status: Any) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in status.conditions}


def test_new_cluster_is_pending_and_progressing() -> None:
    status = compute_cluster_status(REF, SPEC, ClusterObservation(), [], now=T0)
    assert status.phase == "Pending"
    assert conditions(status) == {
        "Ready": ("False", "Creating"),
        "Progressing": ("True", "Creating"),
        "Degraded": ("False", "AsExpected"),
        "FeaturesSupported": ("True", "AllServed"),
    }
    assert status.observed_generation == 4
    assert status.bootstrap == "demo-brokers.kafka.svc:9092"
    assert status.brokers.selector == (
        "app.kubernetes.io/name=kafscale,app.kubernetes.io/instance=demo,"
        "app.kubernetes.io/component=broker"
    )
    assert all(c.observed_generation == 4 for c in status.conditions)


def test_a_restarted_operator_keeps_features_supported_until_it_applied_the_cluster() -> None:
    """Before this process applied the cluster it does not know what was left out: the
    condition keeps what the last process said (it once flapped to AllServed and back,
    posting NotServed twice)."""
    lacking = ClusterObservation(left_out=("PodDisruptionBudget demo (policy/v1 is not served)",))
    before = compute_cluster_status(REF, SPEC, lacking, [], now=T0)
    assert conditions(before)["FeaturesSupported"] == ("False", "NotServed")
    restarted = compute_cluster_status(
        REF, SPEC, ClusterObservation(left_out=None), before.conditions, now=T1
    )
    assert conditions(restarted)["FeaturesSupported"] == ("False", "NotServed")
    assert {c.type: c.last_transition_time for c in restarted.conditions}["FeaturesSupported"] == T0


def test_rollout_then_ready() -> None:
    rolling = compute_cluster_status(
        REF, SPEC, ClusterObservation(broker_deployment=deployment(3, 1, 1)), [], now=T0
    )
    assert rolling.phase == "Provisioning"
    assert conditions(rolling)["Progressing"] == ("True", "RollingUpdate")
    ready = compute_cluster_status(
        REF,
        SPEC,
        ClusterObservation(broker_deployment=deployment(3, 3, 3)),
        rolling.conditions,
        now=T1,
    )
    assert ready.phase == "Running"
    assert conditions(ready) == {
        "Ready": ("True", "AllBrokersReady"),
        "Progressing": ("False", "ReconcileComplete"),
        "Degraded": ("False", "AsExpected"),
        "FeaturesSupported": ("True", "AllServed"),
    }
    times = {c.type: c.last_transition_time for c in ready.conditions}
    # Degraded and FeaturesSupported did not change
    assert times == {"Ready": T1, "Progressing": T1, "Degraded": T0, "FeaturesSupported": T0}
    assert (ready.brokers.replicas, ready.brokers.ready_replicas) == (3, 3)


def test_scaling_reasons() -> None:
    down = compute_cluster_status(
        REF,
        SPEC,
        ClusterObservation(broker_deployment=deployment(4, 4, 4, spec_replicas=3)),
        [],
        now=T0,
    )
    assert conditions(down)["Progressing"] == ("True", "ScalingDown")
    up = compute_cluster_status(
        REF, SPEC, ClusterObservation(broker_deployment=deployment(3, 2, 3)), [], now=T0
    )
    assert conditions(up)["Progressing"] == ("True", "ScalingUp")
    stale = compute_cluster_status(
        REF,
        SPEC,
        ClusterObservation(broker_deployment=deployment(3, 3, 3, generation=2, observed=1)),
        [],
        now=T0,
    )
    assert conditions(stale)["Progressing"] == ("True", "RollingUpdate")


def test_a_refused_spec_change_is_degraded_with_its_own_reason() -> None:
    """Above an apply error: the user must act, and the message says how."""
    refused = compute_cluster_status(
        REF,
        SPEC,
        ClusterObservation(
            broker_deployment=deployment(3, 3, 3),
            refused="etcd.storageSize cannot change after creation: was 1Gi, now 2Gi; ...",
            apply_error="403 Forbidden",
        ),
        [],
        now=T0,
    )
    assert refused.phase == "Degraded"
    assert conditions(refused)["Degraded"] == ("True", "ImmutableFieldChanged")
    assert conditions(refused)["Ready"] == ("False", "ImmutableFieldChanged")
    degraded = next(c for c in refused.conditions if c.type == "Degraded")
    assert degraded.message.startswith("etcd.storageSize cannot change")


def test_degraded_reasons() -> None:
    failed = compute_cluster_status(
        REF,
        SPEC,
        ClusterObservation(broker_deployment=deployment(3, 3, 3), apply_error="403 Forbidden"),
        [],
        now=T0,
    )
    assert failed.phase == "Degraded"
    assert conditions(failed)["Degraded"] == ("True", "ApplyFailed")
    assert conditions(failed)["Ready"] == ("False", "ApplyFailed")
    etcd = compute_cluster_status(
        REF,
        SPEC,
        ClusterObservation(broker_deployment=deployment(3, 3, 3), etcd_error="no etcd"),
        [],
        now=T0,
    )
    assert conditions(etcd)["Degraded"] == ("True", "EtcdUnavailable")
    stalled = deployment(3, 1, 3)
    stalled["status"]["conditions"] = [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}
    ]
    stuck = compute_cluster_status(
        REF, SPEC, ClusterObservation(broker_deployment=stalled), [], now=T0
    )
    assert conditions(stuck)["Degraded"] == ("True", "RolloutStalled")
    invalid = invalid_spec_status(REF, [], "brokers.config['x'] is not a broker setting", now=T0)
    assert invalid.phase == "Degraded"
    assert conditions(invalid)["Degraded"] == ("True", "InvalidSpec")


def test_managed_etcd_starting_and_zero_brokers() -> None:
    managed = parse_cluster_spec(cluster_spec())
    starting = compute_cluster_status(
        REF,
        managed,
        ClusterObservation(
            broker_deployment=deployment(3, 0, 3),
            etcd_statefulset={"status": {"readyReplicas": 1}},
            etcd_error="unreachable",
        ),
        [],
        now=T0,
    )
    assert conditions(starting)["Progressing"] == ("True", "EtcdStarting")
    assert conditions(starting)["Degraded"] == ("False", "AsExpected")  # starting, not broken
    zero = parse_cluster_spec(cluster_spec(brokers={"replicas": 0}, etcd=EXTERNAL_ETCD))
    status = compute_cluster_status(
        REF, zero, ClusterObservation(broker_deployment=deployment(0, 0, 0)), [], now=T0
    )
    assert conditions(status)["Ready"] == ("False", "ScaledToZero")


def test_hpa_decides_desired_replicas() -> None:
    autoscaling = {"enabled": True, "minReplicas": 2, "maxReplicas": 9}
    raw = cluster_spec(brokers={"replicas": 3}, etcd=EXTERNAL_ETCD)
    auto = parse_cluster_spec({**raw, "autoscaling": autoscaling})
    status = compute_cluster_status(
        REF, auto, ClusterObservation(broker_deployment=deployment(6, 6, 6)), [], now=T0
    )
    assert status.phase == "Running"
    # kubectl get's DESIRED column reads it: the HPA's 6, not the ignored spec's 3.
    assert status.brokers.desired == 6
    fixed = compute_cluster_status(
        REF,
        parse_cluster_spec(raw),
        ClusterObservation(broker_deployment=deployment(3, 3, 3)),
        [],
        now=T0,
    )
    assert fixed.brokers.desired == 3


def test_topic_status() -> None:
    ok = compute_topic_status(2, [], now=T0, topic_id="abc", partitions=6, problem=None)
    assert ok.phase == "Ready" and ok.topic_id == "abc" and ok.partitions == 6
    bad = compute_topic_status(
        3,
        ok.conditions,
        now=T1,
        topic_id="abc",
        partitions=6,
        problem=("PartitionDecreaseRejected", "cannot shrink"),
    )
    assert bad.phase == "Degraded"
    assert conditions(bad)["Degraded"] == ("True", "PartitionDecreaseRejected")
    assert conditions(bad)["Ready"] == ("True", "TopicReady")
    waiting = compute_topic_status(
        1,
        [],
        now=T0,
        topic_id=None,
        partitions=None,
        problem=None,
        waiting=("ClusterNotFound", "no cluster"),
    )
    assert waiting.phase == "Pending"
    assert conditions(waiting)["Ready"] == ("False", "ClusterNotFound")


# --- snapshots and assignment plans --------------------------------------------------------

CLUSTER = "c1"


def kv(key: str, value: bytes, *, lease: int = 0, mod: int = 1) -> KeyValue:
    return KeyValue(
        key=key, value=value, create_revision=1, mod_revision=mod, version=1, lease=lease
    )


def broker(node_id: int, pod: str | None = None) -> KeyValue:
    doc = {"node_id": node_id, "host": "10.0.0.1", "port": 9092, "rack": None, "pod": pod}
    return kv(keys.broker_key(CLUSTER, node_id), json.dumps(doc).encode(), lease=100 + node_id)


def topic(name: str, partitions: int) -> KeyValue:
    doc = {"topic_id": "t-" + name, "partitions": partitions, "configs": {}}
    return kv(keys.topic_key(CLUSTER, name), json.dumps(doc).encode())


def snapshot(
    *,
    brokers: Sequence[KeyValue],
    topics: Sequence[KeyValue],
    leases: Sequence[KeyValue] = (),
    draining: Sequence[int] = (),
    assignment: Assignment | None = None,
) -> ClusterSnapshot:
    return parse_snapshot(
        CLUSTER,
        brokers=brokers,
        draining=[kv(keys.draining_key(CLUSTER, b), b'{"reason":"x"}') for b in draining],
        topics=topics,
        leases=leases,
        assignment=kv(keys.assignment_key(CLUSTER), assignment.to_json(), mod=7)
        if assignment
        else None,
    )


def test_parse_snapshot_and_lease_distribution() -> None:
    snap = snapshot(
        brokers=[broker(1, "p-1"), broker(2, "p-2"), kv(keys.broker_key(CLUSTER, 9), b"not json")],
        topics=[topic("a", 2), topic("b", 1)],
        leases=[
            kv(keys.partition_lease_key(CLUSTER, "a", 0), b"1"),
            kv(keys.partition_lease_key(CLUSTER, "a", 1), b"7"),  # a dead broker's lease
            kv(keys.partition_lease_key(CLUSTER, "b", 0), b"2"),
        ],
        draining=[2],
    )
    assert sorted(snap.brokers) == [1, 2]
    assert snap.brokers_of_pod("p-2") == [2]
    assert snap.brokers[1].lease == 101
    assert snap.partitions == [("a", 0), ("a", 1), ("b", 0)]
    assert snap.live_brokers() == [1]
    status = lease_status(snap)
    assert (status.partitions, status.owned, status.unowned) == (3, 2, 1)
    assert status.per_broker == {"1": 1, "2": 1}
    assert status.draining == [2]
    assert status.assignment_generation is None


def test_plan_assignment_balances_and_is_sticky() -> None:
    snap = snapshot(brokers=[broker(1), broker(2)], topics=[topic("a", 4)])
    first = plan_assignment(snap)
    assert first is not None and first.generation == 1
    assert sorted(first.owners.values()) == [1, 1, 2, 2]
    # Unchanged inputs: nothing to write.
    assert (
        plan_assignment(
            snapshot(brokers=[broker(1), broker(2)], topics=[topic("a", 4)], assignment=first)
        )
        is None
    )
    # A third broker takes only what it must.
    grown = plan_assignment(
        snapshot(
            brokers=[broker(1), broker(2), broker(3)], topics=[topic("a", 4)], assignment=first
        )
    )
    assert grown is not None and grown.generation == 2
    moved = [tp for tp in first.owners if first.owners[tp] != grown.owners[tp]]
    assert len(moved) == 1 and grown.owners[moved[0]] == 3


def test_plan_assignment_excludes_draining_and_needs_brokers() -> None:
    snap = snapshot(brokers=[broker(1), broker(2)], topics=[topic("a", 4)], draining=[2])
    plan = plan_assignment(snap)
    assert plan is not None and set(plan.owners.values()) == {1}
    extra = plan_assignment(
        snapshot(brokers=[broker(1), broker(2)], topics=[topic("a", 4)]), also_draining=[1]
    )
    assert extra is not None and set(extra.owners.values()) == {2}
    assert plan_assignment(snapshot(brokers=[], topics=[topic("a", 4)])) is None


def test_first_plan_follows_current_lease_holders() -> None:
    leases = [
        kv(keys.partition_lease_key(CLUSTER, "a", p), str(owner).encode())
        for p, owner in [(0, 2), (1, 2), (2, 1), (3, 1)]
    ]
    plan = plan_assignment(
        snapshot(brokers=[broker(1), broker(2)], topics=[topic("a", 4)], leases=leases)
    )
    assert plan is not None
    assert plan.owners == {("a", 0): 2, ("a", 1): 2, ("a", 2): 1, ("a", 3): 1}


# --- topics -----------------------------------------------------------------------------------


def test_decide_topic() -> None:
    spec = parse_topic_spec(
        {"clusterRef": "demo", "partitions": 3, "configs": {"retention.ms": "1"}}
    )
    created = decide_topic(None, spec, "id-1")
    assert created.write and created.record == TopicRecord("id-1", 3, {"retention.ms": "1"})
    same = decide_topic(created.record, spec, "id-2")
    assert not same.write and same.record.topic_id == "id-1"
    grown = decide_topic(created.record, spec.model_copy(update={"partitions": 5}), "id-2")
    assert grown.write and grown.record.partitions == 5 and grown.problem is None
    shrunk = decide_topic(grown.record, spec, "id-3")
    assert shrunk.problem is not None and shrunk.problem.reason == "PartitionDecreaseRejected"
    assert shrunk.record.partitions == 5 and not shrunk.write
    reconfigured = decide_topic(created.record, spec.model_copy(update={"configs": {}}), "x")
    assert reconfigured.write and reconfigured.record.configs == {}


def test_topic_record_round_trip() -> None:
    record = TopicRecord("abc", 7, {"cleanup.policy": "delete"})
    assert TopicRecord.from_json(record.to_json()) == record
    assert json.loads(record.to_json()) == {
        "topic_id": "abc",
        "partitions": 7,
        "configs": {"cleanup.policy": "delete"},
    }


def test_bootstrap_names_the_proxy_only_while_it_is_ready() -> None:
    spec = parse_cluster_spec(
        cluster_spec(proxy={"enabled": True, "replicas": 2}, etcd=EXTERNAL_ETCD)
    )
    brokers = deployment(3, 3, 3)

    def bootstrap(proxy: dict[str, Any] | None) -> str | None:
        observed = ClusterObservation(broker_deployment=brokers, proxy_deployment=proxy)
        return compute_cluster_status(REF, spec, observed, [], now=T0).bootstrap

    assert bootstrap(None) == "demo-brokers.kafka.svc:9092"
    assert bootstrap(deployment(2, 0, 2)) == "demo-brokers.kafka.svc:9092"
    assert bootstrap(deployment(2, 1, 2)) == "demo-proxy.kafka.svc:9092"


def test_unowned_partitions_are_progress_with_counts_not_unreadiness() -> None:
    leases = LeaseStatus(partitions=6, owned=4, unowned=2)
    status = compute_cluster_status(
        REF,
        SPEC,
        ClusterObservation(broker_deployment=deployment(3, 3, 3), leases=leases),
        [],
        now=T0,
    )
    assert conditions(status)["Progressing"] == ("True", "PartitionsUnowned")
    progressing = next(c for c in status.conditions if c.type == "Progressing")
    assert progressing.message == "2/6 partitions have no live owner"
    assert conditions(status)["Ready"] == ("True", "AllBrokersReady")
    assert status.phase == "Running"
    short = compute_cluster_status(
        REF, SPEC, ClusterObservation(broker_deployment=deployment(3, 2, 3)), [], now=T0
    )
    ready = next(c for c in short.conditions if c.type == "Ready")
    assert (ready.reason, ready.message) == ("ScalingUp", "2/3 brokers ready")
