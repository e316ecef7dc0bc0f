"""What the operator knows of one cluster's etcd state, and the pure decisions made from it.

A :class:`ClusterSnapshot` is parsed from a few prefix reads (brokers, draining marks, topics,
partition leases, the assignment). From it, without I/O: the lease distribution reported in
status, and the next assignment to write (or none, when nothing would change).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.assignment import Assignment, TopicPartition, decide_assignment
from kafscale.broker.metadata.etcd_txn import KeyValue
from kafscale.operator.model_cluster_status import LeaseStatus

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BrokerRecord:
    node_id: int
    pod: str | None
    lease: int  # the etcd lease the registration is bound to (0: none)


@dataclass(frozen=True)
class ClusterSnapshot:
    brokers: dict[int, BrokerRecord] = field(default_factory=dict)
    draining: frozenset[int] = frozenset()
    topics: dict[str, int] = field(default_factory=dict)  # name → partitions
    owners: dict[TopicPartition, int] = field(default_factory=dict)  # current lease holders
    assignment: Assignment | None = None
    assignment_revision: int = 0  # mod revision of the assignment key (0: absent)

    @property
    def partitions(self) -> list[TopicPartition]:
        return [(topic, p) for topic, count in sorted(self.topics.items()) for p in range(count)]

    def live_brokers(self, also_draining: Collection[int] = ()) -> list[int]:
        """Registered brokers that are not draining (and not in ``also_draining``)."""
        excluded = set(self.draining) | set(also_draining)
        return sorted(b for b in self.brokers if b not in excluded)

    def brokers_of_pod(self, pod: str) -> list[int]:
        return sorted(b.node_id for b in self.brokers.values() if b.pod == pod)


def _last_part(key: str, prefix: str) -> str:
    return key[len(prefix) :]


def parse_snapshot(
    cluster: str,
    *,
    brokers: Iterable[KeyValue],
    draining: Iterable[KeyValue],
    topics: Iterable[KeyValue],
    leases: Iterable[KeyValue],
    assignment: KeyValue | None,
) -> ClusterSnapshot:
    """Build a snapshot from raw etcd reads; malformed entries are logged and skipped."""
    registered: dict[int, BrokerRecord] = {}
    for kv in brokers:
        try:
            doc = json.loads(kv.value)
            node_id = int(doc["node_id"])
            pod = doc.get("pod")
            registered[node_id] = BrokerRecord(node_id, str(pod) if pod else None, kv.lease)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("skipping malformed broker registration %s: %s", kv.key, exc)
    draining_ids: set[int] = set()
    prefix = keys.draining_prefix(cluster)
    for kv in draining:
        try:
            draining_ids.add(int(_last_part(kv.key, prefix)))
        except ValueError:
            log.warning("skipping malformed draining key %s", kv.key)
    topic_partitions: dict[str, int] = {}
    prefix = keys.topics_prefix(cluster)
    for kv in topics:
        try:
            topic_partitions[_last_part(kv.key, prefix)] = int(json.loads(kv.value)["partitions"])
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("skipping malformed topic record %s: %s", kv.key, exc)
    owners: dict[TopicPartition, int] = {}
    prefix = keys.partition_leases_prefix(cluster)
    for kv in leases:
        topic, _, number = _last_part(kv.key, prefix).rpartition("/")
        try:
            owners[(topic, int(number))] = int(kv.value.decode())
        except ValueError:
            log.warning("skipping malformed partition lease %s", kv.key)
    current: Assignment | None = None
    if assignment is not None:
        try:
            current = Assignment.from_json(assignment.value)
        except ValueError as exc:
            log.warning("ignoring malformed assignment: %s", exc)
    return ClusterSnapshot(
        brokers=registered,
        draining=frozenset(draining_ids),
        topics=topic_partitions,
        owners=owners,
        assignment=current,
        assignment_revision=assignment.mod_revision if assignment is not None else 0,
    )


def plan_assignment(
    snapshot: ClusterSnapshot, also_draining: Collection[int] = ()
) -> Assignment | None:
    """The assignment to write next, or None when the stored one is already right.

    None as well when no broker is live: there is nobody to assign to, and brokers that come
    back follow the last decision (or claim partitions on demand) until the next one.
    """
    live = snapshot.live_brokers(also_draining)
    if not live:
        return None
    previous = snapshot.assignment.owners if snapshot.assignment else dict(snapshot.owners)
    owners = decide_assignment(snapshot.partitions, live, previous)
    if snapshot.assignment is not None and owners == snapshot.assignment.owners:
        return None
    generation = (snapshot.assignment.generation if snapshot.assignment else 0) + 1
    return Assignment(generation, owners)


def lease_status(snapshot: ClusterSnapshot) -> LeaseStatus:
    """Owned and unowned partitions and per-broker counts (a lease of a dead broker is unowned)."""
    partitions = set(snapshot.partitions)
    per_broker: dict[str, int] = {str(b): 0 for b in sorted(snapshot.brokers)}
    owned = 0
    for tp, owner in snapshot.owners.items():
        if tp in partitions and owner in snapshot.brokers:
            owned += 1
            per_broker[str(owner)] += 1
    return LeaseStatus(
        partitions=len(partitions),
        owned=owned,
        unowned=len(partitions) - owned,
        per_broker=per_broker,
        assignment_generation=snapshot.assignment.generation if snapshot.assignment else None,
        draining=sorted(snapshot.draining),
    )
