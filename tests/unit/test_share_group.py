"""Share group membership (KIP-932) on the coordinator: the simple assignor, epochs, leaving,
session expiry, and the etcd document a new coordinator restores from."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.groups.consumer import HeartbeatResult
from kafscale.broker.groups.share import (
    ShareConfig,
    ShareGroup,
    ShareHeartbeat,
    assign,
    new_group_refusal,
)
from kafscale.broker.groups.share_codec import restore, roll_back, snapshot
from kafscale.broker.protocol.errors import ErrorCode

CONFIG = ShareConfig(session_timeout_ms=1000, heartbeat_interval_ms=100)
TOPICS = {"t": 2, "u": 1}


def beat(member: str, epoch: int, topics: tuple[str, ...] | None = ("t",)) -> ShareHeartbeat:
    return ShareHeartbeat(member, epoch, None, topics, "client", "/127.0.0.1")


def answered(
    group: ShareGroup,
    now_ms: int,
    request: ShareHeartbeat,
    topics: dict[str, int],
    ids: dict[str, str] | None = None,
) -> HeartbeatResult:
    """A heartbeat whose answer went out, as the runtime gives it once etcd holds the change."""
    result = group.heartbeat(now_ms, request, topics, ids)
    if result.assignment is not None:
        group.assignment_sent(request.member_id, result.assignment)
    return result


def test_members_outnumbering_partitions_share_them() -> None:
    assigned = assign({"a": ["t"], "b": ["t"], "c": ["t"]}, {"t": 2})
    assert assigned == {"a": {("t", 0)}, "b": {("t", 1)}, "c": {("t", 0)}}


def test_partitions_outnumbering_members_are_dealt_out() -> None:
    assigned = assign({"a": ["t"], "b": ["t", "u"]}, {"t": 4, "u": 1})
    assert assigned["a"] | assigned["b"] >= {("t", p) for p in range(4)}
    assert assigned["b"] >= {("u", 0)}
    assert not assigned["a"] & assigned["b"]


@given(
    st.dictionaries(
        st.sampled_from("abcdef"), st.sets(st.sampled_from("xyz"), min_size=1), min_size=1
    ),
    st.dictionaries(st.sampled_from("xyz"), st.integers(1, 6)),
)
def test_every_subscribed_partition_is_assigned_to_a_subscriber(
    subscriptions: dict[str, set[str]], partitions: dict[str, int]
) -> None:
    assigned = assign(subscriptions, partitions)
    for topic, count in partitions.items():
        subscribers = [m for m, topics in subscriptions.items() if topic in topics]
        for p in range(count):
            holders = [m for m in subscribers if (topic, p) in assigned[m]]
            assert holders or not subscribers
        for m, tps in assigned.items():
            assert all(t in subscriptions[m] for t, _ in tps)
        if len(subscribers) >= count:
            assert all(any(t == topic for t, _ in assigned[m]) for m in subscribers)


def test_join_heartbeat_leave_and_epochs() -> None:
    group = ShareGroup("g", CONFIG)
    joined = answered(group, 0, beat("a", 0), TOPICS)
    assert (joined.error, joined.member_epoch, joined.assignment) == (
        ErrorCode.NONE,
        1,
        frozenset({("t", 0), ("t", 1)}),
    )
    b = answered(group, 10, beat("b", 0), TOPICS)
    assert b.member_epoch == 2 and b.assignment is not None and len(b.assignment) == 1
    a = answered(group, 20, beat("a", 1, None), TOPICS)
    assert a.member_epoch == 2 and a.assignment is not None and len(a.assignment) == 1
    # Nothing changed: no assignment sent again.
    assert answered(group, 30, beat("a", 2, None), TOPICS).assignment is None
    assert answered(group, 30, beat("a", 1, None), TOPICS).error is ErrorCode.FENCED_MEMBER_EPOCH
    assert answered(group, 30, beat("zz", 3, None), TOPICS).error is ErrorCode.UNKNOWN_MEMBER_ID
    left = answered(group, 40, beat("b", -1, None), TOPICS)
    assert (left.error, left.member_epoch) == (ErrorCode.NONE, -1)
    a = answered(group, 50, beat("a", 2, None), TOPICS)
    assert a.member_epoch == 3 and a.assignment == frozenset({("t", 0), ("t", 1)})
    assert group.state == "Stable"


def test_sessions_expire_and_the_group_becomes_empty() -> None:
    group = ShareGroup("g", CONFIG)
    group.heartbeat(0, beat("a", 0), TOPICS)
    assert group.next_deadline_ms() == 1000
    assert group.tick(999) == []
    assert group.tick(1000) == ["a"]
    assert group.state == "Empty" and group.is_empty()


def test_a_new_partition_moves_the_group_epoch() -> None:
    group = ShareGroup("g", CONFIG)
    group.heartbeat(0, beat("a", 0), TOPICS)
    grown = group.heartbeat(10, beat("a", 1, None), {"t": 3})
    assert grown.member_epoch == 2 and grown.assignment is not None and len(grown.assignment) == 3


def test_a_topic_created_again_sends_the_assignment_again() -> None:
    """Same name, same partition count, a new id: the members must learn the new id."""
    group = ShareGroup("g", CONFIG)
    answered(group, 0, beat("a", 0), TOPICS, {"t": "old", "u": "u1"})
    assert answered(group, 10, beat("a", 1, None), TOPICS, {"t": "old"}).assignment is None
    again = answered(group, 20, beat("a", 1, None), TOPICS, {"t": "new", "u": "u1"})
    assert again.member_epoch == 2 and again.assignment == frozenset({("t", 0), ("t", 1)})


def test_the_document_restores_members_at_their_epochs() -> None:
    group = ShareGroup("g", CONFIG)
    group.heartbeat(0, beat("a", 0), TOPICS)
    group.heartbeat(0, beat("b", 0, ("t", "u")), TOPICS)
    document = snapshot(group)
    restored = restore("g", document, CONFIG, now_ms=500)
    assert snapshot(restored) == document
    assert restored.next_deadline_ms() == 1500
    again = restored.heartbeat(600, beat("b", 2, None), TOPICS)
    assert again.error is ErrorCode.NONE and again.member_epoch == 2


def test_an_assignment_is_sent_until_an_answer_carrying_it_went_out() -> None:
    """The heartbeat whose etcd write failed was answered with an error: its assignment was
    never seen, so the member's next heartbeat carries it (it is marked sent only once an
    answer with it is given, ``assignment_sent``)."""
    group = ShareGroup("g", CONFIG)
    joined = group.heartbeat(0, beat("a", 0), TOPICS)  # its write failed: not marked sent
    assert joined.assignment == frozenset({("t", 0), ("t", 1)})
    retried = group.heartbeat(10, beat("a", 1, None), TOPICS)
    assert retried.assignment == joined.assignment
    group.assignment_sent("a", retried.assignment)
    assert group.heartbeat(20, beat("a", 1, None), TOPICS).assignment is None


def test_a_change_not_stored_is_rolled_back_to_the_stored_document() -> None:
    """A heartbeat's change whose etcd write failed is undone (``roll_back``): the member
    heartbeats on with the epoch it had, a member that joined in the failed change is gone,
    and the members that stayed keep their session deadline."""
    group = ShareGroup("g", CONFIG)
    answered(group, 0, beat("a", 0), TOPICS)
    stored = snapshot(group)
    moved = group.heartbeat(100, beat("a", 1, ("t", "u")), TOPICS)  # a new subscription
    group.heartbeat(100, beat("b", 0), TOPICS)  # a join
    assert moved.member_epoch == 2 and set(group.members) == {"a", "b"}
    roll_back(group, stored, now_ms=200)
    assert snapshot(group) == stored
    assert group.members["a"].session_deadline_ms == 1100
    again = answered(group, 300, beat("a", 1, ("t", "u")), TOPICS)
    assert again.error is ErrorCode.NONE and again.member_epoch == 2


def test_a_new_share_group_is_refused_at_the_cluster_s_bound() -> None:
    assert new_group_refusal(4, 5) is None
    refusal = new_group_refusal(5, 5)
    assert refusal is not None and "5 share groups" in refusal
    assert new_group_refusal(7, 5) is not None
