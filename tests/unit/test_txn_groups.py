"""How a flush round's partition commits are cut into etcd transactions."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.storage.flush_commit import txn_groups

pytestmark = pytest.mark.unit


@given(
    sizes=st.lists(st.integers(1, 3000), max_size=120),
    max_count=st.integers(1, 50),
    max_bytes=st.integers(1, 5000),
)
def test_groups_cover_everything_in_order_within_both_limits(
    sizes: list[int], max_count: int, max_bytes: int
) -> None:
    groups = txn_groups(sizes, max_count, max_bytes)
    assert [i for group in groups for i in group] == list(range(len(sizes)))
    for group in groups:
        assert 1 <= len(group) <= max_count
        total = sum(sizes[i] for i in group)
        assert total <= max_bytes or len(group) == 1  # an oversized entry goes alone
    # As few transactions as the limits allow: no group could have taken the next entry.
    for group, following in itertools.pairwise(groups):
        total = sum(sizes[i] for i in group) + sizes[following[0]]
        assert len(group) == max_count or total > max_bytes


def test_small_states_share_one_transaction_and_large_ones_are_split() -> None:
    assert txn_groups([200] * 30, 40, 1 << 20) == [range(0, 30)]
    assert txn_groups([80_000] * 32, 40, 1 << 20) == [range(0, 13), range(13, 26), range(26, 32)]
    assert txn_groups([], 40, 1 << 20) == []
