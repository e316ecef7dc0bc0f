"""Offset retention's pure decision (``groups.expiry``): Kafka's KIP-211 rules, and the stored
fields it reads (a group's empty time, an offset's expire timestamp)."""

from __future__ import annotations

import pytest
from harness.subscribed_groups import consumer_group, stable_group, subscription
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.groups.expiry import (
    GroupActivity,
    expired_offsets,
    offset_expired,
    subscribed_topics,
)
from kafscale.broker.groups.model import GroupRecord, GroupState, MemberRecord
from kafscale.broker.groups.store import (
    CommittedOffset,
    decode_group,
    decode_offset,
    encode_group,
    encode_offset,
)

pytestmark = pytest.mark.unit

RETENTION_MS = 60_000
LOADED_MS = 1_000


def committed(at_ms: int, expire_at_ms: int = -1) -> CommittedOffset:
    return CommittedOffset(5, commit_timestamp_ms=at_ms, expire_timestamp_ms=expire_at_ms)


def empty(since_ms: int) -> GroupActivity:
    return GroupActivity(managed=True, empty_since_ms=since_ms, loaded_at_ms=LOADED_MS)


WITH_MEMBERS = GroupActivity(managed=True, empty_since_ms=None, loaded_at_ms=LOADED_MS)
STANDALONE = GroupActivity(managed=False, empty_since_ms=LOADED_MS, loaded_at_ms=LOADED_MS)


def test_a_group_with_members_keeps_every_offset_however_old() -> None:
    offsets = {("t", 0): committed(0), ("t", 1): committed(0, expire_at_ms=1)}
    assert expired_offsets(WITH_MEMBERS, offsets, set(), RETENTION_MS, 10**12) == []


def test_an_empty_groups_offsets_expire_retention_after_it_became_empty() -> None:
    offsets = {("t", 0): committed(2_000), ("t", 1): committed(3_000)}
    activity = empty(since_ms=10_000)  # the commits are older than the empty time
    assert expired_offsets(activity, offsets, set(), RETENTION_MS, 69_999) == []
    assert expired_offsets(activity, offsets, set(), RETENTION_MS, 70_000) == [("t", 0), ("t", 1)]


def test_an_offset_committed_after_the_group_became_empty_counts_from_its_commit() -> None:
    offsets = {("t", 0): committed(2_000), ("t", 1): committed(50_000)}
    activity = empty(since_ms=10_000)
    assert expired_offsets(activity, offsets, set(), RETENTION_MS, 70_000) == [("t", 0)]
    assert expired_offsets(activity, offsets, set(), RETENTION_MS, 110_000) == [("t", 0), ("t", 1)]


def test_standalone_offsets_expire_retention_after_their_own_commit() -> None:
    offsets = {("t", 0): committed(2_000), ("t", 1): committed(30_000)}
    assert expired_offsets(STANDALONE, offsets, set(), RETENTION_MS, 62_000) == [("t", 0)]
    assert expired_offsets(STANDALONE, offsets, set(), RETENTION_MS, 90_000) == [("t", 0), ("t", 1)]


def test_an_offset_without_commit_time_counts_from_the_load_never_earlier() -> None:
    old = {("t", 0): committed(-1)}  # a document from before commit times were stored
    assert expired_offsets(STANDALONE, old, set(), RETENTION_MS, LOADED_MS + RETENTION_MS - 1) == []
    assert expired_offsets(STANDALONE, old, set(), RETENTION_MS, LOADED_MS + RETENTION_MS) == [
        ("t", 0)
    ]


def test_an_explicit_expire_timestamp_wins_once_the_group_is_empty() -> None:
    """OffsetCommit v2-v4 retention_time, as Kafka's expireTimestamp: shorter or longer."""
    short = committed(2_000, expire_at_ms=5_000)
    long = committed(2_000, expire_at_ms=500_000)
    assert offset_expired(short, empty(since_ms=3_000), RETENTION_MS, 5_000)
    assert not offset_expired(short, empty(since_ms=3_000), RETENTION_MS, 4_999)
    assert not offset_expired(long, empty(since_ms=3_000), RETENTION_MS, 499_999)
    assert offset_expired(long, STANDALONE, RETENTION_MS, 500_000)
    offsets = {("t", 0): short}
    assert expired_offsets(WITH_MEMBERS, offsets, set(), RETENTION_MS, 10**9) == []


def test_an_offset_pending_in_a_transaction_does_not_expire() -> None:
    offsets = {("t", 0): committed(0), ("t", 1): committed(0)}
    assert expired_offsets(STANDALONE, offsets, {("t", 1)}, RETENTION_MS, 10**9) == [("t", 0)]


def stable(*topics: str) -> GroupActivity:
    """A group with members that subscribe to ``topics`` (as ``subscribed_topics`` says)."""
    return GroupActivity(True, None, LOADED_MS, subscribed_topics=frozenset(topics))


def test_a_stable_groups_offsets_of_topics_nobody_subscribes_to_expire_after_their_commit() -> None:
    """Kafka 2.5+: a group that moved from topic a to topic b does not keep a's offsets."""
    offsets = {("a", 0): committed(2_000), ("a", 1): committed(30_000), ("b", 0): committed(0)}
    assert expired_offsets(stable("b"), offsets, set(), RETENTION_MS, 61_999) == []
    assert expired_offsets(stable("b"), offsets, set(), RETENTION_MS, 62_000) == [("a", 0)]
    assert expired_offsets(stable("b"), offsets, set(), RETENTION_MS, 10**12) == [
        ("a", 0),
        ("a", 1),
    ]
    assert expired_offsets(stable("a", "b"), offsets, set(), RETENTION_MS, 10**12) == []


def test_unsubscribed_offsets_keep_their_expire_timestamp_and_pending_commits() -> None:
    offsets = {
        ("a", 0): committed(0, expire_at_ms=500_000),  # OffsetCommit v2-v4 retention_time
        ("a", 1): committed(0),
        ("a", 2): committed(-1),  # stored before commit times: counts from the load
    }
    got = expired_offsets(stable("b"), offsets, {("a", 1)}, RETENTION_MS, 499_999)
    assert got == [("a", 2)]
    assert expired_offsets(stable("b"), offsets, set(), RETENTION_MS, RETENTION_MS) == [("a", 1)]
    assert expired_offsets(stable("b"), offsets, set(), RETENTION_MS, 500_000) == [
        ("a", 0),
        ("a", 1),
        ("a", 2),
    ]


def test_a_stable_classic_consumer_groups_subscriptions_are_read_from_its_members() -> None:
    group = stable_group("consumer", subscription(["b"]), subscription(["c"]))
    assert subscribed_topics(group, None, {"a", "b"}) == {"b", "c"}


def test_unknown_subscriptions_keep_every_offset() -> None:
    """Conservative where Kafka is: an unreadable member subscription, a group that does not
    speak the consumer protocol (e.g. Connect) or is rebalancing expires nothing."""
    assert (
        subscribed_topics(stable_group("consumer", subscription(["b"]), b"\xff"), None, {"a"})
        is None
    )
    assert subscribed_topics(stable_group("connect", b""), None, {"a"}) is None
    rebalancing = stable_group("consumer", subscription(["b"]))
    rebalancing.state = GroupState.PREPARING_REBALANCE
    assert subscribed_topics(rebalancing, None, {"a"}) is None
    assert subscribed_topics(None, None, {"a"}) is None
    offsets = {("a", 0): committed(0)}
    unknown = GroupActivity(True, None, LOADED_MS, subscribed_topics=None)
    assert expired_offsets(unknown, offsets, set(), RETENTION_MS, 10**12) == []


def test_a_consumer_protocol_group_keeps_topics_its_members_name_or_match() -> None:
    """KIP-848 members subscribe by name or by regular expression: a topic the expression
    matches counts as subscribed (Kafka's resolved regex)."""
    members = (("m1", ("orders",), None), ("m2", (), "logs-.*"))
    group = consumer_group(members, {"orders": 1, "logs-a": 1})
    topics = {"orders", "logs-a", "logs", "old"}
    assert subscribed_topics(None, group, topics) == {"orders", "logs-a"}


@given(
    managed=st.booleans(),
    empty_since=st.integers(0, 10**6),
    commit_at=st.integers(-1, 10**6),
    expire_at=st.just(-1) | st.integers(0, 2 * 10**6),
    retention=st.integers(1, 10**6),
    now=st.integers(0, 3 * 10**6),
)
def test_nothing_expires_before_its_retention_or_expire_time(
    managed: bool,
    empty_since: int,
    commit_at: int,
    expire_at: int,
    retention: int,
    now: int,
) -> None:
    """Expiring early loses a consumer's position: never before retention has passed since
    the later of the commit (or, without one, the load) and, for a managed group, its empty
    time; and always once it has."""
    activity = GroupActivity(managed, empty_since, LOADED_MS)
    offset = committed(commit_at, expire_at)
    got = offset_expired(offset, activity, retention, now)
    if expire_at >= 0:
        assert got == (now >= expire_at)
        return
    base = commit_at if commit_at >= 0 else LOADED_MS
    if managed:
        base = max(base, empty_since)
    assert got == (now >= base + retention)


def test_the_empty_time_and_the_expire_timestamp_are_stored() -> None:
    record = GroupRecord("consumer", 4, "range", None, empty_since_ms=1_700_000_000_000)
    assert decode_group(encode_group(record)) == record
    offset = committed(1_000, expire_at_ms=2_000)
    assert decode_offset(encode_offset(offset)) == offset


def test_documents_without_the_new_fields_read_as_unknown() -> None:
    assert decode_group(b'{"protocol_type":"consumer","generation":1}').empty_since_ms is None
    assert decode_offset(b'{"offset":3,"commit_timestamp_ms":7}').expire_timestamp_ms == -1
    member = MemberRecord("m", None, "c", "/h", 1, 1, b"", b"")
    assert GroupRecord("consumer", 1, "range", "m", (member,)).has_members()
    assert not GroupRecord("consumer", 1, None, None).has_members()
