"""Pure parts around the state machine: coordinator choice, record codecs, etcd key parsing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.groups.leases import choose_coordinator, name_coordinator
from kafscale.broker.groups.model import GroupRecord, MemberRecord
from kafscale.broker.groups.store import (
    CommittedOffset,
    decode_group,
    decode_offset,
    encode_group,
    encode_offset,
    parse_group_key,
)
from kafscale.broker.metadata import keys

pytestmark = pytest.mark.unit


def test_live_holder_wins() -> None:
    assert choose_coordinator("g", 3, [1, 2, 3]) == 3
    assert choose_coordinator("g", 3, [3], draining=[3]) == 3  # it still holds the lease


def test_without_a_live_holder_every_broker_picks_the_same_one() -> None:
    picks = {choose_coordinator("orders", None, order) for order in ([1, 2, 3], [3, 1, 2])}
    assert len(picks) == 1
    assert choose_coordinator("orders", 9, [1, 2, 3]) in picks  # a dead holder is ignored
    assert choose_coordinator("g", None, []) is None


@given(st.text(max_size=30), st.sets(st.integers(1, 50), min_size=2, max_size=8))
def test_draining_brokers_are_not_picked(group: str, live: set[int]) -> None:
    draining = {min(live)}
    chosen = choose_coordinator(group, None, live, draining)
    assert chosen in live and chosen not in draining
    assert choose_coordinator(group, None, live, live) in live  # all draining: still someone


@given(st.text(max_size=30), st.sets(st.integers(1, 50), min_size=2, max_size=8), st.data())
def test_a_leaving_broker_names_whom_the_others_name_never_itself(
    group: str, live: set[int], data: st.DataObject
) -> None:
    """A stopping broker (``leaving``, about itself) names what the others name once they see
    its draining mark: the same pick without it, or another live holder; never itself, and
    nobody while it still holds the lease (COORDINATOR_NOT_AVAILABLE, retried)."""
    leaving = data.draw(st.sampled_from(sorted(live)))
    others_pick = choose_coordinator(group, None, live, {leaving})
    assert choose_coordinator(group, None, live, (), {leaving}) == others_pick != leaving
    assert choose_coordinator(group, leaving, live, (), {leaving}) is None
    holder = data.draw(st.sampled_from(sorted(live - {leaving})))
    assert choose_coordinator(group, holder, live, (), {leaving}) == holder
    assert choose_coordinator(group, None, {leaving}, (), {leaving}) is None  # nobody else


@given(
    st.text(max_size=30),
    st.sets(st.integers(1, 50), min_size=2, max_size=8),
    st.sets(st.integers(1, 50), max_size=3),
    st.one_of(st.none(), st.integers(1, 50)),
)
def test_find_coordinator_never_names_a_draining_broker(
    group: str, live: set[int], draining: set[int], holder: int | None
) -> None:
    """FindCoordinator's answer (``name_coordinator``) leaves every draining broker out, as
    holder too (it refuses the group from its mark on): a draining holder counts as none, so
    the next coordinator is named at once; otherwise it is ``choose_coordinator``'s. With
    every live broker draining, nobody (COORDINATOR_NOT_AVAILABLE)."""
    named = name_coordinator(group, holder, live, draining)
    if not live - draining:
        assert named is None
        return
    assert named in live and named not in draining
    without_draining_holder = None if holder in draining else holder
    assert named == choose_coordinator(group, without_draining_holder, live, draining)


members = st.builds(
    MemberRecord,
    member_id=st.text(min_size=1, max_size=20),
    group_instance_id=st.none() | st.text(max_size=10),
    client_id=st.text(max_size=10),
    client_host=st.text(max_size=10),
    rebalance_timeout_ms=st.integers(0, 10**7),
    session_timeout_ms=st.integers(0, 10**7),
    subscription=st.binary(max_size=40),
    assignment=st.binary(max_size=40),
)


@given(
    st.builds(
        GroupRecord,
        protocol_type=st.none() | st.text(max_size=10),
        generation=st.integers(0, 2**31 - 1),
        protocol_name=st.none() | st.text(max_size=10),
        leader=st.none() | st.text(max_size=10),
        members=st.lists(members, max_size=4).map(tuple),
    )
)
def test_group_record_round_trip(record: GroupRecord) -> None:
    assert decode_group(encode_group(record)) == record


@given(
    st.builds(
        CommittedOffset,
        offset=st.integers(-1, 2**63 - 1),
        leader_epoch=st.integers(-1, 2**31 - 1),
        metadata=st.text(max_size=50),
        commit_timestamp_ms=st.integers(-1, 2**50),
    )
)
def test_offset_round_trip(committed: CommittedOffset) -> None:
    assert decode_offset(encode_offset(committed)) == committed


def test_group_keys_parse_back() -> None:
    cluster = "c1"
    assert parse_group_key(cluster, keys.group_metadata_key(cluster, "g/x")) == ("g/x", None)
    offset_key = keys.group_offset_key(cluster, "g/x", "orders", 12)
    assert parse_group_key(cluster, offset_key) == ("g/x", ("orders", 12))
    assert parse_group_key(cluster, keys.group_offset_key(cluster, "", "t", 0)) == ("", ("t", 0))
    assert parse_group_key(cluster, keys.groups_prefix(cluster) + "g/junk") is None
