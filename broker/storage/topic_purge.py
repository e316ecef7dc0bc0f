"""Deleting a deleted topic's objects, and finishing the job when the first try could not.

DeleteTopics removes the topic's record from etcd and, in the same transaction, leaves a
tombstone ``deleted-topics/<name>/<topic id>`` (see ``metadata.topics``). The broker that
handled the request deletes the topic's objects at once, retrying for about a minute while the
object store is unreachable, and then removes the tombstone. If that broker stops first, or the
store stays away longer, the tombstone remains: the lowest-numbered live broker looks for
tombstones every ``log.purge_interval_s`` and finishes the job. Two brokers purging the same
topic at once (views differ for a moment) is harmless: deletes are idempotent.

Only a topic with a tombstone is ever purged, never "whatever the bucket holds that etcd does not
know": a broker pointed at an empty or restored etcd, or at the wrong cluster name, must not take
a bucket full of data for garbage.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.cluster import ClusterView
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.observability.retry_log import RetryLog
from kafscale.broker.storage.cache import SegmentCache
from kafscale.broker.storage.object_store import ObjectStore, ObjectStoreError

log = logging.getLogger(__name__)

# The deleting broker's retries while the object store is briefly unreachable (about a minute);
# after that the periodic purge takes over.
RETRY_DELAYS_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)


def is_purger(me: int, live_brokers: Collection[int]) -> bool:
    """The lowest-numbered live broker purges: one broker, chosen without another etcd key."""
    return bool(live_brokers) and min(live_brokers) == me


def parse_tombstone(cluster: str, key: str) -> tuple[str, str] | None:
    """``(topic, topic id)`` of a tombstone key, None for anything else under the prefix."""
    rest = key.removeprefix(keys.deleted_topics_prefix(cluster))
    topic, slash, topic_id = rest.partition("/")
    if rest == key or not slash or not topic or not topic_id or "/" in topic_id:
        return None
    return topic, topic_id


class TopicPurger:
    """Deletes the objects of deleted topics and then their tombstones."""

    def __init__(self, cluster: str, etcd: Etcd, store: ObjectStore, cache: SegmentCache) -> None:
        self._cluster = cluster
        self._etcd = etcd
        self._store = store
        self._cache = cache

    async def purge(self, topic: str, topic_id: str) -> None:
        """Delete the topic's objects, then its tombstone; ObjectStoreError and
        MetadataUnavailable propagate (the tombstone stays for the next try)."""
        prefix = keys.topic_object_prefix(self._cluster, topic, topic_id)
        self._cache.discard_prefix(prefix)
        objects = await self._store.list(prefix)
        if objects:
            await self._store.delete_many([o.key for o in objects])
        await self._etcd.delete(keys.deleted_topic_key(self._cluster, topic, topic_id))
        log.info("deleted %d objects of deleted topic %s (id %s)", len(objects), topic, topic_id)

    async def purge_with_retries(
        self, topic: str, topic_id: str, delays_s: Sequence[float] = RETRY_DELAYS_S
    ) -> None:
        """What the deleting broker runs right after DeleteTopics. Its failures are logged as
        a run (``retry_log``): the first, a summary after 30 s and the recovery, not one line
        each; the ERROR when it gives up to the periodic purge."""
        retries = RetryLog(log, f"deleting the objects of topic {topic}")
        for delay_s in (*delays_s, None):
            try:
                await self.purge(topic, topic_id)
            except (ObjectStoreError, MetadataUnavailable) as exc:
                if delay_s is None:
                    log.error(
                        "deleting the objects of topic %s failed; the periodic purge retries: %s",
                        topic,
                        exc,
                    )
                    return
                retries.failed(f"{exc} (again in {delay_s:.0f} s)")
                await asyncio.sleep(delay_s)
                continue
            retries.succeeded()
            return

    async def purge_leftovers(self) -> dict[str, Exception]:
        """Purge every topic that still has a tombstone; the topics that could not be, with
        why (their tombstones stay for the next run)."""
        entries = await self._etcd.get_prefix(keys.deleted_topics_prefix(self._cluster))
        failed: dict[str, Exception] = {}
        for entry in entries:
            parsed = parse_tombstone(self._cluster, entry.key)
            if parsed is None:
                continue
            try:
                await self.purge(*parsed)
            except (ObjectStoreError, MetadataUnavailable) as exc:
                failed[parsed[0]] = exc
        return failed

    async def run(self, me: int, view: ClusterView, interval_s: float) -> None:
        """Every ``interval_s``, purge leftovers if this broker is the purger; failures while
        etcd or the store stay away are logged once, then summarised (``retry_log``)."""
        retries = RetryLog(log, "purge of deleted topics")
        while True:
            await asyncio.sleep(interval_s)
            if not is_purger(me, view.live_broker_ids()):
                continue
            try:
                failed = await self.purge_leftovers()
            except MetadataUnavailable as exc:
                retries.failed(exc)
                continue
            if failed:
                retries.failed(", ".join(f"{name} skipped: {exc}" for name, exc in failed.items()))
            else:
                retries.succeeded()
