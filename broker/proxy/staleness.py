"""When the proxy should stop trusting its routing table and read a lease from etcd itself.

The table follows etcd watches, and a watch that missed an event (it has happened: aetcd once
crossed watch creations, see ``broker/metadata/etcd_watcher.py``) leaves a route pointing at a
broker that gave the partition or group up. That broker answers NOT_LEADER_OR_FOLLOWER (or
NOT_COORDINATOR) and the proxy, waiting for a route change that never comes, would retry into
it until the request's deadline, for every request, as long as the table stays stale.

So a broker that keeps refusing a route the table still gives it is a reason to look: after a
grace (the watch normally catches up in milliseconds, and a new owner's own view of its lease
may lag a moment: ``ordering``), the proxy reads that one lease key from etcd and corrects the
entry if etcd disagrees. The reads are rate-limited per key, so a broker whose own view lags, or
a partition nobody holds for a while, costs at most one etcd read per key per interval.

Only decisions here: no clock, no etcd; ``RouteKey`` names what was refused, ``RefusalStreaks``
says when a check is due, ``corrected_holder`` what to do with etcd's answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RouteKind = Literal["partition", "group", "transaction"]

# A refusal this long after the previous one of the same key starts a new streak: the retries of
# one request come at most 0.5 s apart (the forwarder's longest back-off).
STREAK_GAP_S = 2.0
# Streaks kept at most; older ones are dropped first (a bound, not a working size: a streak
# lives only while a broker keeps refusing).
MAX_STREAKS = 10_000


@dataclass(frozen=True, slots=True)
class RouteKey:
    """What a broker refused: a partition, or a group's or transactional id's coordinator."""

    kind: RouteKind
    name: str
    partition: int = -1

    @classmethod
    def of_partition(cls, tp: tuple[str, int]) -> RouteKey:
        return cls("partition", tp[0], tp[1])

    def __str__(self) -> str:
        if self.kind == "partition":
            return f"partition {self.name}/{self.partition}"
        return f"{self.kind} {self.name!r}"


@dataclass(slots=True)
class Streak:
    """One broker refusing one key: since when, when last, and when etcd was last read for it."""

    broker: int
    first_at: float
    last_at: float
    checked_at: float | None = None


def check_due(streak: Streak, now: float, grace_s: float, interval_s: float) -> bool:
    """Read the key from etcd now? Once the broker has refused for ``grace_s``, and then at most
    once per ``interval_s``."""
    if now - streak.first_at < grace_s:
        return False
    return streak.checked_at is None or now - streak.checked_at >= interval_s


def corrected_holder(table_holder: int | None, etcd_holder: int | None) -> bool:
    """Does etcd's lease holder differ from the table's (so the table missed an event)?"""
    return table_holder != etcd_holder


class RefusalStreaks:
    """Which broker keeps refusing which key; says when a refusal calls for an etcd read."""

    def __init__(self, grace_s: float, interval_s: float, max_streaks: int = MAX_STREAKS) -> None:
        self.grace_s = grace_s
        self.interval_s = interval_s
        self.max_streaks = max_streaks
        self._streaks: dict[RouteKey, Streak] = {}

    def __len__(self) -> int:
        return len(self._streaks)

    def refused(self, key: RouteKey, broker: int, now: float) -> bool:
        """``broker``, which the table routes ``key`` to, refused it at ``now``: is an etcd read
        of the key due? (If so, the check is counted as made at ``now``.)"""
        streak = self._streaks.get(key)
        if streak is None or streak.broker != broker or now - streak.last_at > STREAK_GAP_S:
            streak = Streak(broker, now, now)
            self._remember(key, streak, now)
        streak.last_at = now
        if not check_due(streak, now, self.grace_s, self.interval_s):
            return False
        streak.checked_at = now
        return True

    def _remember(self, key: RouteKey, streak: Streak, now: float) -> None:
        streaks = self._streaks
        streaks.pop(key, None)
        if len(streaks) >= self.max_streaks:
            for old in [k for k, s in streaks.items() if now - s.last_at > STREAK_GAP_S]:
                del streaks[old]
            while len(streaks) >= self.max_streaks:
                del streaks[next(iter(streaks))]  # the oldest inserted
        streaks[key] = streak
