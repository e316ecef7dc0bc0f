"""DescribeLogDirs (API 35): what ``kafka-log-dirs.sh --describe``, the Java Admin's
``describeLogDirs`` / ``describeReplicaLogDirs`` and kafka-python's ``describe_log_dirs`` show.

A broker has no local log directories: its partitions live in the object store. So each broker
reports one "log dir", named after its store (``s3://bucket/prefix``, or the local directory's
absolute path), holding the partitions it currently owns (holds the lease of, leads), each with
its size in bytes (``storage/log_sizes``), offset lag 0 (there are no replicas to lag) and no
future replica. ``topics`` null means every owned partition; partitions of unknown or
unrequested topics are left out, as Kafka leaves them out. v4's total and usable bytes are the
local directory's volume, -1 (unknown) for S3. Kafka requires DESCRIBE on the cluster:
otherwise CLUSTER_AUTHORIZATION_FAILED (v3+) and no results. A store that fails a listing is
reported as Kafka reports an offline log dir: KAFKA_STORAGE_ERROR on the dir.

AlterReplicaLogDirs (34) is answered as Kafka answers it on a broker configured with that one
dir (``ReplicaManager.alterReplicaLogDirs``): checked in Kafka's order, a path other than the
dir's exact name is LOG_DIR_NOT_FOUND (a dir not configured on the broker), an unknown topic or
partition UNKNOWN_TOPIC_OR_PARTITION, a partition the broker does not host REPLICA_NOT_AVAILABLE
(Kafka keeps that code for it "for compatibility"), and a partition it hosts moved to its own
dir NONE: the replica is there already, nothing moves. A broker hosts a partition it owns or
that Metadata names it the leader of (it claims the lease on the first request for it), so an
answer never contradicts the leader a client was just shown. Kafka requires ALTER on the
cluster: otherwise every partition gets CLUSTER_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.api.error_bodies import (
    alter_replica_log_dirs_error_body,
    alter_results_body,
    describe_log_dirs_error_body,
    requested_moves,
)
from kafscale.broker.authz.model import Operation
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.storage.log_sizes import LogSizes, log_dir_name, volume_bytes
from kafscale.broker.storage.object_store import ObjectStoreError
from kafscale.broker.storage.partition_log import OwnedPartition

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


def wanted_partitions(
    owned: list[TopicPartition], requested: dict[str, set[int]] | None
) -> list[TopicPartition]:
    """The owned partitions to describe (``requested`` None: all), sorted."""
    if requested is None:
        return sorted(owned)
    return sorted(tp for tp in owned if tp[1] in requested.get(tp[0], ()))


def requested_partitions(request: Any) -> dict[str, set[int]] | None:
    topics = getattr(request, "topics", None)
    if topics is None:
        return None
    wanted: dict[str, set[int]] = {}
    for topic in topics:
        wanted.setdefault(str(topic.topic), set()).update(int(p) for p in topic.partitions)
    return wanted


def log_dir_topics(sizes: dict[TopicPartition, int]) -> list[Body]:
    """The response's topics: per topic, its partitions with their sizes."""
    by_topic: dict[str, list[Body]] = {}
    for (topic, partition), size in sorted(sizes.items()):
        by_topic.setdefault(topic, []).append(
            {
                "partition_index": partition,
                "partition_size": size,
                "offset_lag": 0,
                "is_future_key": False,
            }
        )
    return [{"name": name, "partitions": parts} for name, parts in by_topic.items()]


async def handle_describe_log_dirs(request: Any, ctx: RequestContext) -> Body:
    if not access.allowed_on_cluster(ctx, Operation.DESCRIBE):
        return describe_log_dirs_error_body(request, ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    broker = ctx.broker
    settings = broker.settings.storage
    total_bytes, usable_bytes = volume_bytes(settings)
    result: Body = {
        "error_code": ErrorCode.NONE,
        "log_dir": log_dir_name(settings),
        "topics": [],
        "total_bytes": total_bytes,
        "usable_bytes": usable_bytes,
    }
    manager, sizes = broker.manager, broker.log_sizes
    if manager is not None and sizes is not None:
        owned = dict(manager.owned)
        sizes.keep_only(owned)
        chosen = wanted_partitions(list(owned), requested_partitions(request))
        try:
            measured = await _sizes(sizes, [owned[tp] for tp in chosen])
        except ObjectStoreError as exc:
            log.warning("DescribeLogDirs: the object store failed: %s", exc)
            result["error_code"] = ErrorCode.KAFKA_STORAGE_ERROR
        else:
            result["topics"] = log_dir_topics(measured)
    return {"throttle_time": 0, "error_code": ErrorCode.NONE, "results": [result]}


async def _sizes(sizes: LogSizes, partitions: list[OwnedPartition]) -> dict[TopicPartition, int]:
    measured = await asyncio.gather(*(sizes.size_of(owned) for owned in partitions))
    return {owned.tp: size for owned, size in zip(partitions, measured, strict=True)}


# --- AlterReplicaLogDirs (34) ------------------------------------------------------------------


def alter_result(
    path: str, dir_name: str, counts: Mapping[str, int], tp: TopicPartition, hosted: bool
) -> ErrorCode:
    """One partition's answer to "move its replica to ``path``" on a broker whose one log dir is
    ``dir_name`` (``counts``: the topics' partition counts)."""
    if path != dir_name:
        return ErrorCode.LOG_DIR_NOT_FOUND
    topic, index = tp
    count = counts.get(topic)
    if count is None or not 0 <= index < count:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if not hosted:
        return ErrorCode.REPLICA_NOT_AVAILABLE
    return ErrorCode.NONE


def alter_replica_log_dirs_body(
    request: Any,
    dir_name: str,
    counts: Mapping[str, int],
    hosts: Callable[[TopicPartition], bool],
) -> Body:
    """Kafka's answer for a broker whose one dir is ``dir_name``: nothing ever moves."""
    moves = requested_moves(request)
    return alter_results_body(
        {tp: alter_result(path, dir_name, counts, tp, hosts(tp)) for tp, path in moves.items()}
    )


async def handle_alter_replica_log_dirs(request: Any, ctx: RequestContext) -> Body:
    if not access.allowed_on_cluster(ctx, Operation.ALTER):
        return alter_replica_log_dirs_error_body(request, ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    broker = ctx.broker
    owned = broker.manager.owned if broker.manager is not None else {}
    counts = {name: info.partitions for name, info in broker.view.topics.items()}

    def hosts(tp: TopicPartition) -> bool:
        return tp in owned or broker.leader_for(tp) == broker.node_id

    return alter_replica_log_dirs_body(
        request, log_dir_name(broker.settings.storage), counts, hosts
    )
