"""Share groups (KIP-932) on the coordinator, as a pure state machine: ShareGroupHeartbeat.

Kafka's ``GroupMetadataManager.shareGroupHeartbeat`` kept small:

* A member joins with epoch 0 and the member id its client generated, heartbeats with its
  epoch, leaves with -1. An unknown member is UNKNOWN_MEMBER_ID, an epoch other than the
  member's FENCED_MEMBER_EPOCH.
* The group epoch advances when membership, a subscription or a subscribed topic's partition
  count changes; the assignment is then recomputed by the simple assignor (``assign``). There is
  no revocation step: records, not partitions, are what members own exclusively, so a member
  moves to its new assignment (and the group epoch) at its next heartbeat.
* Sessions (``session_timeout_ms``) expire from ``tick(now_ms)``.

Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kafscale.broker.groups import size_limits
from kafscale.broker.groups.consumer import HeartbeatResult
from kafscale.broker.groups.reconcile import TopicPartition
from kafscale.broker.groups.session_resume import resumed_deadline_ms
from kafscale.broker.protocol.errors import ErrorCode

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
SIMPLE_ASSIGNOR = "simple"


@dataclass(frozen=True, slots=True)
class ShareConfig:
    """Kafka's ``group.share.*`` broker configs (a group's own configs override them)."""

    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    max_size: int = 200
    record_lock_duration_ms: int = 30_000
    delivery_count_limit: int = 5
    auto_offset_reset: str = "latest"
    """"latest" or "earliest": where a share-partition starts when it has no state yet."""
    read_committed: bool = True
    max_record_locks: int = 2000
    """group.share.partition.max.record.locks: in-flight records per share-partition."""


@dataclass(frozen=True, slots=True)
class ShareHeartbeat:
    member_id: str
    member_epoch: int
    rack_id: str | None
    subscribed_topic_names: tuple[str, ...] | None
    client_id: str
    client_host: str


@dataclass(slots=True)
class ShareMember:
    member_id: str
    rack_id: str | None
    client_id: str
    client_host: str
    topic_names: tuple[str, ...] = ()
    epoch: int = 0
    assigned: frozenset[TopicPartition] = frozenset()
    session_deadline_ms: int | None = None
    sent: frozenset[TopicPartition] | None = field(default=None)
    """The assignment last sent to the member (None: send it with the next answer); set by
    ``assignment_sent`` once an answer carrying it is given, not when it is computed."""


def assign(
    subscriptions: Mapping[str, Iterable[str]], partitions: Mapping[str, int]
) -> dict[str, frozenset[TopicPartition]]:
    """Kafka's simple share assignor: every subscribed partition goes to a member that
    subscribes to its topic. Where a topic has fewer partitions than subscribers, each member
    gets one and a partition is shared by several; otherwise partitions are dealt round-robin.
    Members are taken in member-id order, rotating across topics so topics spread evenly."""
    result: dict[str, set[TopicPartition]] = {m: set() for m in subscriptions}
    turn = 0
    for topic in sorted(partitions):
        members = sorted(m for m, topics in subscriptions.items() if topic in set(topics))
        count = partitions[topic]
        if not members or count <= 0:
            continue
        if len(members) >= count:
            for i, member in enumerate(members):
                result[member].add((topic, i % count))
        else:
            for p in range(count):
                result[members[(p + turn) % len(members)]].add((topic, p))
            turn += count
    return {m: frozenset(tps) for m, tps in result.items()}


def new_group_refusal(share_groups: int, max_groups: int) -> str | None:
    """Why a join may not create one more share group when the cluster has ``share_groups``
    (None: it may). Kafka has no such bound (its ``group.share.max.groups``, 10 until 4.0,
    only sized the share session cache); the code is the one it gives a full group."""
    if share_groups < max_groups:
        return None
    return (
        f"The cluster has reached its maximum of {max_groups} share groups "
        "(groups.share_max_groups): delete unused share groups or raise the limit."
    )


class ShareGroup:
    def __init__(self, group_id: str, config: ShareConfig, group_epoch: int = 0) -> None:
        self.group_id = group_id
        self.config = config
        self.group_epoch = group_epoch
        self.assignment_epoch = group_epoch
        self.members: dict[str, ShareMember] = {}
        self.subscribed_partitions: dict[str, int] = {}
        self.subscribed_ids: dict[str, str] = {}

    @property
    def state(self) -> str:
        """Kafka's share group states: Empty, Stable (Dead is a deleted group)."""
        return "Stable" if self.members else "Empty"

    def is_empty(self) -> bool:
        return not self.members

    def subscribed_topics(self) -> set[str]:
        return {t for m in self.members.values() for t in m.topic_names}

    def next_deadline_ms(self) -> int | None:
        deadlines = [m.session_deadline_ms for m in self.members.values()]
        return min((d for d in deadlines if d is not None), default=None)

    def resume_sessions(self, now_ms: int) -> None:
        """A whole session from ``now_ms``: the coordinator resumed its etcd session after
        refusing the members (``session_resume``)."""
        for m in self.members.values():
            timeout_ms = self.config.session_timeout_ms
            m.session_deadline_ms = resumed_deadline_ms(m.session_deadline_ms, now_ms, timeout_ms)

    def tick(self, now_ms: int) -> list[str]:
        """Members whose session expired leave the group: their ids."""
        expired = [
            m.member_id
            for m in self.members.values()
            if m.session_deadline_ms is not None and m.session_deadline_ms <= now_ms
        ]
        for member_id in expired:
            self._remove(member_id)
        return expired

    def heartbeat(
        self,
        now_ms: int,
        request: ShareHeartbeat,
        topics: Mapping[str, int],
        topic_ids: Mapping[str, str] | None = None,
    ) -> HeartbeatResult:
        """``topics``: every topic's partition count now; ``topic_ids``: their ids (a topic
        deleted and created again keeps its name and count, not its id: members are sent
        their assignment again, under the new id)."""
        if request.member_epoch == LEAVE_EPOCH:
            if request.member_id not in self.members:
                message = f"member {request.member_id} is not in group {self.group_id}"
                return HeartbeatResult(ErrorCode.UNKNOWN_MEMBER_ID, message)
            self._remove(request.member_id)
            return HeartbeatResult(ErrorCode.NONE, member_id=request.member_id, member_epoch=-1)
        member = self._member(request)
        if isinstance(member, HeartbeatResult):
            return member
        names = request.subscribed_topic_names
        if names is not None and tuple(sorted(set(names))) != member.topic_names:
            member.topic_names = tuple(sorted(set(names)))
            self.group_epoch += 1
        self._assign_if_needed(topics, topic_ids or {})
        member.epoch = self.group_epoch
        member.session_deadline_ms = now_ms + self.config.session_timeout_ms
        # Marked sent only once the answer goes out (``assignment_sent``): an answer lost to a
        # failed etcd write must not keep the assignment from the member's next heartbeat.
        send = member.sent != member.assigned or names is not None
        return HeartbeatResult(
            ErrorCode.NONE,
            member_id=member.member_id,
            member_epoch=member.epoch,
            heartbeat_interval_ms=self.config.heartbeat_interval_ms,
            assignment=member.assigned if send else None,
        )

    def assignment_sent(self, member_id: str, assignment: frozenset[TopicPartition]) -> None:
        """The heartbeat answer carrying ``assignment`` is going out (its change is in etcd):
        later heartbeats leave it out until it changes again."""
        member = self.members.get(member_id)
        if member is not None:
            member.sent = assignment

    def _member(self, request: ShareHeartbeat) -> ShareMember | HeartbeatResult:
        member = self.members.get(request.member_id)
        if request.member_epoch == JOIN_EPOCH:
            if member is not None:
                return member  # a join retried (its answer was lost): same member
            if not size_limits.admits_join(self.config.max_size, len(self.members), known=False):
                message = f"the group has reached its maximum of {self.config.max_size} members"
                return HeartbeatResult(ErrorCode.GROUP_MAX_SIZE_REACHED, message)
            member = ShareMember(
                request.member_id, request.rack_id, request.client_id, request.client_host
            )
            self.members[member.member_id] = member
            return member  # its subscription (never empty on a join) moves the group epoch
        if member is None:
            message = f"member {request.member_id} is not in group {self.group_id}"
            return HeartbeatResult(ErrorCode.UNKNOWN_MEMBER_ID, message)
        if request.member_epoch != member.epoch:
            message = f"epoch {request.member_epoch}, expected {member.epoch}"
            return HeartbeatResult(ErrorCode.FENCED_MEMBER_EPOCH, message)
        if request.rack_id is not None:
            member.rack_id = request.rack_id
        return member

    def _remove(self, member_id: str) -> None:
        if self.members.pop(member_id, None) is not None:
            self.group_epoch += 1
            self.assignment_epoch = -1  # recomputed at the next heartbeat

    def _assign_if_needed(self, topics: Mapping[str, int], topic_ids: Mapping[str, str]) -> None:
        wanted = self.subscribed_topics()
        subscribed = {t: n for t, n in topics.items() if t in wanted}
        ids = {t: i for t, i in topic_ids.items() if t in wanted}
        if ids != self.subscribed_ids:
            self.subscribed_ids = ids
            for member in self.members.values():
                member.sent = None  # the assignment goes out again, under the current ids
            if self.assignment_epoch == self.group_epoch:
                self.group_epoch += 1
        if subscribed != self.subscribed_partitions:
            if self.assignment_epoch == self.group_epoch:
                self.group_epoch += 1
            self.subscribed_partitions = subscribed
        if self.assignment_epoch == self.group_epoch:
            return
        target = assign({m.member_id: m.topic_names for m in self.members.values()}, subscribed)
        for member in self.members.values():
            member.assigned = target.get(member.member_id, frozenset())
        self.assignment_epoch = self.group_epoch
