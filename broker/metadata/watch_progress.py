"""Telling a watch that stays open but silent from one that has nothing to say.

A watch on an etcd member that stopped following the cluster (frozen by SIGSTOP or a stalled
disk, cut off from its peers, or diverged: etcd 3.5.1 could lose writes on one member) stays
open and delivers nothing, while unary calls through that member time out and move to another
(``Etcd._call``). Before this, a broker's view of etcd stayed behind for as long as the member
did: the fault campaign's seed 16 answered ListOffsets 4,000 offsets behind for 7 minutes.

So while a watch runs, every ``interval_s`` its follower reads the cluster's revision (a
linearizable read, which fails over to a healthy member) and asks the watch's stream for a
progress notification (etcd answers a ``WatchProgressRequest`` with its current revision). A
stream that has not heard a revision at least as new as one the cluster had ``bound_s`` ago is
stalled: the watch is re-created on another member, from the last revision it delivered.

The decisions are pure (the clock is passed in); ``wait_for_stall`` runs them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kafscale.broker.metadata.etcd_errors import MetadataError


@dataclass(frozen=True, slots=True)
class Lag:
    """The stream had not heard ``target_revision``, the cluster's revision at ``since_s``."""

    target_revision: int
    since_s: float


def next_lag(
    lag: Lag | None, heard_revision: int, cluster_revision: int, now_s: float
) -> Lag | None:
    """The lag after a check at ``now_s``: an older target not yet heard stays (its age is what
    counts); else a new one if the stream has not heard the cluster's revision yet (the answer
    to the progress request just sent is still on its way), else none."""
    if lag is not None and heard_revision < lag.target_revision:
        return lag
    if heard_revision >= cluster_revision:
        return None
    return Lag(cluster_revision, now_s)


def stalled(lag: Lag | None, now_s: float, bound_s: float) -> bool:
    """Whether the stream has stayed behind one revision of the cluster for ``bound_s``."""
    return lag is not None and now_s - lag.since_s >= bound_s


async def wait_for_stall(
    read_revision: Callable[[], Awaitable[int]],
    request_progress: Callable[[], None],
    heard_revision: Callable[[], int],
    bound_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> Lag:
    """Returns once the stream has stayed behind the cluster for ``bound_s`` (checking every
    half of it); runs until cancelled otherwise. A check etcd cannot answer anywhere decides
    nothing: the stream's own failure tells of that outage."""
    lag: Lag | None = None
    while True:
        await asyncio.sleep(bound_s / 2)
        try:
            current = await read_revision()
        except MetadataError:
            continue
        request_progress()
        lag = next_lag(lag, heard_revision(), current, clock())
        if stalled(lag, clock(), bound_s):
            assert lag is not None
            return lag
