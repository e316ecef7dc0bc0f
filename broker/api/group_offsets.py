"""Committed consumer offsets: OffsetCommit and OffsetFetch.

Offsets are committed through the group's runtime on its coordinator (fenced by generation or
member epoch) and stored in etcd. An offset whose topic was deleted or re-created (another topic
id) reads as none. OffsetFetch v8+ asks for several groups, v9 checks the KIP-848 member epoch,
and ``require_stable`` (KIP-447) answers UNSTABLE_OFFSET_COMMIT while a transaction that
committed an offset is open. When etcd cannot be reached OffsetCommit answers
REQUEST_TIMED_OUT and OffsetFetch COORDINATOR_LOAD_IN_PROGRESS (below).

OffsetFetch at a broker that does not coordinate the group (another broker holds its lease, this
one is draining, stopping, or between two etcd sessions) is answered from etcd, not with
NOT_COORDINATOR: librdkafka (2.16, issue 5586) sends the OffsetFetch of a new assignment to its
logical coordinator and, answered NOT_COORDINATOR (or COORDINATOR_NOT_AVAILABLE) at the group
level, only looks the coordinator up again: it never sends that OffsetFetch again and never
starts those partitions, so the group consumes nothing for good with every partition assigned.
A coordinator move (a group let go and taken by another broker, a drain, ``kafscale local``'s
brokers) reaches it between its FindCoordinator and that OffsetFetch; an ``assign()`` user has
no heartbeat that would ever look again. The read is safe because etcd is where the answer lives:

* a coordinator acks OffsetCommit only after etcd holds the offsets (``GroupOffsets.save``), and
  its own answers come from a cache written after etcd; so an acked commit is seen by every
  broker (etcd reads are linearizable);
* the offsets TxnOffsetCommit adds stay pending in etcd (``txn-offsets/``) until their
  transaction ends, so ``require_stable`` gets UNSTABLE_OFFSET_COMMIT here exactly as at the
  coordinator, which re-reads the same keys before answering (``settle_pending``);
* ACLs are checked as at the coordinator (group DESCRIBE first, then topic DESCRIBE);
* a share group (its record's ``type`` in etcd) is GROUP_ID_NOT_FOUND, and a group whose
  record does not decode UNKNOWN_SERVER_ERROR, logged and counted, as at the coordinator;
* the read takes no lease: the group stays where it is.

The one thing only the coordinator knows is a KIP-848 member's current epoch (it lives in the
coordinator's memory, and etcd's copy may lag it): a v9 request naming a member and its epoch
keeps NOT_COORDINATOR (COORDINATOR_LOAD_IN_PROGRESS between etcd sessions), which the clients
that send one (the Java consumer with ``group.protocol=consumer``) answer by finding the
coordinator and retrying; librdkafka's assignment OffsetFetch names no member (null, epoch -1)
and is answered from etcd. Other group requests keep NOT_COORDINATOR: librdkafka looks the
coordinator up and retries OffsetCommit, and a member's Heartbeat/JoinGroup error makes it look
again.

When etcd cannot be read (at the coordinator, taking the group on or re-reading pending
offsets, or here), OffsetFetch answers COORDINATOR_LOAD_IN_PROGRESS, not
COORDINATOR_NOT_AVAILABLE: librdkafka maps the latter to a coordinator query only, as it does
NOT_COORDINATOR, and strands the assignment the same way (a coordinator move during an etcd
leader election: the broker taking the group over cannot reach etcd for a moment), while it
sends LOAD_IN_PROGRESS again, as every client does, until etcd answers.
"""

from __future__ import annotations

import time
from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.api.group_access import DESCRIBE, READ, coordinator, group_runtime
from kafscale.broker.groups.runtime import GroupRuntime
from kafscale.broker.groups.store import CommittedOffset, LoadedGroup, TopicPartition
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.protocol.errors import (
    CoordinatorBetweenSessions,
    ErrorCode,
    KafkaError,
    NotCoordinator,
)

OFFSET_METADATA_MAX_BYTES = 4096
"""Kafka's ``offset.metadata.max.bytes``."""


async def handle_offset_commit(request: Any, ctx: RequestContext) -> Body:
    access.require(ctx, READ, access.GROUP, request.group_id or "")
    view = ctx.broker.view
    now_ms = int(time.time() * 1000)
    expire_ms = _expire_timestamp_ms(request, ctx.api_version, now_ms)
    results: dict[TopicPartition, ErrorCode] = {}
    valid: dict[TopicPartition, CommittedOffset] = {}
    order: list[tuple[str, list[int]]] = []
    for topic in request.topics:
        indexes = []
        info = view.topics.get(topic.name)
        for p in topic.partitions:
            tp = (str(topic.name), int(p.partition_index))
            indexes.append(tp[1])
            metadata = p.committed_metadata or ""
            if denied := access.topic_denied(ctx, READ, topic.name):
                results[tp] = denied
            elif info is None or not 0 <= tp[1] < info.partitions:
                results[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif len(metadata.encode()) > OFFSET_METADATA_MAX_BYTES:
                results[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                valid[tp] = CommittedOffset(
                    offset=int(p.committed_offset),
                    leader_epoch=int(getattr(p, "committed_leader_epoch", -1)),
                    metadata=metadata,
                    commit_timestamp_ms=now_ms,
                    topic_id=info.topic_id,
                    expire_timestamp_ms=expire_ms,
                )
        order.append((str(topic.name), indexes))
    error = await _commit(request, ctx, valid)
    for tp in valid:
        results[tp] = error
    topics = [
        {
            "name": name,
            "partitions": [{"partition_index": p, "error_code": results[(name, p)]} for p in ps],
        }
        for name, ps in order
    ]
    return {"throttle_time": 0, "topics": topics}


def _expire_timestamp_ms(request: Any, version: int, now_ms: int) -> int:
    """OffsetCommit v2-v4's ``retention_time`` (-1: the broker's offset retention) as the
    offsets' expire timestamp, as Kafka keeps it; -1 when none was asked for."""
    if not 2 <= version <= 4:
        return -1
    retention = getattr(request, "retention_time", None)
    retention_ms = -1 if retention is None else int(retention.total_seconds() * 1000)
    return now_ms + retention_ms if retention_ms >= 0 else -1


async def _commit(
    request: Any, ctx: RequestContext, offsets: dict[TopicPartition, CommittedOffset]
) -> ErrorCode:
    if request.group_id is None:
        return ErrorCode.INVALID_GROUP_ID
    generation = int(getattr(request, "generation_id_or_member_epoch", -1))
    try:
        runtime = await group_runtime(ctx, request.group_id, ErrorCode.REQUEST_TIMED_OUT)
    except KafkaError as exc:
        return exc.code
    return await runtime.commit(
        str(getattr(request, "member_id", "") or ""),
        getattr(request, "group_instance_id", None),
        generation,
        offsets,
        ctx.api_version,
    )


async def handle_offset_fetch(request: Any, ctx: RequestContext) -> Body:
    version = ctx.api_version
    stable = bool(getattr(request, "require_stable", False))
    if version >= 8:
        groups = [
            await _fetch_group(
                ctx,
                str(g.group_id),
                g.topics,
                version,
                (getattr(g, "member_id", None), int(getattr(g, "member_epoch", -1))),
                stable,
            )
            for g in request.groups
        ]
        return {"throttle_time": 0, "groups": groups}
    fetched = await _fetch_group(
        ctx, str(request.group_id), request.topics, version, require_stable=stable
    )
    return {"throttle_time": 0, "topics": fetched["topics"], "error_code": fetched["error_code"]}


async def _settle_pending(
    runtime: GroupRuntime, requested: list[TopicPartition] | None
) -> set[TopicPartition]:
    try:
        return await runtime.settle_pending(requested)
    except MetadataUnavailable as exc:
        raise KafkaError(str(exc), ErrorCode.COORDINATOR_LOAD_IN_PROGRESS) from exc


async def _fetch_group(
    ctx: RequestContext,
    group_id: str,
    topics: Any,
    version: int,
    member: tuple[str | None, int] = (None, -1),
    require_stable: bool = False,
) -> Body:
    """One group's committed offsets; ``member``: (member id, epoch) from v9 (KIP-848);
    ``require_stable``: partitions with an offset pending in a transaction are answered
    UNSTABLE_OFFSET_COMMIT (KIP-447)."""
    requested: list[TopicPartition] | None = None
    denied: dict[TopicPartition, CommittedOffset | None] = {}
    if topics is not None:
        requested = [(str(t.name), int(p)) for t in topics for p in t.partition_indexes]
        denied = dict.fromkeys(tp for tp in requested if not _may_describe(ctx, tp[0]))
        requested = [tp for tp in requested if tp not in denied]
    try:
        committed, unstable = await _committed(ctx, group_id, requested, member)
    except KafkaError as exc:
        code = fetch_error_code(exc)
        if version < 2:
            # v0-1 have no group-level error: every partition carries it.
            partitions = dict.fromkeys(requested or [], None)
            return {
                "group_id": group_id,
                "error_code": code,
                "topics": _fetched_topics(partitions, code),
            }
        return {"group_id": group_id, "error_code": code, "topics": []}
    current = {name: info.topic_id for name, info in ctx.broker.view.topics.items()}
    valid = {
        tp: offset if offset is None or offset.still_valid(current.get(tp[0])) else None
        for tp, offset in committed.items()
    }
    if requested is None:  # all of the group's offsets but of gone or undescribable topics
        valid = {
            tp: offset
            for tp, offset in valid.items()
            if offset is not None and _may_describe(ctx, tp[0])
        }
    # KIP-447: a consumer that asks for stable offsets (read_committed) is told to retry while
    # a transaction that committed an offset for the partition is still open.
    if not require_stable:
        unstable = set()
    unstable_topics = dict.fromkeys(tp for tp in valid if tp in unstable)
    valid = {tp: offset for tp, offset in valid.items() if tp not in unstable}
    return {
        "group_id": group_id,
        "error_code": ErrorCode.NONE,
        "topics": _fetched_topics(valid, ErrorCode.NONE)
        + _fetched_topics(unstable_topics, ErrorCode.UNSTABLE_OFFSET_COMMIT)
        + _fetched_topics(denied, ErrorCode.TOPIC_AUTHORIZATION_FAILED),
    }


Committed = tuple[dict[TopicPartition, CommittedOffset | None], set[TopicPartition]]
"""The committed offsets asked for (None: nothing committed) and those of them pending in an
open transaction."""


async def _committed(
    ctx: RequestContext,
    group_id: str,
    requested: list[TopicPartition] | None,
    member: tuple[str | None, int],
) -> Committed:
    """``requested``'s committed offsets (all when None): from the group's runtime where this
    broker coordinates the group, else from etcd (see the module)."""
    try:
        runtime = await group_runtime(
            ctx, group_id, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, DESCRIBE
        )
        if (member_error := runtime.validate_fetch(*member)) is not ErrorCode.NONE:
            raise KafkaError(f"member {member[0]!r} of group {group_id!r}", member_error)
        unstable = await _settle_pending(runtime, requested)
        return runtime.committed(requested), unstable
    except NotCoordinator as exc:
        if names_member_epoch(*member):
            raise
        return await _stored(ctx, group_id, requested, exc)


async def _stored(
    ctx: RequestContext,
    group_id: str,
    requested: list[TopicPartition] | None,
    not_coordinator: NotCoordinator,
) -> Committed:
    """``requested``'s committed offsets as etcd holds them, at a broker that does not
    coordinate the group; COORDINATOR_LOAD_IN_PROGRESS when etcd cannot be read here. The
    other answers are the coordinator's: a share group has no committed offsets
    (GROUP_ID_NOT_FOUND, Kafka's ``ShareGroup.validateOffsetFetch``; it was answered with
    empty offsets here), and an unreadable group is UNKNOWN_SERVER_ERROR, logged and counted
    (``GroupCoordinator.stored``)."""
    try:
        loaded = await coordinator(ctx).stored(group_id)
    except MetadataUnavailable as exc:
        raise KafkaError(
            f"{not_coordinator}; reading group {group_id!r} from etcd: {exc}",
            ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ) from exc
    if loaded.is_share:
        raise KafkaError(
            f"group {group_id!r} is a share group: it has no committed offsets",
            ErrorCode.GROUP_ID_NOT_FOUND,
        )
    return stored_committed(loaded, requested)


def names_member_epoch(member_id: str | None, member_epoch: int) -> bool:
    """Whether an OffsetFetch (v9+) names a KIP-848 member and its epoch, which only the
    group's coordinator can check (as ``ConsumerGroup.validate_fetch`` skips it otherwise)."""
    return member_id is not None and member_epoch >= 0


def stored_committed(loaded: LoadedGroup, requested: list[TopicPartition] | None) -> Committed:
    """What the coordinator's runtime would answer from ``loaded`` (its offsets cache and
    the pending partitions it re-reads from etcd): ``requested``'s offsets, or all of them
    in key order, and those of them pending in an open transaction."""
    if requested is None:
        return dict(sorted(loaded.offsets.items())), set(loaded.pending)
    return {tp: loaded.offsets.get(tp) for tp in requested}, set(loaded.pending & set(requested))


def fetch_error_code(exc: KafkaError) -> ErrorCode:
    """OffsetFetch's answer to a failure: a broker between etcd sessions is loading the group,
    as far as the client need know (see the module: NOT_COORDINATOR strands librdkafka)."""
    if isinstance(exc, CoordinatorBetweenSessions):
        return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    return exc.code


def _may_describe(ctx: RequestContext, topic: str) -> bool:
    return access.allowed(ctx, DESCRIBE, access.TOPIC, topic)


def _fetched_topics(
    committed: dict[TopicPartition, CommittedOffset | None], error: ErrorCode
) -> list[Body]:
    by_topic: dict[str, list[Body]] = {}
    for (topic, partition), offset in committed.items():
        by_topic.setdefault(topic, []).append(
            {
                "partition_index": partition,
                "committed_offset": offset.offset if offset is not None else -1,
                "committed_leader_epoch": offset.leader_epoch if offset is not None else -1,
                "metadata": offset.metadata if offset is not None else "",
                "error_code": error,
            }
        )
    return [{"name": name, "partitions": partitions} for name, partitions in by_topic.items()]
