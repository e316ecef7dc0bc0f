"""Whether a cluster view is following etcd, and the limited log of why not.

A view that stops following etcd keeps answering from what it last saw: Metadata names owners
that moved, the proxy routes to them, ACL and quota changes never arrive. Nothing of that is an
error a client sees, so the view says it instead: ``ClusterView.following`` (the admin
endpoint's ``/readyz`` and the ``kafscale_cluster_view_following`` gauge read it) and a log
line when a part of it stops, at most one a minute per part while it stays stopped, and one
when it follows again. A part is a watched key range, or the reload after a lost history.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

REPEAT_S = 60.0
"""While a part stays stopped, its reason is logged again at most this often."""


@dataclass(slots=True)
class _Gap:
    since_s: float
    logged_s: float
    failures: int
    warned: bool


def should_log_again(gap_logged_s: float, now_s: float, repeat_s: float = REPEAT_S) -> bool:
    """Whether a part still stopped gets another line now (pure: the clock is passed in)."""
    return now_s - gap_logged_s >= repeat_s


class FollowHealth:
    """The parts of one view that cannot follow etcd now, with their limited log."""

    def __init__(self, what: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._what = what
        self._clock = clock
        self._gaps: dict[str, _Gap] = {}

    @property
    def following(self) -> bool:
        return not self._gaps

    def stopped_parts(self) -> list[str]:
        return sorted(self._gaps)

    def pending(self, part: str) -> None:
        """``part`` is not followed until ``recovered`` (a reload under way), which is no
        failure: nothing is logged unless it ``failed`` meanwhile."""
        if part not in self._gaps:
            now = self._clock()
            self._gaps[part] = _Gap(now, now, 0, warned=False)

    def failed(self, part: str, reason: object) -> None:
        """``part`` could not follow etcd (``reason``: the error): logged when it first
        stops, then once per ``REPEAT_S`` with the count of failures in between."""
        now = self._clock()
        gap = self._gaps.get(part)
        if gap is None or not gap.warned:
            self._gaps[part] = _Gap(now if gap is None else gap.since_s, now, 1, warned=True)
            log.warning(
                "%s no longer follows etcd on %s (not ready until it does): %s",
                self._what, part, reason,
            )  # fmt: skip
            return
        gap.failures += 1
        if should_log_again(gap.logged_s, now):
            log.warning(
                "%s still does not follow etcd on %s after %.0f s (%d failures): %s",
                self._what, part, now - gap.since_s, gap.failures, reason,
            )  # fmt: skip
            gap.logged_s = now

    def recovered(self, part: str) -> None:
        """``part`` follows etcd again (its watch was created, or its reload answered)."""
        gap = self._gaps.pop(part, None)
        if gap is not None and gap.warned:
            log.warning(
                "%s follows etcd on %s again after %.1f s (%d failures)",
                self._what, part, self._clock() - gap.since_s, gap.failures,
            )  # fmt: skip
