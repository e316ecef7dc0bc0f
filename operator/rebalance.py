"""Scale events and pod terminations → draining marks and assignment writes in etcd.

* :func:`rebalance` recomputes the sticky, balanced assignment over the live, non-draining
  brokers and writes it when it changed (compare-and-swap on the assignment key, so a
  concurrent writer — another operator replica, ``kafscale local`` — is never overwritten).
* :func:`drain_pod` runs when a broker pod gets its deletionTimestamp: it marks the pod's
  broker(s) draining (bound to the broker's own session lease, so the mark vanishes with the
  broker) and moves their partitions to the others before the pod is gone. The pod's preStop
  hook then finds nothing left to hand over but its in-flight writes.
* :func:`delete_topic_keys` and :func:`delete_cluster_keys` remove what a deleted resource owned.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Collection
from dataclasses import dataclass

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.assignment import Assignment
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_txn import create_revision_is, mod_revision_is, put_op
from kafscale.operator.snapshot import ClusterSnapshot, parse_snapshot, plan_assignment

log = logging.getLogger(__name__)

CAS_ATTEMPTS = 5


async def read_snapshot(etcd: Etcd, cluster: str) -> ClusterSnapshot:
    brokers, draining, topics, leases, assignment = await asyncio.gather(
        etcd.get_prefix(keys.brokers_prefix(cluster)),
        etcd.get_prefix(keys.draining_prefix(cluster)),
        etcd.get_prefix(keys.topics_prefix(cluster)),
        etcd.get_prefix(keys.partition_leases_prefix(cluster)),
        etcd.get(keys.assignment_key(cluster)),
    )
    return parse_snapshot(
        cluster,
        brokers=brokers,
        draining=draining,
        topics=topics,
        leases=leases,
        assignment=assignment,
    )


@dataclass(frozen=True)
class RebalanceResult:
    snapshot: ClusterSnapshot
    written: Assignment | None  # None: nothing changed


async def rebalance(
    etcd: Etcd, cluster: str, also_draining: Collection[int] = ()
) -> RebalanceResult:
    """Write the next assignment if it differs from the stored one; retry lost races."""
    snapshot = await read_snapshot(etcd, cluster)
    for _ in range(CAS_ATTEMPTS):
        await _forget_departed(etcd, cluster, snapshot)
        planned = plan_assignment(snapshot, also_draining)
        if planned is None:
            return RebalanceResult(snapshot, None)
        key = keys.assignment_key(cluster)
        guard = (
            mod_revision_is(key, snapshot.assignment_revision)
            if snapshot.assignment_revision
            else create_revision_is(key, 0)
        )
        result = await etcd.txn([guard], [put_op(key, planned.to_json())])
        if result.succeeded:
            log.info(
                "cluster %s: assignment generation %d over brokers %s",
                cluster,
                planned.generation,
                sorted(set(planned.owners.values())),
            )
            return RebalanceResult(snapshot, planned)
        snapshot = await read_snapshot(etcd, cluster)  # someone else wrote: decide again
    raise RuntimeError(f"cluster {cluster}: assignment kept changing; gave up after retries")


async def _forget_departed(etcd: Etcd, cluster: str, snapshot: ClusterSnapshot) -> None:
    """Draining marks of brokers that are gone (marks written without a lease)."""
    for broker_id in snapshot.draining - set(snapshot.brokers):
        await etcd.delete(keys.draining_key(cluster, broker_id))


async def drain_pod(etcd: Etcd, cluster: str, pod: str, reason: str) -> list[int]:
    """Mark the brokers registered by ``pod`` draining and reassign their partitions.

    Returns the broker ids newly marked (empty when the pod never registered, or when its
    brokers were already draining: every later event of a terminating pod repeats the call).
    Idempotent.
    """
    snapshot = await read_snapshot(etcd, cluster)
    broker_ids = snapshot.brokers_of_pod(pod)
    if not broker_ids:
        return []
    value = json.dumps({"reason": reason}).encode()
    marked: list[int] = []
    for broker_id in broker_ids:
        if broker_id in snapshot.draining:
            continue
        lease = snapshot.brokers[broker_id].lease or None
        await etcd.put(keys.draining_key(cluster, broker_id), value, lease=lease)
        marked.append(broker_id)
        log.info("cluster %s: broker %d (pod %s) marked draining", cluster, broker_id, pod)
    await rebalance(etcd, cluster, also_draining=broker_ids)
    return marked


async def delete_topic_keys(etcd: Etcd, cluster: str, topic: str) -> None:
    """The topic record, its partition states and its partition leases."""
    await etcd.delete(keys.topic_key(cluster, topic))
    await etcd.delete_prefix(keys.partition_states_prefix(cluster, topic))
    await etcd.delete_prefix(keys.partition_leases_prefix(cluster, topic))


async def delete_cluster_keys(etcd: Etcd, cluster: str) -> int:
    """Everything under ``/kafscale/<cluster>/``; returns how many keys."""
    return await etcd.delete_prefix(keys.cluster_prefix(cluster))
