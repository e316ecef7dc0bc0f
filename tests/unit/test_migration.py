"""Online migration between the classic and the consumer protocol (KIP-848), the pure parts:
the embedded ConsumerProtocolSubscription/Assignment codec, converting a live classic group to
a consumer group and back, and classic members inside a consumer group (join, sync, heartbeat,
leave) moving partitions only after their old owner released them."""

from __future__ import annotations

import struct

import pytest

from kafscale.broker.groups import migration
from kafscale.broker.groups.consumer import (
    ConsumerConfig,
    ConsumerGroup,
    HeartbeatRequest,
)
from kafscale.broker.groups.consumer_codec import restore, snapshot
from kafscale.broker.groups.group import Group
from kafscale.broker.groups.model import (
    GroupConfig,
    GroupRecord,
    GroupState,
    JoinRequest,
    MemberRecord,
    SyncRequest,
)
from kafscale.broker.groups.size_limits import UNBOUNDED
from kafscale.broker.protocol.codec import (
    decode_consumer_assignment,
    decode_consumer_subscription,
    encode_consumer_assignment,
)
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.unit

TOPICS = {"t": 4}
ALL = frozenset(("t", p) for p in range(4))


def _string(value: str) -> bytes:
    return struct.pack(">h", len(value)) + value.encode()


def subscription(topics: list[str], owned: dict[str, list[int]] | None, version: int = 1) -> bytes:
    """A ConsumerProtocolSubscription as classic clients write it (v0: no owned partitions)."""
    body = struct.pack(">h", version) + struct.pack(">i", len(topics))
    body += b"".join(_string(t) for t in topics) + struct.pack(">i", -1)  # no user data
    if version >= 1:
        owned = owned or {}
        body += struct.pack(">i", len(owned))
        for topic, partitions in owned.items():
            body += _string(topic) + struct.pack(">i", len(partitions))
            body += b"".join(struct.pack(">i", p) for p in partitions)
    return body


def test_the_embedded_documents_round_trip_and_bad_ones_are_none() -> None:
    assert decode_consumer_subscription(subscription(["a", "b"], None, 0)) is not None
    read = decode_consumer_subscription(subscription(["a"], {"a": [1, 2]}))
    assert read is not None and read.topics == ("a",) and read.owned == {("a", 1), ("a", 2)}
    # A version newer than the document's fields is read as the version it fits.
    v3 = decode_consumer_subscription(subscription(["a"], {"a": [0]}, 3))
    assert v3 is not None and v3.owned == {("a", 0)}
    for bad in (b"", b"\x00", b"\xff\xff", b"\x00\x00\x00\x00\x00\x09abc"):
        assert decode_consumer_subscription(bad) is None
        assert decode_consumer_assignment(bad) is None
    partitions = frozenset({("a", 3), ("b", 0), ("a", 1)})
    assert decode_consumer_assignment(encode_consumer_assignment(partitions)) == partitions


def classic_group(
    protocol_type: str = "consumer", metadata: bytes | None = None, generation: int = 7
) -> Group:
    """A Stable classic group of c1 (partitions 0, 1) and c2 (2, 3)."""
    members = tuple(
        MemberRecord(
            member_id=name,
            group_instance_id=None,
            client_id="c",
            client_host="/h",
            rebalance_timeout_ms=30_000,
            session_timeout_ms=10_000,
            subscription=subscription(["t"], None) if metadata is None else metadata,
            assignment=encode_consumer_assignment(frozenset(("t", p) for p in partitions)),
        )
        for name, partitions in (("c1", (0, 1)), ("c2", (2, 3)))
    )
    record = GroupRecord(protocol_type, generation, "range", "c1", members)
    return Group.from_record("g", GroupConfig(), record, 0)


def consumer_join(member_id: str, epoch: int = 0, owned: frozenset | None = None):
    return HeartbeatRequest(
        member_id=member_id,
        member_epoch=epoch,
        instance_id=None,
        rack_id=None,
        rebalance_timeout_ms=30_000 if epoch == 0 else -1,
        subscribed_topic_names=("t",) if epoch == 0 else None,
        subscribed_topic_regex=None,
        server_assignor=None,
        owned=frozenset() if epoch == 0 else owned,
        client_id="c",
        client_host="/h",
        fresh_id="unused",
    )


def classic_join(member_id: str, owned: dict[str, list[int]] | None = None, **changes):
    fields = {
        "member_id": member_id,
        "group_instance_id": None,
        "client_id": "c",
        "client_host": "/h",
        "session_timeout_ms": 10_000,
        "rebalance_timeout_ms": 30_000,
        "protocol_type": "consumer",
        "protocols": (("range", subscription(["t"], owned)),),
        "require_known_member_id": True,
        "supports_skip_assignment": True,
        "fresh_id": "x",
    }
    return JoinRequest(**{**fields, **changes})


def upgraded() -> ConsumerGroup:
    group = classic_group()
    assert migration.upgrade_refusal(group, ConsumerConfig()) is None
    return migration.consumer_group_from_classic(group, ConsumerConfig(), 0)


def assert_disjoint(consumer: ConsumerGroup) -> None:
    seen: set[tuple[str, int]] = set()
    for member in consumer.members.values():
        assert not seen & member.current.held, f"{member.member_id} holds a held partition"
        seen |= member.current.held


def test_a_live_classic_group_converts_with_its_members_and_assignments() -> None:
    consumer = upgraded()
    assert set(consumer.members) == {"c1", "c2"}
    c1 = consumer.members["c1"]
    assert c1.current.epoch == 7 and c1.current.assigned == {("t", 0), ("t", 1)}
    assert c1.classic is not None and c1.classic.session_timeout_ms == 10_000
    assert c1.topic_names == ("t",)
    assert consumer.group_epoch == 7
    downgrade = migration.should_downgrade(consumer, UNBOUNDED)
    assert not downgrade or not consumer.has_consumer_members()


def test_groups_kafka_cannot_convert_are_refused() -> None:
    config = ConsumerConfig()
    assert "protocol type" in str(migration.upgrade_refusal(classic_group("connect"), config))
    unreadable = classic_group(metadata=b"\x00")
    assert "subscription" in str(migration.upgrade_refusal(unreadable, config))
    small = ConsumerConfig(max_size=1)
    assert "more members" in str(migration.upgrade_refusal(classic_group(), small))


def test_partitions_move_from_classic_members_only_after_they_rejoin() -> None:
    consumer = upgraded()
    joined = consumer.heartbeat(1, consumer_join("k"), TOPICS)
    assert joined.error is ErrorCode.NONE
    assert joined.assignment == frozenset()  # everything is still held by the classic members
    assert_disjoint(consumer)
    # The classic members are told to rejoin (the group epoch moved on).
    assert migration.heartbeat(consumer, 2, "c1", None, 7) is ErrorCode.REBALANCE_IN_PROGRESS
    assert migration.heartbeat(consumer, 2, "c1", None, 6) is ErrorCode.ILLEGAL_GENERATION
    # Eager members revoke everything before rejoining: nothing owned.
    for name in ("c1", "c2"):
        result = migration.join(consumer, 3, classic_join(name), TOPICS)
        assert result.error is ErrorCode.NONE and result.generation_id == consumer.group_epoch
        assert result.leader_id != name and result.members == ()  # a follower: no assignor
        synced = migration.sync(
            consumer, 3, SyncRequest(name, result.generation_id, None, "consumer", "range")
        )
        assert synced.error is ErrorCode.NONE
        assigned = decode_consumer_assignment(synced.assignment)
        assert assigned == consumer.members[name].current.assigned
        assert assigned == consumer.target_of(consumer.members[name])
        assert_disjoint(consumer)
        stale = SyncRequest(name, result.generation_id - 1, None, None, None)
        assert migration.sync(consumer, 3, stale).error is ErrorCode.ILLEGAL_GENERATION
    # The freed partitions go to the consumer-protocol member at its next heartbeat.
    member = consumer.members["k"]
    taken = consumer.heartbeat(4, consumer_join("k", member.current.epoch, frozenset()), TOPICS)
    assert taken.assignment and taken.assignment == consumer.target_of(member)
    assert_disjoint(consumer)
    everyone = set().union(*(m.current.assigned for m in consumer.members.values()))
    assert everyone == ALL
    for name in ("c1", "c2"):
        epoch = consumer.members[name].current.epoch
        assert migration.heartbeat(consumer, 5, name, None, epoch) is ErrorCode.NONE
    assert consumer.state == "Stable"


def test_a_cooperative_member_keeps_what_it_still_owns_until_it_reports_it_released() -> None:
    consumer = upgraded()
    consumer.heartbeat(1, consumer_join("k"), TOPICS)
    # c1 rejoins still owning its partitions: the one it loses is revoked, not handed over.
    result = migration.join(consumer, 2, classic_join("c1", {"t": [0, 1]}), TOPICS)
    c1 = consumer.members["c1"]
    assert c1.current.revoking, "a partition moves away from c1"
    assert result.generation_id == 7  # its epoch does not move before it revoked
    assert migration.heartbeat(consumer, 3, "c1", None, 7) is ErrorCode.REBALANCE_IN_PROGRESS
    assert_disjoint(consumer)
    kept = sorted(p for _, p in c1.current.assigned)
    migration.join(consumer, 4, classic_join("c1", {"t": kept}), TOPICS)
    assert not c1.current.revoking and c1.current.epoch == consumer.group_epoch
    assert_disjoint(consumer)


def test_classic_joins_kafka_refuses() -> None:
    consumer = upgraded()
    consumer.heartbeat(1, consumer_join("k"), TOPICS)
    connect = classic_join("c1", protocol_type="connect")
    garbage = classic_join("c1", protocols=(("range", b"\x00"),))
    # ...and a consumer-protocol member cannot speak JoinGroup under its id.
    for refused in (connect, garbage, classic_join("k")):
        error = migration.join(consumer, 2, refused, TOPICS).error
        assert error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    fresh = migration.join(consumer, 2, classic_join(""), TOPICS)
    assert fresh.error is ErrorCode.MEMBER_ID_REQUIRED and fresh.member_id
    assert migration.heartbeat(consumer, 2, "k", None, 1) is ErrorCode.UNKNOWN_MEMBER_ID


def test_a_new_classic_member_joins_and_waits_for_released_partitions() -> None:
    consumer = ConsumerGroup("g", ConsumerConfig())
    first = consumer.heartbeat(0, consumer_join("k"), TOPICS)
    assert first.assignment == ALL
    result = migration.join(consumer, 1, classic_join("new-1"), TOPICS)
    assert result.error is ErrorCode.NONE
    new = consumer.members["new-1"]
    assert new.current.assigned == frozenset()  # k has not released anything yet
    assert migration.heartbeat(consumer, 2, "new-1", None, new.current.epoch) is ErrorCode.NONE
    k = consumer.members["k"]
    revoked = consumer.heartbeat(3, consumer_join("k", k.current.epoch, ALL), TOPICS)
    kept = revoked.assignment
    assert kept is not None and kept < ALL
    consumer.heartbeat(4, consumer_join("k", k.current.epoch, kept), TOPICS)
    # Released: the classic member is asked to rejoin, and gets them.
    epoch = new.current.epoch
    assert migration.heartbeat(consumer, 5, "new-1", None, epoch) is ErrorCode.REBALANCE_IN_PROGRESS
    migration.join(consumer, 6, classic_join("new-1"), TOPICS)
    assert new.current.assigned == ALL - kept
    assert_disjoint(consumer)


def test_the_group_converts_back_when_the_last_consumer_member_leaves() -> None:
    consumer = upgraded()
    consumer.heartbeat(1, consumer_join("k"), TOPICS)
    assert not migration.should_downgrade(consumer, UNBOUNDED)
    consumer.heartbeat(2, consumer_join("k", -1), TOPICS)
    assert migration.should_downgrade(consumer, UNBOUNDED)
    group = migration.classic_group_from_consumer(consumer, GroupConfig(), 3)
    assert set(group.members) == {"c1", "c2"}
    assert group.state is GroupState.PREPARING_REBALANCE  # members rejoin, the leader assigns
    assert group.generation == consumer.group_epoch and group.protocol_name == "range"
    assigned = decode_consumer_assignment(group.members["c1"].assignment)
    assert assigned == consumer.members["c1"].current.held
    # Classic members leaving one by one leave an empty consumer group (not converted).
    assert migration.leave(consumer, [("c1", None), ("zz", None)]) == [
        ErrorCode.NONE,
        ErrorCode.UNKNOWN_MEMBER_ID,
    ]


def test_classic_members_commit_with_their_generation_and_survive_a_new_coordinator() -> None:
    consumer = upgraded()
    assert consumer.validate_commit("c1", 7, version=8) is ErrorCode.NONE
    assert consumer.validate_commit("c1", 6, version=8) is ErrorCode.ILLEGAL_GENERATION
    restored = restore("g", snapshot(consumer), ConsumerConfig(), 100)
    c1 = restored.members["c1"]
    assert c1.classic == consumer.members["c1"].classic
    assert c1.session_deadline_ms == 100 + 10_000
    assert snapshot(restored) == snapshot(consumer)


def test_a_classic_member_that_does_not_rejoin_in_its_rebalance_timeout_is_removed() -> None:
    consumer = upgraded()
    consumer.heartbeat(1, consumer_join("k"), TOPICS)
    for name in ("c1", "c2"):
        assert migration.heartbeat(consumer, 10, name, None, 7) is ErrorCode.REBALANCE_IN_PROGRESS
    migration.join(consumer, 20, classic_join("c1"), TOPICS)  # c1 rejoins, c2 never does
    epoch = consumer.members["c1"].current.epoch
    assert migration.heartbeat(consumer, 25_000, "c1", None, epoch) is ErrorCode.NONE
    assert migration.heartbeat(consumer, 25_000, "c2", None, 7) is ErrorCode.REBALANCE_IN_PROGRESS
    assert consumer.tick(30_009) == []
    assert consumer.tick(30_010) == ["c2"]  # 30 s after it was first told, heartbeats or not
    assert set(consumer.members) == {"c1", "k"}
    assert_disjoint(consumer)
