"""Groups whose members subscribe to topics, for the decisions that read what a group consumes
(OffsetDelete, offset retention): the subscription bytes a classic client sends in JoinGroup
and a Stable group of such members; a consumer-protocol (KIP-848) group whose members
subscribe by name or regular expression."""

from __future__ import annotations

import struct
from collections.abc import Iterable

from kafscale.broker.groups.consumer import ConsumerConfig, ConsumerGroup, HeartbeatRequest
from kafscale.broker.groups.group import Group
from kafscale.broker.groups.model import GroupConfig, GroupRecord, MemberRecord
from kafscale.broker.protocol.errors import ErrorCode


def subscription(topics: Iterable[str]) -> bytes:
    """A ConsumerProtocolSubscription v0 as classic clients write it."""
    names = list(topics)
    body = struct.pack(">hi", 0, len(names))
    body += b"".join(struct.pack(">h", len(t)) + t.encode() for t in names)
    return body + struct.pack(">i", -1)  # no user data


def stable_group(protocol_type: str, *metadata: bytes) -> Group:
    """A Stable classic group whose members joined with ``metadata``."""
    members = tuple(
        MemberRecord(f"m{i}", None, "c", "/h", 30_000, 10_000, data, b"")
        for i, data in enumerate(metadata)
    )
    record = GroupRecord(protocol_type, 3, "range", "m0", members)
    return Group.from_record("g", GroupConfig(), record, 0)


def member_heartbeat(
    member_id: str,
    epoch: int,
    names: tuple[str, ...] | None,
    owned: frozenset[tuple[str, int]] | None,
    regex: str | None = None,
) -> HeartbeatRequest:
    """A consumer-protocol member's ConsumerGroupHeartbeat (``names`` None: unchanged)."""
    return HeartbeatRequest(
        member_id=member_id,
        member_epoch=epoch,
        instance_id=None,
        rack_id=None,
        rebalance_timeout_ms=30_000,
        subscribed_topic_names=names,
        subscribed_topic_regex=regex,
        server_assignor=None,
        owned=owned,
        client_id="c",
        client_host="/h",
        fresh_id=member_id,
    )


def consumer_group(
    members: Iterable[tuple[str, tuple[str, ...], str | None]], topics: dict[str, int]
) -> ConsumerGroup:
    """A consumer-protocol group of ``(member id, topic names, regex)`` members, each joined by
    its first heartbeat while ``topics`` (name: partitions) exist."""
    group = ConsumerGroup("g", ConsumerConfig())
    for member_id, names, regex in members:
        request = member_heartbeat(member_id, 0, names, frozenset(), regex)
        assert group.heartbeat(0, request, topics).error is ErrorCode.NONE
    return group
