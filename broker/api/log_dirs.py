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

AlterReplicaLogDirs (34) is not served: there is no directory to move a replica to.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import Body, RequestContext
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


def describe_log_dirs_error_body(_request: Any, code: ErrorCode) -> Body:
    return {"throttle_time": 0, "error_code": code, "results": []}
