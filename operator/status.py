"""Pure: a resource's status (phase, conditions) from what the operator observed.

Conditions follow the Kubernetes API conventions: ``Ready``, ``Progressing`` and ``Degraded``,
each with a CamelCase reason, a message, ``observedGeneration`` and a ``lastTransitionTime``
that only moves when the condition's status changes. The clock is an argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kafscale.operator import naming
from kafscale.operator.conflicts import REASON as OBJECT_NOT_OWNED
from kafscale.operator.immutable import REASON as IMMUTABLE_FIELD_CHANGED
from kafscale.operator.listeners import listener_status
from kafscale.operator.model_base import Condition, ConditionStatus
from kafscale.operator.model_cluster_status import BrokerStatus, LeaseStatus
from kafscale.operator.model_stores import EtcdMode
from kafscale.operator.models import (
    ClusterPhase,
    ClusterRef,
    KafScaleClusterSpec,
    KafScaleClusterStatus,
    KafScaleTopicStatus,
    KafScaleUserStatus,
    TopicPhase,
    UserPhase,
)
from kafscale.operator.secret_usability import REASON as SECRET_UNUSABLE

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
# False when the API server lacks an API some of the cluster's objects need (see discovery).
FEATURES_SUPPORTED = "FeaturesSupported"


Verdict = tuple[bool, str, str]  # (status, reason, message)


def set_condition(
    conditions: Sequence[Condition],
    type_: str,
    verdict: Verdict,
    *,
    now: str,
    generation: int,
) -> list[Condition]:
    """``conditions`` with ``type_`` replaced; keeps lastTransitionTime if status is unchanged."""
    status, reason, message = verdict
    value = ConditionStatus.TRUE if status else ConditionStatus.FALSE
    previous = next((c for c in conditions if c.type == type_), None)
    since = previous.last_transition_time if previous and previous.status == value else now
    updated = Condition(
        type=type_,
        status=value,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=generation,
    )
    return [c for c in conditions if c.type != type_] + [updated]


def parse_conditions(raw: Any) -> list[Condition]:
    conditions: list[Condition] = []
    for item in raw or []:
        try:
            conditions.append(Condition.model_validate(item))
        except ValueError:
            continue  # somebody else's malformed condition: replaced on the next write
    return conditions


@dataclass(frozen=True)
class ClusterObservation:
    """What one reconcile round saw."""

    broker_deployment: dict[str, Any] | None = None  # the live Deployment object
    proxy_deployment: dict[str, Any] | None = None  # the proxy's, when the proxy is enabled
    etcd_statefulset: dict[str, Any] | None = None  # the live StatefulSet (managed etcd)
    spec_error: str | None = None  # the spec cannot be built (unknown config key...)
    apply_error: str | None = None  # the API server refused an object
    refused: str | None = None  # a spec change the live objects cannot take (``immutable``)
    not_owned: str | None = None  # objects of the cluster's names left to others (``conflicts``)
    unusable_secrets: str | None = None  # Secrets the pods cannot use (``secret_usability``)
    etcd_error: str | None = None  # etcd could not be reached or read
    registered_brokers: int | None = None
    leases: LeaseStatus | None = None
    deleting: bool = False
    # What the server does not serve, so was not created; None until this process has applied
    # the cluster (a restarted operator's first status round must not claim "AllServed").
    left_out: tuple[str, ...] | None = ()
    server_version: str = "unknown"


def features_verdict(observed: ClusterObservation) -> Verdict | None:
    """None when not known yet: the condition keeps what it said."""
    if observed.left_out is None:
        return None
    if not observed.left_out:
        return True, "AllServed", "the API server serves everything the cluster uses"
    listed = "; ".join(observed.left_out)
    return False, "NotServed", f"Kubernetes {observed.server_version} lacks, left out: {listed}"


def _deployment_counts(deployment: dict[str, Any] | None) -> tuple[int, int, int, bool, bool]:
    """(replicas, ready, updated, rollout observed, rollout stalled)."""
    if deployment is None:
        return 0, 0, 0, False, False
    status = deployment.get("status") or {}
    generation = int((deployment.get("metadata") or {}).get("generation") or 0)
    observed = int(status.get("observedGeneration") or 0) >= generation
    stalled = any(
        c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded"
        for c in status.get("conditions") or []
    )
    return (
        int(status.get("replicas") or 0),
        int(status.get("readyReplicas") or 0),
        int(status.get("updatedReplicas") or 0),
        observed,
        stalled,
    )


def proxy_ready(deployment: dict[str, Any] | None) -> bool:
    """Whether some proxy pod passes its readiness probe (routes loaded, a broker known)."""
    return _deployment_counts(deployment)[1] > 0


def desired_brokers(spec: KafScaleClusterSpec, deployment: dict[str, Any] | None) -> int:
    """The replica count the brokers should reach (the HPA's choice when it owns replicas)."""
    if spec.autoscaling.enabled and deployment is not None:
        replicas = (deployment.get("spec") or {}).get("replicas")
        if replicas is not None:
            return int(replicas)
    if spec.autoscaling.enabled:
        return spec.autoscaling.min_replicas
    return spec.brokers.replicas


def _etcd_ready(spec: KafScaleClusterSpec, statefulset: dict[str, Any] | None) -> bool:
    if spec.etcd.mode == EtcdMode.EXTERNAL:
        return True
    if statefulset is None:
        return False
    ready = int((statefulset.get("status") or {}).get("readyReplicas") or 0)
    return ready >= spec.etcd.replicas // 2 + 1


def compute_cluster_status(
    ref: ClusterRef,
    spec: KafScaleClusterSpec,
    observed: ClusterObservation,
    previous: Sequence[Condition],
    *,
    now: str,
) -> KafScaleClusterStatus:
    gen = ref.generation
    replicas, ready, updated, rolled, stalled = _deployment_counts(observed.broker_deployment)
    desired = desired_brokers(spec, observed.broker_deployment)
    etcd_up = _etcd_ready(spec, observed.etcd_statefulset)

    # Degraded: something needs a human (or at least will not fix itself soon).
    degraded: tuple[str, str] | None = None
    if observed.spec_error:
        degraded = ("InvalidSpec", observed.spec_error)
    elif observed.refused:
        degraded = (IMMUTABLE_FIELD_CHANGED, observed.refused)
    elif observed.not_owned:
        degraded = (OBJECT_NOT_OWNED, observed.not_owned)
    elif observed.unusable_secrets:
        degraded = (SECRET_UNUSABLE, observed.unusable_secrets)
    elif observed.apply_error:
        degraded = ("ApplyFailed", observed.apply_error)
    elif stalled:
        degraded = ("RolloutStalled", "the broker Deployment exceeded its progress deadline")
    elif observed.etcd_error and etcd_up:
        degraded = ("EtcdUnavailable", observed.etcd_error)

    # Progressing: the cluster is moving towards the spec.
    progressing: tuple[str, str] | None = None
    if observed.broker_deployment is None and not observed.spec_error:
        progressing = ("Creating", "creating the cluster's objects")
    elif not etcd_up:
        progressing = ("EtcdStarting", "waiting for the managed etcd to reach quorum")
    elif not rolled or updated < desired:
        progressing = ("RollingUpdate", f"{updated}/{desired} brokers updated")
    elif replicas > desired:
        progressing = ("ScalingDown", f"{replicas} brokers, scaling down to {desired}")
    elif ready < desired:
        progressing = ("ScalingUp", f"{ready}/{desired} brokers ready")

    ready_cond: Verdict
    if degraded:
        ready_cond = (False, degraded[0], degraded[1])
    elif desired == 0:
        ready_cond = (False, "ScaledToZero", "the cluster has no brokers")
    elif progressing:
        ready_cond = (False, progressing[0], progressing[1])
    elif ready >= desired and etcd_up:
        ready_cond = (True, "AllBrokersReady", f"{ready}/{desired} brokers ready")
    else:
        ready_cond = (False, "BrokersNotReady", f"{ready}/{desired} brokers ready")

    unowned = observed.leases.unowned if observed.leases else 0
    if progressing is None and not degraded and unowned:
        # Brokers take the partitions the assignment gives them; until they do, say how many
        # wait (Ready stays: producers to those partitions make a broker claim them at once).
        total = observed.leases.partitions if observed.leases else unowned
        progressing = ("PartitionsUnowned", f"{unowned}/{total} partitions have no live owner")

    progress_reason, progress_message = progressing or (
        "ReconcileComplete",
        "the cluster matches its spec",
    )
    degraded_reason, degraded_message = degraded or ("AsExpected", "")
    verdicts: dict[str, Verdict] = {
        READY: ready_cond,
        PROGRESSING: (progressing is not None, progress_reason, progress_message),
        DEGRADED: (degraded is not None, degraded_reason, degraded_message),
    }
    features = features_verdict(observed)
    if features is not None:
        verdicts[FEATURES_SUPPORTED] = features
    conditions = list(previous)
    for type_, verdict in verdicts.items():
        conditions = set_condition(conditions, type_, verdict, now=now, generation=gen)
    order = list(verdicts)
    conditions.sort(key=lambda c: order.index(c.type) if c.type in order else len(order))

    if observed.deleting:
        phase = ClusterPhase.TERMINATING
    elif degraded:
        phase = ClusterPhase.DEGRADED
    elif ready_cond[0]:
        phase = ClusterPhase.RUNNING
    elif progressing and observed.broker_deployment is not None:
        phase = ClusterPhase.PROVISIONING
    else:
        phase = ClusterPhase.PENDING

    return KafScaleClusterStatus(
        observed_generation=gen,
        phase=phase,
        conditions=conditions,
        brokers=BrokerStatus(
            replicas=replicas,
            ready_replicas=ready,
            selector=naming.label_selector(ref.name, naming.BROKER),
            registered=observed.registered_brokers or 0,
            desired=desired,
        ),
        bootstrap=naming.bootstrap_address(ref, spec, proxy_ready(observed.proxy_deployment)),
        cluster_name=naming.kafscale_cluster_name(ref, spec),
        leases=observed.leases,
        listeners=listener_status(ref, spec, proxy_ready(observed.proxy_deployment)),
    )


def compute_topic_status(
    generation: int,
    previous: Sequence[Condition],
    *,
    now: str,
    topic_id: str | None,
    partitions: int | None,
    problem: tuple[str, str] | None,
    waiting: tuple[str, str] | None = None,
) -> KafScaleTopicStatus:
    """``problem``: (reason, message) → Degraded; ``waiting``: not reconciled yet (no etcd...)."""
    conditions = list(previous)
    ready: Verdict
    if waiting:
        ready = (False, *waiting)
    elif topic_id is None:
        ready = (False, "Pending", "the topic does not exist yet")
    else:
        ready = (True, "TopicReady", f"{partitions} partitions")
    degraded_reason, degraded_message = problem or ("AsExpected", "")
    conditions = set_condition(conditions, READY, ready, now=now, generation=generation)
    conditions = set_condition(
        conditions,
        DEGRADED,
        (problem is not None, degraded_reason, degraded_message),
        now=now,
        generation=generation,
    )
    if problem:
        phase = TopicPhase.DEGRADED
    elif ready[0]:
        phase = TopicPhase.READY
    else:
        phase = TopicPhase.PENDING
    return KafScaleTopicStatus(
        observed_generation=generation,
        phase=phase,
        conditions=conditions,
        topic_id=topic_id,
        partitions=partitions,
    )


def compute_user_status(
    generation: int,
    previous: Sequence[Condition],
    *,
    now: str,
    ready: Verdict,
    username: str,
    secret: str | None,
    acls: int | None,
) -> KafScaleUserStatus:
    """A KafScaleUser's status: Ready (with why not), the user name, its Secret, its ACL count."""
    conditions = set_condition(previous, READY, ready, now=now, generation=generation)
    return KafScaleUserStatus(
        observed_generation=generation,
        phase=UserPhase.READY if ready[0] else UserPhase.PENDING,
        conditions=conditions,
        username=username,
        secret=secret,
        acls=acls,
    )


def invalid_spec_status(
    ref: ClusterRef, previous: Sequence[Condition], problem: str, *, now: str
) -> KafScaleClusterStatus:
    """The spec cannot be turned into objects: Degraded, not Ready, not Progressing."""
    verdicts: dict[str, Verdict] = {
        READY: (False, "InvalidSpec", problem),
        PROGRESSING: (False, "InvalidSpec", "fix the spec to continue"),
        DEGRADED: (True, "InvalidSpec", problem),
    }
    conditions = list(previous)
    for type_, verdict in verdicts.items():
        conditions = set_condition(conditions, type_, verdict, now=now, generation=ref.generation)
    return KafScaleClusterStatus(
        observed_generation=ref.generation,
        phase=ClusterPhase.DEGRADED,
        conditions=conditions,
        brokers=BrokerStatus(selector=naming.label_selector(ref.name, naming.BROKER)),
    )
