"""When a coordinator may let go of a group (``groups.release``): never one that holds anything
etcd does not (members, waiting requests, writes, pending transactional offsets), never before
it was unused for the idle time, and never where a reload would count offset retention from an
earlier Empty time than this coordinator does (KIP-211: never earlier than Kafka)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from kafscale.broker.config import BrokerSettings
from kafscale.broker.groups.coordinator import group_config
from kafscale.broker.groups.release import GroupUse, Release, decide, may_be_due

pytestmark = pytest.mark.unit

VACANT_S = 5.0
IDLE_S = 300.0

IDLE_EMPTY = GroupUse(
    unused_s=IDLE_S,
    busy=False,
    memberless=True,
    share=False,
    holds_offsets=True,
    offsets_timed=True,
    managed=True,
    record_stored=True,
    stored_members=False,
    stored_empty_since_ms=1_000,
    empty_since_ms=1_000,
)
"""A classic consumer group that committed, whose consumers all left, and whose Empty record
(with its Empty time) is in etcd, unused for the idle time."""


def test_an_idle_empty_group_whose_empty_time_is_stored_is_let_go() -> None:
    assert decide(IDLE_EMPTY, VACANT_S, IDLE_S) is Release.LET_GO


def test_an_empty_group_with_offsets_stays_until_the_idle_time() -> None:
    use = dataclasses.replace(IDLE_EMPTY, unused_s=IDLE_S - 1)
    assert decide(use, VACANT_S, IDLE_S) is Release.KEEP


def test_a_vacant_group_goes_after_the_vacant_time() -> None:
    """No offsets, nobody in it: the old rule (``groups.vacant_release_ms``), unchanged."""
    vacant = dataclasses.replace(IDLE_EMPTY, holds_offsets=False, unused_s=VACANT_S)
    assert decide(vacant, VACANT_S, IDLE_S) is Release.LET_GO
    early = dataclasses.replace(vacant, unused_s=VACANT_S - 0.1)
    assert decide(early, VACANT_S, IDLE_S) is Release.KEEP


@pytest.mark.parametrize(
    "change",
    [
        {"busy": True},  # a request waits, a write is on its way, a transaction is open
        {"memberless": False},  # members, static ones, joining ones, a rebalance
        {"share": True},
        {"offsets_timed": False},  # an offset from before commit times: counted from the load
        {"stored_members": True},  # etcd still lists members: a reload counts from its load
        {"record_stored": False, "stored_empty_since_ms": None},  # managed, no record stored
    ],
)
def test_an_idle_group_is_kept_when(change: dict[str, object]) -> None:
    use = dataclasses.replace(IDLE_EMPTY, **change)  # type: ignore[arg-type]
    assert decide(use, VACANT_S, IDLE_S) is Release.KEEP


def test_a_group_that_only_committed_offsets_goes_without_a_record() -> None:
    """``assign()`` + commit: no record; its offsets expire from their own commit times."""
    standalone = dataclasses.replace(
        IDLE_EMPTY, managed=False, record_stored=False, stored_empty_since_ms=None
    )
    assert decide(standalone, VACANT_S, IDLE_S) is Release.LET_GO


@pytest.mark.parametrize("stored", [None, 999])
def test_a_missing_or_earlier_stored_empty_time_is_written_first(stored: int | None) -> None:
    use = dataclasses.replace(IDLE_EMPTY, stored_empty_since_ms=stored)
    assert decide(use, VACANT_S, IDLE_S) is Release.STORE_EMPTY_TIME


uses = st.builds(
    GroupUse,
    unused_s=st.floats(0, 2 * IDLE_S),
    busy=st.booleans(),
    memberless=st.booleans(),
    share=st.booleans(),
    holds_offsets=st.booleans(),
    offsets_timed=st.booleans(),
    managed=st.booleans(),
    record_stored=st.booleans(),
    stored_members=st.booleans(),
    stored_empty_since_ms=st.none() | st.integers(0, 10),
    empty_since_ms=st.none() | st.integers(0, 10),
)


@given(uses)
def test_a_group_let_go_holds_nothing_etcd_lacks_and_reloads_no_earlier(use: GroupUse) -> None:
    decision = decide(use, VACANT_S, IDLE_S)
    if decision is Release.KEEP:
        return
    assert not use.busy and use.memberless and not use.share
    if not use.holds_offsets:
        assert decision is Release.LET_GO and use.unused_s >= VACANT_S
        return
    assert use.unused_s >= IDLE_S and use.offsets_timed
    if decision is Release.STORE_EMPTY_TIME:
        assert use.record_stored and not use.stored_members
        return
    if use.record_stored:
        # A reload takes the stored Empty time: no earlier than the one counted here.
        assert not use.stored_members and use.stored_empty_since_ms is not None
        assert use.empty_since_ms is None or use.stored_empty_since_ms >= use.empty_since_ms
    else:
        assert not use.managed  # a reload sees offsets only: counted from their commit times


@given(uses)
def test_storing_the_empty_time_leads_to_letting_go(use: GroupUse) -> None:
    """Once the Empty time held here is stored, the same group is let go."""
    if decide(use, VACANT_S, IDLE_S) is not Release.STORE_EMPTY_TIME:
        return
    stored = dataclasses.replace(use, stored_empty_since_ms=use.empty_since_ms or 0)
    assert decide(stored, VACANT_S, IDLE_S) is Release.LET_GO


@given(uses, st.sampled_from([(VACANT_S, IDLE_S), (VACANT_S, 1.0), (VACANT_S, VACANT_S)]))
def test_the_release_loop_passes_over_only_groups_that_would_be_kept(
    use: GroupUse, times: tuple[float, float]
) -> None:
    """The loop reads no ``GroupUse`` of a group in use (``may_be_due``: reading it is a pass
    over the group's offsets, every few seconds, for every group): it misses no group to go."""
    vacant_s, idle_s = times
    if not may_be_due(use.unused_s, vacant_s, idle_s):
        assert decide(use, vacant_s, idle_s) is Release.KEEP


def test_the_vacant_time_is_a_setting_carried_to_the_coordinator() -> None:
    """``groups.vacant_release_ms`` (was the constant ``VACANT_RELEASE_S``): 5 s by default,
    from the environment as ``KAFSCALE_GROUPS__VACANT_RELEASE_MS``, into ``GroupConfig``."""
    assert BrokerSettings().groups.vacant_release_ms == 5_000
    settings = BrokerSettings.model_validate({"groups": {"vacant_release_ms": 250}})
    assert group_config(settings.groups).vacant_release_ms == 250


@pytest.mark.parametrize("value", [0, -1, 86_400_001, "soon"])
def test_a_bad_vacant_time_is_refused_with_the_settings_name(value: object) -> None:
    with pytest.raises(ValidationError, match=r"groups\.vacant_release_ms"):
        BrokerSettings.model_validate({"groups": {"vacant_release_ms": value}})
