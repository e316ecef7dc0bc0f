"""How a broker's graceful stop shares its one grace period between its steps.

The graceful part of a stop (``Broker.shutdown``) has two steps that can each take long: the
hand-off (flush what is buffered, release every partition and group lease) and then the
requests already read, which ``KafkaServer.close`` lets finish. Each used to get the whole
``limits.shutdown_grace_s`` in turn, so a stop that was still making progress could take twice
the grace and be cut by the stop bound (``stop_deadline``: grace + ``CLOSE_MARGIN_S``, then exit
124), and a hand-off that used the whole grace left nothing for the requests.

Now both run against one deadline, ``grace_s`` after the stop began: the hand-off first, until
``HANDOFF_SHARE`` of the grace at the latest; then the requests in flight, until the grace is
over; whatever the hand-off leaves unused goes to them. A graceful part that ends by the grace
leaves the close margin to close the clients, so a stop within its grace is never cut.
"""

from __future__ import annotations

from dataclasses import dataclass

HANDOFF_SHARE = 0.75
"""Of the grace, how much the hand-off may use at most; the rest is kept for the requests in
flight. The hand-off gets the larger part: it protects every producer of every partition the
broker owns (a hand-off cut short fails what it buffered, and those produces are retried), while
the requests still in flight once it ends are few and short (a long poll waits at most the
client's ``fetch.max.wait.ms``, 500 ms by default; a fetch reads a segment or two). A quarter is
a floor for them, not a cap: they also get what the hand-off leaves."""


@dataclass(frozen=True, slots=True)
class StopDeadlines:
    """Event-loop times (``loop.time()``) by which each step of the graceful stop must end."""

    handoff_until: float
    """The hand-off: coordinators' leases, flush, partition leases."""
    graceful_until: float
    """Everything graceful: the session revoke and the requests in flight."""


def stop_deadlines(
    now_s: float, grace_s: float, handoff_share: float = HANDOFF_SHARE
) -> StopDeadlines:
    """The deadlines of a stop that begins at ``now_s`` with ``grace_s`` of grace (pure: the
    clock is passed in)."""
    grace_s = max(0.0, grace_s)
    share = min(1.0, max(0.0, handoff_share))
    return StopDeadlines(now_s + grace_s * share, now_s + grace_s)


def left_s(deadline_s: float, now_s: float) -> float:
    """Seconds from ``now_s`` to ``deadline_s``, never negative (a step past its deadline
    gets no time, rather than an error)."""
    return max(0.0, deadline_s - now_s)
