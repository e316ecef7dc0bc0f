"""Which stored groups one offset retention check takes on: a bounded share of them per check.

Groups are coordinated on demand, so at each retention check a broker also takes on ("adopts")
the groups stored in etcd that nobody coordinates and whose FindCoordinator pick it is: a group
nobody asked for since a restart must expire too (its keys are what fills etcd's quota). After
a restart nobody coordinates anything, and a cluster of throwaway group ids may store 100,000
of them: one check that took on all of them at once (a lease transaction and a load each, a
runtime each, after one read of every key) would stall the broker and etcd.

So the stored group ids are gone through in key order, a sweep that each check takes up where
the last one stopped (after the last id it looked at). A check takes on at most
``adopt_per_check`` groups and looks at most ``LISTED_PER_ADOPTED`` times as many ids, so a
check that finds little to take (every group coordinated, or most of them other brokers')
does not read the whole prefix either. At the end of the ids a pass is over, and the next
check starts a new one from the first. Within a pass every id is looked at once, none twice;
a group stored in the meantime behind the sweep waits for the next pass.

Pure: the caller reads the pages (``GroupStore.group_id_pages``) and says which ids may be
taken (nobody coordinates the group, this broker is its pick, it is no share group).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

ADOPT_PER_CHECK = 1000
"""Groups one check takes on at most, by default: each costs a lease transaction and a load
(two etcd round trips, a few ms) and then stays coordinated. 1000 per 10-minute check gets
through 100,000 stored groups in under a day, well inside the 7-day retention."""

LISTED_PER_ADOPTED = 10
"""Ids one check looks at per group it may take on (10,000 by default: ~20 etcd reads of
``PAGE_KEYS`` keys, keys only)."""


@dataclass(frozen=True, slots=True)
class Sweep:
    """Where one check stands: after which id the sweep goes on, and what is left of the
    check's bounds."""

    after: str | None
    """The last id looked at in this pass; None: the next look starts a pass at the first."""
    room: int
    """Groups this check may still take on."""
    allowance: int
    """Ids this check may still look at."""
    done: bool = False
    """The check is over: its bounds are used up, or the pass reached the last id."""


def start_check(after: str | None, adopt_per_check: int) -> Sweep:
    """A check that goes on after ``after`` (where the last one stopped)."""
    room = max(1, adopt_per_check)
    return Sweep(after, room, room * LISTED_PER_ADOPTED)


def take_from_page(
    sweep: Sweep, listed: Sequence[str], adoptable: Callable[[str], bool], last_page: bool
) -> tuple[Sweep, list[str]]:
    """The ids of ``listed`` (the next stored ids after ``sweep.after``, in key order) this
    check takes on, and where it stands after them. ``last_page``: no ids follow ``listed``."""
    taken: list[str] = []
    after, room, allowance = sweep.after, sweep.room, sweep.allowance
    for group_id in listed:
        if room == 0 or allowance == 0:
            return Sweep(after, room, allowance, done=True), taken
        allowance -= 1
        after = group_id
        if adoptable(group_id):
            taken.append(group_id)
            room -= 1
    if last_page:
        return Sweep(None, room, allowance, done=True), taken  # the pass is over
    return Sweep(after, room, allowance, done=room == 0 or allowance == 0), taken
