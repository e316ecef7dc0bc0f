"""OffsetFetch at a broker that does not coordinate the group: the pure decisions
(``api/group_offsets``). The wiring, with real brokers and librdkafka, is
``tests/integration/test_group_offsets_elsewhere.py``."""

from __future__ import annotations

import pytest

from kafscale.broker.api.group_offsets import names_member_epoch, stored_committed
from kafscale.broker.groups.store import CommittedOffset, LoadedGroup

pytestmark = pytest.mark.unit

LOADED = LoadedGroup(
    record=None,
    offsets={
        ("t", 1): CommittedOffset(7),
        ("t", 0): CommittedOffset(5),
        ("u", 0): CommittedOffset(2),
    },
    pending=frozenset({("t", 0), ("t", 2)}),
)


def test_the_asked_partitions_get_their_stored_offsets_and_pending_marks() -> None:
    committed, unstable = stored_committed(LOADED, [("t", 0), ("t", 2), ("t", 3)])
    assert committed == {("t", 0): CommittedOffset(5), ("t", 2): None, ("t", 3): None}
    assert unstable == {("t", 0), ("t", 2)}  # pending with or without a committed offset


def test_all_of_the_groups_offsets_in_key_order_as_the_coordinator_answers() -> None:
    committed, unstable = stored_committed(LOADED, None)
    assert list(committed) == [("t", 0), ("t", 1), ("u", 0)]
    assert unstable == {("t", 0), ("t", 2)}


@pytest.mark.parametrize(
    ("member_id", "epoch", "named"),
    [
        (None, -1, False),  # librdkafka's assignment OffsetFetch, every classic consumer
        ("m", -1, False),
        (None, 4, False),
        ("m", 0, True),  # a KIP-848 member: only the coordinator knows its epoch
        ("m", 4, True),
    ],
)
def test_only_a_member_with_an_epoch_needs_the_coordinator(
    member_id: str | None, epoch: int, named: bool
) -> None:
    assert names_member_epoch(member_id, epoch) is named
