"""Pure: the Events the operator posts on a KafScaleCluster, on changes only."""

from __future__ import annotations

import pytest

from kafscale.broker.metadata.assignment import Assignment
from kafscale.operator.events import (
    Notice,
    condition_notices,
    deletion_notice,
    drain_notice,
    observed_rebalance_notice,
    readiness_notices,
    rebalance_notice,
    scale_notice,
)
from kafscale.operator.model_base import Condition, ConditionStatus

pytestmark = pytest.mark.operator

T0 = "2026-01-01T00:00:00Z"


def cond(type_: str, status: bool, reason: str, message: str = "") -> Condition:
    return Condition(
        type=type_,
        status=ConditionStatus.TRUE if status else ConditionStatus.FALSE,
        reason=reason,
        message=message,
        last_transition_time=T0,
        observed_generation=1,
    )


NOT_SERVED = cond("FeaturesSupported", False, "NotServed", "lacks policy/v1")


def test_nothing_changed_posts_nothing_so_a_restart_repeats_nothing() -> None:
    state = [cond("Ready", True, "AllBrokersReady", "3/3"), NOT_SERVED]
    assert condition_notices(state, state) == []
    # Ready's message moves with counts; only its status or reason makes an Event.
    assert condition_notices(state, [cond("Ready", True, "AllBrokersReady", "4/4")]) == []


def test_first_status_reports_what_was_left_out() -> None:
    assert condition_notices([], [NOT_SERVED]) == [
        Notice("Warning", "NotServed", "lacks policy/v1")
    ]
    served = cond("FeaturesSupported", True, "AllServed", "everything")
    assert condition_notices([NOT_SERVED], [served]) == [
        Notice("Normal", "AllServed", "everything")
    ]
    assert condition_notices([], [served]) == []  # nothing worth saying


def test_degraded_and_recovered() -> None:
    ok = cond("Degraded", False, "AsExpected")
    bad = cond("Degraded", True, "EtcdUnavailable", "etcd at http://e:1: unreachable")
    assert condition_notices([ok], [bad]) == [
        Notice("Warning", "EtcdUnavailable", "etcd at http://e:1: unreachable")
    ]
    assert condition_notices([bad], [ok]) == [
        Notice("Normal", "Recovered", "no longer degraded (EtcdUnavailable)")
    ]
    assert condition_notices([], [ok]) == []


def test_ready_transitions() -> None:
    ready = cond("Ready", True, "AllBrokersReady", "3/3 brokers ready")
    not_ready = cond("Ready", False, "BrokersNotReady", "2/3 brokers ready")
    assert condition_notices([not_ready], [ready]) == [
        Notice("Normal", "Ready", "3/3 brokers ready")
    ]
    assert condition_notices([ready], [not_ready]) == [
        Notice("Warning", "NotReady", "BrokersNotReady: 2/3 brokers ready")
    ]
    assert condition_notices([], [not_ready]) == []  # a new cluster is not ready yet: no news


def test_scaled_rebalanced_drained() -> None:
    assert scale_notice(2, 3) == Notice("Normal", "Scaled", "broker replicas 2 → 3")
    assert scale_notice(None, 3) is None  # the first create is not a scale event
    assert scale_notice(3, 3) is None
    assert scale_notice(3, None) is None  # autoscaled: the HPA scales, not the operator
    before = Assignment(1, {("orders", 0): 1, ("orders", 1): 2, ("orders", 2): 1})
    after = Assignment(2, {("orders", 0): 1, ("orders", 1): 2, ("orders", 2): 3})
    assert rebalance_notice(before, after) == Notice(
        "Normal",
        "Rebalanced",
        "assignment generation 2: 3 partitions over brokers [1, 2, 3], 1 moved",
    )
    assert "0 moved" in rebalance_notice(None, before).message
    assert drain_notice("demo-broker-x", [2]).message == (
        "pod demo-broker-x is terminating: broker 2 draining, its partitions reassigned"
    )


def test_a_failing_deletion_is_said_once_and_giving_up_names_what_is_left() -> None:
    """`kubectl delete ksc` of a Delete-policy cluster whose etcd is gone: the resource stays
    Terminating while the finalizer retries, and `kubectl describe` says why (once), then
    says what was left when the operator lets the resource go."""
    first = deletion_notice("etcd unreachable", 0, 20, "etcd keys")
    assert first == Notice(
        "Warning",
        "DeletionFailed",
        "deletionPolicy Delete: etcd unreachable; retrying (20 attempts in all)",
    )
    assert [deletion_notice("etcd unreachable", n, 20, "etcd keys") for n in range(1, 19)] == [
        None
    ] * 18
    last = deletion_notice("etcd unreachable", 19, 20, "etcd keys and objects")
    assert last is not None and (last.type, last.reason) == ("Warning", "DeletionAbandoned")
    assert "gave up after 20 attempts" in last.message and "etcd keys and objects" in last.message
    only = deletion_notice("S3 refused", 0, 1, "objects")
    assert only is not None and only.reason == "DeletionAbandoned"


def test_topics_and_users_say_why_they_are_not_ready_once() -> None:
    """`kubectl describe kst`/`ksu` showed no Events: a missing cluster, an unreachable etcd,
    a refused shrink or an invalid ACL was only in the status."""
    missing = [cond("Ready", False, "ClusterNotFound", "KafScaleCluster demo not found")]
    assert readiness_notices([], missing) == [
        Notice("Warning", "ClusterNotFound", "KafScaleCluster demo not found")
    ]
    assert readiness_notices(missing, missing) == []  # a retry, a restart: nothing new
    assert readiness_notices([], [cond("Ready", False, "Pending", "not yet")]) == []
    ready = [
        cond("Ready", True, "TopicReady", "12 partitions"),
        cond("Degraded", False, "AsExpected"),
    ]
    assert readiness_notices(missing, ready) == [Notice("Normal", "Ready", "12 partitions")]
    shrink = [
        cond("Ready", True, "TopicReady", "12 partitions"),
        cond("Degraded", True, "PartitionDecreaseRejected", "12 → 6 refused"),
    ]
    assert readiness_notices(ready, shrink) == [
        Notice("Warning", "PartitionDecreaseRejected", "12 → 6 refused")
    ]
    assert readiness_notices(shrink, ready) == [
        Notice("Normal", "Recovered", "no longer degraded (PartitionDecreaseRejected)")
    ]


def test_an_assignment_the_balancer_found_is_reported_once_and_not_at_its_first_look() -> None:
    """The brokers' assigner or the drain may write the assignment before the operator's
    balancer does; ``kubectl describe`` still shows the rebalance, once."""
    before = Assignment(1, {("orders", 0): 1, ("orders", 1): 2})
    after = Assignment(2, {("orders", 0): 1, ("orders", 1): 1})
    found = observed_rebalance_notice(before, after)
    assert found is not None and found.reason == "Rebalanced"
    assert "over brokers [1], 1 moved" in found.message
    assert observed_rebalance_notice(after, after) is None
    assert observed_rebalance_notice(None, after) is None
