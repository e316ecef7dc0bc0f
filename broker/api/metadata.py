"""Metadata, DescribeTopicPartitions and DescribeCluster: what the cluster looks like to a
client. Both topic APIs build their partition entries with ``topic_partitions``, as the proxy
does."""

from __future__ import annotations

import uuid
from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.api.topic_partitions import (
    ClusterLook,
    describe_topic_partitions,
    metadata_topics,
    partition_entry,
)
from kafscale.broker.authz.model import Operation
from kafscale.broker.metadata.cluster import CLUSTER_ID_PREFIX, TopicInfo, TopicPartition
from kafscale.broker.metadata.topics import missing_topic_error
from kafscale.broker.protocol.errors import ErrorCode, KafkaError

DESCRIBE = Operation.DESCRIBE
TOPIC = access.TOPIC


def topic_uuid(info: TopicInfo) -> uuid.UUID:
    return uuid.UUID(hex=info.topic_id)


def broker_entries(ctx: RequestContext) -> list[Body]:
    """The live brokers, this one always among them while it serves, and the recently departed
    (``listed_brokers``), at the addresses of the listener this client came in on."""
    listener = ctx.connection.listener
    entries = []
    for b in ctx.broker.listed_brokers():
        host, port = b.endpoint(listener)
        entries.append({"node_id": b.node_id, "host": host, "port": port, "rack": b.rack})
    return entries


def controller_id(ctx: RequestContext) -> int:
    return ctx.broker.controller_id()


async def handle_metadata(request: Any, ctx: RequestContext) -> Body:
    broker = ctx.broker
    requested = metadata_topics(request.topics, ctx.api_version)
    allow_auto = getattr(request, "allow_auto_topic_creation", True)
    if requested is None:  # every topic the principal may describe
        names = [t for t in sorted(broker.view.topics) if access.allowed(ctx, DESCRIBE, TOPIC, t)]
    else:
        names = [t.name for t in requested if t.name]
        by_id = broker.view.topics_by_id
        for t in requested:
            topic_id = getattr(t, "topic_id", None)
            if not t.name and topic_id is not None and topic_id.hex in by_id:
                names.append(by_id[topic_id.hex].name)
    auto = allow_auto and requested is not None
    with_ops = bool(getattr(request, "include_topic_authorized_operations", False))
    topics = [await _topic_entry(name, auto, with_ops, ctx) for name in names]
    cluster_ops = bool(getattr(request, "include_cluster_authorized_operations", False))
    return {
        "throttle_time": 0,
        "brokers": broker_entries(ctx),
        "cluster_id": CLUSTER_ID_PREFIX + broker.cluster,
        "controller_id": controller_id(ctx),
        "topics": topics,
        "cluster_authorized_operations": access.operations_if_asked(
            ctx, cluster_ops, access.CLUSTER
        ),
    }


async def _topic_entry(
    name: str, allow_auto: bool, with_operations: bool, ctx: RequestContext
) -> Body:
    broker = ctx.broker
    if denied := access.topic_denied(ctx, DESCRIBE, name):
        return {"error_code": denied, "name": name, "partitions": []}
    info = broker.view.topics.get(name)
    if info is None and allow_auto and broker.settings.topics.auto_create_topics:
        if not access.may_create_topic(ctx, name):
            return {
                "error_code": ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                "name": name,
                "partitions": [],
            }
        try:
            info = await broker.auto_create(name)
        except KafkaError as exc:
            return {"error_code": exc.code, "name": name, "partitions": []}
    if info is None:
        return {"error_code": missing_topic_error(name), "name": name, "partitions": []}
    partitions = [
        partition_entry(name, p, broker.leader_for, lambda tp: _leader_epoch(ctx, tp))
        for p in range(info.partitions)
    ]
    return {
        "error_code": ErrorCode.NONE,
        "name": name,
        "topic_id": topic_uuid(info),
        "is_internal": False,
        "partitions": partitions,
        "topic_authorized_operations": access.operations_if_asked(
            ctx, with_operations, TOPIC, name
        ),
    }


def _leader_epoch(ctx: RequestContext, tp: TopicPartition) -> int:
    return ctx.broker.committed_state(tp).leader_epoch


async def handle_describe_topic_partitions(request: Any, ctx: RequestContext) -> Body:
    """KIP-966 (what the Java AdminClient's describeTopics uses from 3.8 when offered): the
    partitions Metadata reports, paged by ``response_partition_limit`` and the cursor."""
    view = ctx.broker.view

    def partition_count(name: str) -> int | None:
        info = view.topics.get(name)
        return None if info is None else info.partitions

    look = ClusterLook(
        all_topics=list(view.topics),
        partition_count=partition_count,
        topic_id_of=lambda name: topic_uuid(view.topics[name]),
        leader_of=ctx.broker.leader_for,
        epoch_of=lambda tp: _leader_epoch(ctx, tp),
        describable=lambda name: access.allowed(ctx, DESCRIBE, TOPIC, name),
        operations_of=lambda name: access.operations_if_asked(ctx, True, TOPIC, name),
    )
    return describe_topic_partitions(request, look)


async def handle_describe_cluster(request: Any, ctx: RequestContext) -> Body:
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "endpoint_type": 1,
        "cluster_id": CLUSTER_ID_PREFIX + ctx.broker.cluster,
        "controller_id": controller_id(ctx),
        "brokers": [
            {"broker_id": b["node_id"], "host": b["host"], "port": b["port"], "rack": b["rack"]}
            for b in broker_entries(ctx)
        ],
        "cluster_authorized_operations": access.operations_if_asked(
            ctx,
            bool(getattr(request, "include_cluster_authorized_operations", False)),
            access.CLUSTER,
        ),
    }
