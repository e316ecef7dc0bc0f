"""Following the desired assignment: release what is no longer ours, acquire what is.

The decision (which partitions to release, which to try to acquire) is a pure function of the
view; the follower only carries it out. Releasing flushes first, so a handoff never drops an
acknowledged write; acquiring fails harmlessly while the previous owner still holds the lease,
and is retried on the next change (the lease deletion is such a change).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from kafscale.broker.protocol.errors import KafkaError
from kafscale.broker.storage.log_manager import LogManager

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
MAX_PARALLEL_ACQUIRES = 16


@dataclass(frozen=True, slots=True)
class OwnershipPlan:
    release: list[TopicPartition]
    acquire: list[TopicPartition]


def plan_ownership(
    me: int,
    owned: Collection[TopicPartition],
    desired: Mapping[TopicPartition, int],
    holders: Mapping[TopicPartition, int],
    live: Collection[int],
    draining: bool,
) -> OwnershipPlan:
    if draining:
        return OwnershipPlan(release=sorted(owned), acquire=[])
    release = sorted(
        tp for tp in owned if (want := desired.get(tp)) is not None and want != me and want in live
    )
    acquire = sorted(
        tp
        for tp, want in desired.items()
        if want == me and tp not in owned and holders.get(tp) in (None, me)
    )
    return OwnershipPlan(release=release, acquire=acquire)


async def follow_once(manager: LogManager, plan: OwnershipPlan) -> None:
    await asyncio.gather(*(manager.release(tp) for tp in plan.release))
    limit = asyncio.Semaphore(MAX_PARALLEL_ACQUIRES)

    async def acquire(tp: TopicPartition) -> None:
        async with limit:
            try:
                await manager.owned_partition(tp)
            except KafkaError as exc:
                log.debug("not acquiring %s-%d yet: %s", tp[0], tp[1], exc)

    await asyncio.gather(*(acquire(tp) for tp in plan.acquire))
