"""Pure: which Kubernetes Events to post on a KafScaleCluster, and with what words.

A person running ``kubectl describe kafscalecluster`` should read what the operator did
(scaled, rebalanced, drained) and when the cluster's health changed (degraded, recovered,
ready, an API left out). Events are posted on *changes* only: a condition whose status, reason
or message did not move posts nothing, so an operator restart (kopf's resume handler, the
status timer) repeats nothing already said.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kafscale.broker.metadata.assignment import Assignment
from kafscale.operator.model_base import Condition, ConditionStatus

NORMAL = "Normal"
WARNING = "Warning"


@dataclass(frozen=True)
class Notice:
    """One Event to post: its type (Normal/Warning), CamelCase reason and message."""

    type: str
    reason: str
    message: str


def _by_type(conditions: Sequence[Condition]) -> dict[str, Condition]:
    return {c.type: c for c in conditions}


def _said(c: Condition | None) -> tuple[str, str, str] | None:
    return None if c is None else (c.status, c.reason, c.message)


def _degraded_notices(before: dict[str, Condition], after: dict[str, Condition]) -> list[Notice]:
    """A Warning when ``Degraded`` turns true (or says something new), ``Recovered`` when it
    clears."""
    degraded, was_degraded = after.get("Degraded"), before.get("Degraded")
    if degraded is None or _said(degraded) == _said(was_degraded):
        return []
    if degraded.status == ConditionStatus.TRUE:
        return [Notice(WARNING, degraded.reason, degraded.message)]
    if was_degraded is not None and was_degraded.status == ConditionStatus.TRUE:
        return [Notice(NORMAL, "Recovered", f"no longer degraded ({was_degraded.reason})")]
    return []


def condition_notices(previous: Sequence[Condition], current: Sequence[Condition]) -> list[Notice]:
    """Events for the conditions that changed between two status writes."""
    before, after = _by_type(previous), _by_type(current)
    notices: list[Notice] = []
    notices.extend(_degraded_notices(before, after))
    ready, was_ready = after.get("Ready"), before.get("Ready")
    was = None if was_ready is None else (was_ready.status, was_ready.reason)
    if ready is not None and (ready.status, ready.reason) != was:
        if ready.status == ConditionStatus.TRUE:
            notices.append(Notice(NORMAL, "Ready", ready.message))
        elif was_ready is not None and was_ready.status == ConditionStatus.TRUE:
            notices.append(Notice(WARNING, "NotReady", f"{ready.reason}: {ready.message}"))
    features, had = after.get("FeaturesSupported"), before.get("FeaturesSupported")
    if features is not None and _said(features) != _said(had):
        if features.status == ConditionStatus.FALSE:
            notices.append(Notice(WARNING, features.reason, features.message))
        elif had is not None:
            notices.append(Notice(NORMAL, features.reason, features.message))
    return notices


def scale_notice(before: int | None, after: int | None) -> Notice | None:
    """The broker Deployment's replicas changed because the spec did (not the first create)."""
    if before is None or after is None or before == after:
        return None
    return Notice(NORMAL, "Scaled", f"broker replicas {before} → {after}")


def rebalance_notice(previous: Assignment | None, written: Assignment) -> Notice:
    """A new assignment: its generation, the brokers it spreads over, how many partitions moved."""
    old = previous.owners if previous is not None else {}
    moved = sum(1 for tp, owner in written.owners.items() if old.get(tp) not in (None, owner))
    brokers = sorted(set(written.owners.values()))
    return Notice(
        NORMAL,
        "Rebalanced",
        f"assignment generation {written.generation}: {len(written.owners)} partitions over "
        f"brokers {brokers}, {moved} moved",
    )


def observed_rebalance_notice(seen: Assignment | None, current: Assignment | None) -> Notice | None:
    """A new assignment the balancer found rather than wrote: the brokers' own assigner (or the
    drain) wrote it first, which is a race either may win; ``kubectl describe`` should show
    the rebalance either way. None when nothing changed since ``seen``, or nothing was seen
    yet (a restarted operator does not report the assignment it finds)."""
    if seen is None or current is None or current.generation == seen.generation:
        return None
    return rebalance_notice(seen, current)


def drain_notice(pod: str, broker_ids: Sequence[int]) -> Notice:
    """A terminating broker pod's brokers were marked draining and their partitions moved."""
    listed = ", ".join(str(b) for b in broker_ids)
    return Notice(
        NORMAL,
        "Draining",
        f"pod {pod} is terminating: broker {listed} draining, its partitions reassigned",
    )


def deletion_notice(problem: str, attempt: int, attempts: int, leftover: str) -> Notice | None:
    """The finalizer of a cluster with ``deletionPolicy: Delete`` could not delete its data.

    ``attempt`` counts from 0. Said on the first failure (the resource stays Terminating while
    the operator retries) and on the last (the operator gives up and lets the resource go, so
    that a namespace deletion is never blocked for good: ``leftover`` names what remains);
    the retries in between say nothing new.
    """
    if attempt == 0 and attempts > 1:
        return Notice(
            WARNING,
            "DeletionFailed",
            f"deletionPolicy Delete: {problem}; retrying ({attempts} attempts in all)",
        )
    if attempt >= attempts - 1:
        return Notice(
            WARNING,
            "DeletionAbandoned",
            f"deletionPolicy Delete: gave up after {attempts} attempts ({problem}); "
            f"left in place: {leftover}",
        )
    return None


def readiness_notices(previous: Sequence[Condition], current: Sequence[Condition]) -> list[Notice]:
    """Events for a KafScaleTopic or KafScaleUser whose readiness or health changed.

    ``kubectl describe kst`` / ``ksu`` should say why the resource is not ready (its cluster
    is missing, etcd is unreachable, an ACL is invalid, a shrink was refused) without reading
    its status. A Warning named after the reason when ``Ready`` turns (or starts) false, or
    ``Degraded`` turns true; Normal ``Ready`` / ``Recovered`` when they clear. ``Pending``
    (a topic not yet written) is the normal first state and says nothing. Only changes post:
    retries and restarts that find the same reason repeat nothing.
    """
    before, after = _by_type(previous), _by_type(current)
    notices: list[Notice] = []
    ready, was_ready = after.get("Ready"), before.get("Ready")
    was = None if was_ready is None else (was_ready.status, was_ready.reason)
    if ready is not None and (ready.status, ready.reason) != was:
        if ready.status == ConditionStatus.TRUE:
            notices.append(Notice(NORMAL, "Ready", ready.message))
        elif ready.reason != "Pending":
            notices.append(Notice(WARNING, ready.reason, ready.message))
    notices.extend(_degraded_notices(before, after))
    return notices
