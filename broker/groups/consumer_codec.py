"""A consumer-protocol group's state as a JSON-ready document, and back (pure).

The coordinator writes this document (under the group's metadata key, fenced by the group
lease) whenever something a new coordinator would need changes: the group or assignment
epoch, a member joining or leaving, a subscription, a member's epoch or the partitions it
holds or is revoking. Heartbeats that change none of these write nothing. A new coordinator
restores the members with whole sessions (from when the last coordinator's lease went, where
Kafka's new coordinator starts them: ``runtime.sessions_start_ms``), so they carry on at
their epochs without a rebalance and, above all, it knows which partitions each member still
holds: it never hands one to a second member before the first released it.
"""

from __future__ import annotations

import base64
from typing import Any

from kafscale.broker.groups.consumer import (
    ClassicMember,
    ConsumerConfig,
    ConsumerGroup,
    ConsumerMember,
)
from kafscale.broker.groups.reconcile import MemberAssignment, TopicPartition

Document = dict[str, Any]


def _tps(partitions: frozenset[TopicPartition]) -> list[list[Any]]:
    return [[t, p] for t, p in sorted(partitions)]


def _untps(items: Any) -> frozenset[TopicPartition]:
    return frozenset((str(t), int(p)) for t, p in items or ())


def snapshot(group: ConsumerGroup) -> Document:
    return {
        "group_epoch": group.group_epoch,
        "assignment_epoch": group.assignment_epoch,
        "assignor": group.assignor,
        "subscribed_partitions": dict(sorted(group.subscribed_partitions.items())),
        "members": [_member(m, group.target_of(m)) for m in group.members.values()],
    }


def _member(member: ConsumerMember, target: frozenset[TopicPartition]) -> Document:
    return {
        "member_id": member.member_id,
        "instance_id": member.instance_id,
        "rack_id": member.rack_id,
        "client_id": member.client_id,
        "client_host": member.client_host,
        "rebalance_timeout_ms": member.rebalance_timeout_ms,
        "topic_names": list(member.topic_names),
        "topic_regex": member.topic_regex,
        "server_assignor": member.server_assignor,
        "epoch": member.current.epoch,
        "previous_epoch": member.previous_epoch,
        "assigned": _tps(member.current.assigned),
        "revoking": _tps(member.current.revoking),
        "target": _tps(target),
        "classic": _classic(member.classic),
    }


def _classic(classic: ClassicMember | None) -> Document | None:
    """A classic member's JoinGroup settings (online migration), or None."""
    if classic is None:
        return None
    return {
        "session_timeout_ms": classic.session_timeout_ms,
        "protocols": [[n, base64.b64encode(m).decode()] for n, m in classic.protocols],
    }


def _unclassic(entry: Any) -> ClassicMember | None:
    if not entry:
        return None
    protocols = tuple((str(n), base64.b64decode(m)) for n, m in entry.get("protocols") or ())
    return ClassicMember(int(entry.get("session_timeout_ms", 0)), protocols)


def restore(
    group_id: str, document: Document, config: ConsumerConfig, now_ms: int
) -> ConsumerGroup:
    """The group as a new coordinator takes it: every member with a whole session, and a
    revoking member with its whole rebalance timeout, from ``now_ms`` (the caller passes when
    the last coordinator's lease went, if it saw that: ``runtime.sessions_start_ms``)."""
    group = ConsumerGroup(group_id, config, int(document.get("group_epoch", 0)))
    group.assignment_epoch = int(document.get("assignment_epoch", group.group_epoch))
    group.assignor = str(document.get("assignor") or group.assignor)
    group.subscribed_partitions = {
        str(t): int(n) for t, n in (document.get("subscribed_partitions") or {}).items()
    }
    for entry in document.get("members") or ():
        member = ConsumerMember(
            member_id=str(entry["member_id"]),
            instance_id=entry.get("instance_id"),
            rack_id=entry.get("rack_id"),
            client_id=str(entry.get("client_id", "")),
            client_host=str(entry.get("client_host", "")),
            rebalance_timeout_ms=int(entry.get("rebalance_timeout_ms", 0)),
            topic_names=tuple(entry.get("topic_names") or ()),
            topic_regex=entry.get("topic_regex"),
            server_assignor=entry.get("server_assignor"),
            current=MemberAssignment(
                int(entry.get("epoch", 0)),
                _untps(entry.get("assigned")),
                _untps(entry.get("revoking")),
            ),
            previous_epoch=int(entry.get("previous_epoch", -1)),
            session_deadline_ms=now_ms + config.session_timeout_ms,
            classic=_unclassic(entry.get("classic")),
        )
        if member.classic is not None:
            member.session_deadline_ms = now_ms + member.classic.session_timeout_ms
        if member.current.revoking:
            member.revocation_deadline_ms = now_ms + max(member.rebalance_timeout_ms, 0)
        group.members[member.member_id] = member
        if member.instance_id is not None:
            group.static_members[member.instance_id] = member.member_id
        group.target[member.member_id] = _untps(entry.get("target"))
    return group
