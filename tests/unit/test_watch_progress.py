"""When a watch that stays open counts as stalled (``watch_progress``): behind one revision the
cluster had for the whole bound, never merely because the cluster moved since the last ask."""

from __future__ import annotations

import asyncio

import pytest

from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.metadata.watch_progress import Lag, next_lag, stalled, wait_for_stall

pytestmark = pytest.mark.unit


def test_a_stream_that_has_heard_the_cluster_revision_is_not_behind() -> None:
    assert next_lag(None, heard_revision=10, cluster_revision=10, now_s=0.0) is None


def test_the_oldest_unheard_revision_keeps_its_age() -> None:
    lag = next_lag(None, heard_revision=5, cluster_revision=10, now_s=1.0)
    assert lag == Lag(10, 1.0)
    later = next_lag(lag, heard_revision=9, cluster_revision=20, now_s=3.0)
    assert later == Lag(10, 1.0)
    assert stalled(later, now_s=3.0, bound_s=2.0)


def test_a_stream_that_keeps_up_with_a_busy_cluster_never_stalls() -> None:
    """Each check finds newer writes, but the answer to the previous ask always came."""
    lag = None
    for tick in range(1, 20):
        heard = (tick - 1) * 100  # the progress answer to the previous check's ask
        lag = next_lag(lag, heard_revision=heard, cluster_revision=tick * 100, now_s=float(tick))
        assert not stalled(lag, now_s=float(tick), bound_s=2.0)


def test_a_silent_stream_is_found_stalled_and_an_unreachable_etcd_decides_nothing() -> None:
    now = [0.0]
    answers: list[int | Exception] = [MetadataUnavailable("down"), 10, 11, 12]
    asks: list[int] = []

    async def read_revision() -> int:
        now[0] += 1.0
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def run() -> Lag:
        return await wait_for_stall(
            read_revision, lambda: asks.append(1), lambda: 5, bound_s=0.02, clock=lambda: now[0]
        )

    lag = asyncio.run(asyncio.wait_for(run(), 10))
    assert lag == Lag(10, 2.0)
    assert len(asks) == 2  # asked after each answered read, not after the failed one
