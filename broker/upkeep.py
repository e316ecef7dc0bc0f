"""A broker's upkeep: the background tasks that keep the cluster's stored state in shape while
it serves, none of which answers a request.

Retention and DeleteRecords' leftovers (``Janitor``), the log cleaner of compacted topics,
purges of deleted topics' objects, etcd's history compaction, delegation-token expiry, the
assignment writer outside Kubernetes (``Rebalancer``) and the one-off copy of share groups an
older version stored. Each is one object with one loop on an interval from the settings.

They lived in ``app``'s start-up, which made the wiring module longer than reads in one pass
(STYLE: ~600 lines at most) for code that only starts loops; ``app`` keeps what serves
requests and the start-up and shutdown order. The broker owns the tasks returned here: it
cancels and awaits them on shutdown with its others.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kafscale.broker.groups.share_groups_index import index_share_groups
from kafscale.broker.metadata.compaction import Compactor
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_errors import MetadataError
from kafscale.broker.metadata.rebalancer import Rebalancer
from kafscale.broker.observability.retry_log import RetryLog
from kafscale.broker.storage.cleaner import Cleaner
from kafscale.broker.storage.janitor import Janitor
from kafscale.broker.task_stop import start_task

if TYPE_CHECKING:
    from kafscale.broker.app import Broker

log = logging.getLogger(__name__)

SHARE_INDEX_RETRY_S = 5.0


@dataclass(frozen=True, slots=True)
class Upkeep:
    tasks: list[asyncio.Task[None]]
    """Started, owned by the broker from now on (cancelled and awaited at its shutdown)."""
    cleaner: Cleaner | None
    """The log cleaner, when ``log.cleaner_enable``."""


def start_upkeep(broker: Broker) -> Upkeep:
    """Start the upkeep tasks of ``broker``, which has registered and owns a log manager."""
    settings, cluster = broker.settings, broker.cluster
    janitor = Janitor(
        cluster, broker.log_manager, broker.view, broker.store, settings.topic_defaults()
    )
    tasks = [
        start_task(copy_share_groups(broker.etcd, cluster), name="share-index"),
        start_task(janitor.run(settings.log.retention_check_interval_s), name="janitor"),
    ]
    cleaner = None
    if settings.log.cleaner_enable:
        cleaner = Cleaner(
            settings.log,
            cluster,
            broker.log_manager,
            broker.view,
            broker.store,
            broker.cache,
            settings.topic_defaults(),
        )
        tasks.append(start_task(cleaner.run(settings.log.cleaner_interval_s), name="log-cleaner"))
    tasks.append(
        start_task(
            broker.purger.run(broker.node_id, broker.view, settings.log.purge_interval_s),
            name="topic-purge",
        )
    )
    compactor = Compactor(broker.etcd)
    tasks.append(
        start_task(
            compactor.run(
                broker.node_id, broker.view.live_broker_ids, settings.etcd.compaction_interval_s
            ),
            name="etcd-compaction",
        )
    )
    token_settings = settings.delegation_token
    if token_settings.policy().enabled:
        expiry = broker.tokens.run_expiry(
            token_settings.expiry_check_interval_ms / 1000, lambda: int(time.time() * 1000)
        )
        tasks.append(start_task(expiry, name="token-expiry"))
    if settings.assignment.self_assign:
        rebalancer = Rebalancer(broker.etcd, broker.view, cluster, broker.node_id)
        run = rebalancer.run(lambda: broker.session, lambda: broker.cluster_stopping)
        tasks.append(start_task(run, name="rebalancer"))
    return Upkeep(tasks, cleaner)


async def copy_share_groups(etcd: Etcd, cluster: str) -> None:
    """Once per cluster, in the background: copy share groups an older version stored to
    ``share-groups/`` (``share_groups_index``). Not before ready: on a cluster of many
    groups it reads them all, and a start-up probe must not kill the broker meanwhile
    (the copy would start over). Every view, this one's too, sees each copy as a watch
    event; until its copy lands, an older group's members get no records from share
    partitions led by brokers of this version (their ShareFetch answers empty). etcd out of
    reach and etcd refusing (permission denied after a change of roles) are retried alike: a
    refusal ended the copy with a traceback, not to be tried again until a restart."""
    retries = RetryLog(log, "share groups: copying to share-groups/ (retried every 5 s)")
    while True:
        try:
            await index_share_groups(etcd, cluster)
            retries.succeeded()
            return
        except MetadataError as exc:
            retries.failed(exc)
        await asyncio.sleep(SHARE_INDEX_RETRY_S)
