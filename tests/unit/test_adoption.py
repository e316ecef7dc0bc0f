"""Which stored groups a retention check takes on (``groups.adoption``), and the page reader's
pure part (``store.first_keys``): over successive checks every group is looked at and every
adoptable one taken, none twice in a pass, at most N per check, and a bounded number of ids
looked at per check."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.groups.adoption import (
    LISTED_PER_ADOPTED,
    Sweep,
    start_check,
    take_from_page,
)
from kafscale.broker.groups.store import first_keys, parse_group_key
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd_txn import KeyValue

pytestmark = pytest.mark.unit


@dataclass
class Check:
    """What one simulated check did."""

    looked_at: list[str]
    taken: list[str]
    sweep: Sweep


def run_check(
    stored: list[str], adoptable: set[str], after: str | None, per_check: int, pages: list[int]
) -> Check:
    """One check as the coordinator runs it: pages of the stored ids after ``after`` (sizes
    drawn from ``pages``, cycled) until the check is done."""
    sweep = start_check(after, per_check)
    looked_at: list[str] = []
    taken: list[str] = []
    remaining = [g for g in stored if after is None or g > after]
    page_index = 0
    while True:
        size = pages[page_index % len(pages)]
        page_index += 1
        page, remaining = remaining[:size], remaining[size:]
        before = sweep
        sweep, took = take_from_page(sweep, page, adoptable.__contains__, not remaining)
        looked_at += page[: before.allowance - sweep.allowance]
        taken += took
        if sweep.done:
            return Check(looked_at, taken, sweep)
        remaining = [g for g in stored if sweep.after is None or g > sweep.after]


@given(
    stored=st.lists(st.text("abcg-/0", min_size=1, max_size=4), unique=True, max_size=40).map(
        sorted
    ),
    adoptable_mask=st.lists(st.booleans(), min_size=40, max_size=40),
    per_check=st.integers(1, 5),
    pages=st.lists(st.integers(1, 7), min_size=1, max_size=5),
    start=st.integers(0, 40),
)
def test_successive_checks_visit_every_group_once_a_pass_and_take_at_most_n(
    stored: list[str], adoptable_mask: list[bool], per_check: int, pages: list[int], start: int
) -> None:
    adoptable = {g for g, yes in zip(stored, adoptable_mask, strict=False) if yes}
    # A sweep left mid-way by earlier checks: the pass goes on from there, then a whole pass.
    after = stored[start] if start < len(stored) else None
    looked_at: list[str] = []
    taken: list[str] = []
    passes_ended = 0
    for _ in range(2 * len(stored) + 4):  # each check looks at one id at least, or ends a pass
        check = run_check(stored, adoptable, after, per_check, pages)
        assert len(check.taken) <= per_check
        assert len(check.looked_at) <= per_check * LISTED_PER_ADOPTED
        assert set(check.taken) <= adoptable
        if passes_ended == 1:
            looked_at += check.looked_at
            taken += check.taken
        after = check.sweep.after
        if after is None:
            passes_ended += 1
            if passes_ended == 2:
                break
    assert passes_ended == 2, "a pass never ended"
    assert looked_at == stored  # every id once, in key order, none twice
    assert taken == [g for g in stored if g in adoptable]


def test_a_check_stops_at_its_bound_and_the_next_goes_on_after_it() -> None:
    stored = [f"g{i:02d}" for i in range(10)]
    sweep, taken = take_from_page(start_check(None, 3), stored, lambda g: True, True)
    assert taken == ["g00", "g01", "g02"] and sweep == Sweep("g02", 0, 27, done=True)
    sweep, taken = take_from_page(start_check("g02", 3), stored[3:], lambda g: True, True)
    assert taken == ["g03", "g04", "g05"] and sweep.after == "g05"
    sweep, taken = take_from_page(start_check("g08", 3), stored[9:], lambda g: True, True)
    assert taken == ["g09"] and sweep == Sweep(None, 2, 29, done=True)  # the pass is over


def test_a_check_with_nothing_to_take_looks_at_a_bounded_number_of_ids() -> None:
    stored = [f"g{i:05d}" for i in range(100)]
    sweep, taken = take_from_page(start_check(None, 2), stored, lambda g: False, False)
    assert taken == [] and sweep == Sweep(stored[2 * LISTED_PER_ADOPTED - 1], 2, 0, done=True)


CLUSTER = "c"


def _entry(key: str) -> KeyValue:
    return KeyValue(key, b"", 1, 1, 1, 0)


@given(
    groups=st.dictionaries(
        st.text("ag-/%0.", min_size=1, max_size=4),
        st.tuples(st.booleans(), st.integers(0, 3), st.booleans()),
        max_size=12,
    )
)
def test_first_keys_give_each_group_once_its_metadata_first(
    groups: dict[str, tuple[bool, int, bool]],
) -> None:
    """Ids that prefix one another or hold ``/`` (quoted in keys): each group's first key is
    its own, its metadata if it has one, and no other group's key is taken for it."""
    entries = []
    for group_id, (metadata, offsets, pending) in groups.items():
        if metadata:
            entries.append(keys.group_metadata_key(CLUSTER, group_id))
        entries += [keys.group_offset_key(CLUSTER, group_id, "t", p) for p in range(offsets)]
        if pending:
            entries.append(keys.group_txn_offset_key(CLUSTER, group_id, 7, "t", 0))
    firsts = first_keys(keys.groups_prefix(CLUSTER), [_entry(k) for k in sorted(entries)])
    stored = {g for g, (m, o, p) in groups.items() if m or o or p}
    prefixes = {g: keys.group_prefix(CLUSTER, g) for g in stored}
    owners = [next(g for g in stored if kv.key.startswith(prefixes[g])) for kv in firsts]
    assert sorted(owners) == sorted(stored)
    for owner, kv in zip(owners, firsts, strict=True):
        parsed = parse_group_key(CLUSTER, kv.key)
        if groups[owner][0]:
            assert parsed == (owner, None)  # the metadata
        elif groups[owner][1]:
            assert parsed == (owner, ("t", 0))
        else:
            assert parsed is None  # only a pending offset: not a stored group to list
