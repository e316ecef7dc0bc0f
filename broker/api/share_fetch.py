"""ShareFetch and ShareAcknowledge (KIP-932) on the share-partition leader, which in KafScale
is the partition's owner (the lease holder); any other broker answers NOT_LEADER_OR_FOLLOWER
with the owner as the current leader and its endpoint.

A request runs in three steps: its share session (``share.sessions``: opened with epoch 0,
checked and moved on otherwise, closed with -1), its acknowledgements (applied, then answered
once the flush round carrying them is in etcd), then, unless the session closes, acquisition:
for each partition of the session, records read from the log from the first available offset,
acquired up to what the read returned and the readable end (the last stable offset under
read_committed), control records and aborted transactions archived. A request that acquired
nothing waits (``max_wait``) for a new high watermark or for records to come back.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.api.error_bodies import share_acknowledge_error_body, share_fetch_error_body
from kafscale.broker.authz.model import Operation
from kafscale.broker.groups import group_configs
from kafscale.broker.groups.coordinator import share_config
from kafscale.broker.groups.share import ShareConfig
from kafscale.broker.metadata.cluster import TopicInfo
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.metadata.partition_txns import last_stable_offset
from kafscale.broker.protocol.codec import millis
from kafscale.broker.protocol.errors import ErrorCode, KafkaError, fetch_partition_code
from kafscale.broker.share import batches
from kafscale.broker.share.manager import Entry, OwnerView, ShareManager
from kafscale.broker.share.partition import Acquired, ordered_batches
from kafscale.broker.share.sessions import FINAL_EPOCH, INITIAL_EPOCH, SharePartitionKey

PARTITION_MAX_BYTES = 1024 * 1024
JOIN_GRACE_S = 1.0


@dataclass(slots=True)
class _Partition:
    topic_id: uuid.UUID
    index: int
    info: TopicInfo | None
    error: ErrorCode = ErrorCode.NONE
    ack_error: ErrorCode = ErrorCode.NONE
    records: bytes = b""
    acquired: list[Acquired] = field(default_factory=list)
    acked: bool = False


def _manager(ctx: RequestContext) -> ShareManager:
    manager = ctx.broker.share
    if manager is None:
        raise KafkaError("share groups are not served yet", ErrorCode.COORDINATOR_NOT_AVAILABLE)
    return manager


def _session_owner(ctx: RequestContext) -> object | None:
    """The connection whose closing ends the member's session: the client's own, or, for a
    request a proxy forwarded in an Envelope, the proxy's connection it came over (one per
    client connection, closed with it)."""
    connection = ctx.connection
    return None if connection is None else connection.session_owner


def _share_config(ctx: RequestContext, group: str) -> ShareConfig:
    own = ctx.broker.view.group_configs.get(group, {})
    return group_configs.share_config(share_config(ctx.broker.settings.groups), own)


def _resolve(ctx: RequestContext, topic_id: uuid.UUID | None, index: int) -> _Partition:
    topic_id = topic_id or uuid.UUID(int=0)
    info = ctx.broker.view.topics_by_id.get(topic_id.hex)
    part = _Partition(topic_id, index, info)
    if info is None or not 0 <= index < info.partitions:
        part.error = ErrorCode.UNKNOWN_TOPIC_ID
    elif (denied := access.topic_denied(ctx, Operation.READ, info.name)) is not None:
        part.error = denied
    return part


async def _entry(ctx: RequestContext, group: str, part: _Partition) -> Entry | None:
    """The share-partition if this broker owns the partition; else the partition's error."""
    if part.error is not ErrorCode.NONE or part.info is None:
        return None
    owned = ctx.broker.log_manager.owned.get((part.info.name, part.index))
    if owned is None or not owned.accepting or owned.topic_id != part.info.topic_id:
        part.error = ErrorCode.NOT_LEADER_OR_FOLLOWER
        return None
    owner = OwnerView(
        owned.topic_id,
        owned.lease_revision,
        owned.state.log_start_offset,
        owned.state.high_watermark,
    )
    try:
        return await _manager(ctx).entry(
            (group, part.info.name, part.index), owner, _share_config(ctx, group)
        )
    except KafkaError as exc:
        part.error = exc.code
    except MetadataUnavailable:  # etcd unreachable while loading the state
        part.error = ErrorCode.REQUEST_TIMED_OUT
    return None


# --- acknowledgements -------------------------------------------------------------------------


async def _acknowledge(
    ctx: RequestContext, group: str, member: str, parts: list[tuple[_Partition, Any]]
) -> None:
    """Apply each partition's acknowledgement batches, then wait until they are durable."""
    manager = _manager(ctx)
    applied: list[tuple[_Partition, Entry, int]] = []
    for part, ack_batches in parts:
        entry = await _entry(ctx, group, part)
        if entry is None:
            part.ack_error = part.error
            continue
        ranges = [(int(b.first_offset), int(b.last_offset)) for b in ack_batches]
        if not ordered_batches(ranges):
            part.ack_error = ErrorCode.INVALID_REQUEST
            continue
        async with entry.lock:
            now = manager.now_ms()
            for batch in ack_batches:
                code = entry.state.acknowledge(
                    member,
                    int(batch.first_offset),
                    int(batch.last_offset),
                    [int(t) for t in batch.acknowledge_types],
                    now,
                    entry.limits,
                )
                if code is not ErrorCode.NONE:
                    part.ack_error = code
            version = entry.touch()
        part.acked = True
        applied.append((part, entry, version))
    if not applied:
        return
    manager.notify()
    durable = await manager.durable([(entry, version) for _, entry, version in applied])
    for part, entry, version in applied:
        if part.ack_error is ErrorCode.NONE and entry.stored < version:
            part.ack_error = ErrorCode.NOT_LEADER_OR_FOLLOWER if entry.dropped else durable


# --- acquisition ------------------------------------------------------------------------------


async def _acquire(
    ctx: RequestContext, group: str, member: str, part: _Partition, max_records: int
) -> None:
    entry = await _entry(ctx, group, part)
    if entry is None or part.info is None:
        return
    info = part.info
    config = _share_config(ctx, group)
    reader = ctx.broker.reader
    manager = _manager(ctx)
    async with entry.lock:
        for _ in range(3):  # control records alone may be all a read finds: look on
            state = ctx.broker.committed_state((info.name, part.index))
            end = last_stable_offset(state) if config.read_committed else state.high_watermark
            start = entry.state.first_available(end, entry.limits)
            if start is None:
                return
            try:
                data = await reader.read(
                    info.name, info.topic_id, part.index, state, start, PARTITION_MAX_BYTES
                )
            except KafkaError as exc:
                part.error = exc.code
                return
            last = batches.covered_last(data)
            if last is None:
                return
            last = min(last, end - 1)
            aborted: list[tuple[int, int]] = []
            if config.read_committed:
                found = await reader.aborted_in_range(
                    info.name, info.topic_id, part.index, state, start, last + 1
                )
                aborted = [(a.producer_id, a.first_offset) for a in found]
            skip = batches.skipped(data, aborted, config.read_committed)
            if not ctx.broker.view.share_members.has(group, member):
                return  # it left while the log was read: its records were released already
            before = (entry.state.start_offset, entry.state.next_offset)
            ends = batches.batch_ends(data)
            acquired = entry.state.acquire(
                member, start, last, max_records, manager.now_ms(), entry.limits, skip, ends
            )
            if acquired or before != (entry.state.start_offset, entry.state.next_offset):
                entry.dirty = True
            if acquired:
                part.acquired = acquired
                part.records = batches.overlapping(data, acquired)
                return


async def _acquire_all(
    ctx: RequestContext, group: str, member: str, parts: list[_Partition], max_records: int
) -> int:
    left = max_records
    for part in parts:
        if left <= 0:
            break
        await _acquire(ctx, group, member, part, left)
        left -= sum(a.last - a.first + 1 for a in part.acquired)
    return max_records - left


async def _wait(ctx: RequestContext, parts: list[_Partition], timeout_s: float) -> None:
    events = [ctx.broker.view.watermarks.event((p.info.name, p.index)) for p in parts if p.info]
    events.append(_manager(ctx).changed())
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)


# --- ShareFetch -------------------------------------------------------------------------------


def _invalid(request: Any) -> tuple[ErrorCode, str] | None:
    if not request.group_id:
        return ErrorCode.INVALID_GROUP_ID, "group id can't be empty"
    if not request.member_id:
        return ErrorCode.INVALID_REQUEST, "member id can't be empty"
    return None


async def handle_share_fetch(request: Any, ctx: RequestContext) -> Body:
    if (problem := _invalid(request)) is not None:
        return share_fetch_error_body(request, problem[0], problem[1])
    group, member = str(request.group_id), str(request.member_id)
    access.require(ctx, Operation.READ, access.GROUP, group)
    manager = _manager(ctx)
    epoch = int(request.share_session_epoch)
    named = [
        (_resolve(ctx, t.topic_id, int(p.partition_index)), p.acknowledgement_batches)
        for t in request.topics
        for p in t.partitions
    ]
    acks = [(part, batches_) for part, batches_ in named if batches_]
    if epoch == INITIAL_EPOCH and acks:
        message = "acknowledgements on the request that opens a share session"
        return share_fetch_error_body(request, ErrorCode.INVALID_REQUEST, message)
    key = (group, member)
    if epoch == FINAL_EPOCH:
        error, session = manager.sessions.check(key, _expected(manager, key))
        if session is None:
            return share_fetch_error_body(request, error)
        await _acknowledge(ctx, group, member, acks)
        manager.sessions.close(key)
        manager.release(group, member)
        return _fetch_body(ctx, [part for part, _ in acks], 0)
    # Only partitions that exist and may be read join the session (as in Kafka): an unknown
    # topic id is answered once, not carried (and grown) in the session for every fetch.
    added: list[SharePartitionKey] = [
        (p.topic_id.hex, p.index) for p, _ in named if p.error is ErrorCode.NONE
    ]
    forgotten = [
        ((t.topic_id or uuid.UUID(int=0)).hex, int(i))
        for t in request.forgotten_topics_data
        for i in t.partitions
    ]
    if epoch == INITIAL_EPOCH and not await _is_member(ctx, group, member):
        message = f"member {member} is not in share group {group}"
        return share_fetch_error_body(request, ErrorCode.UNKNOWN_MEMBER_ID, message)
    error, session = manager.sessions.open_or_advance(
        key, epoch, added, forgotten, _session_owner(ctx)
    )
    if session is None:
        return share_fetch_error_body(request, error)
    if epoch == INITIAL_EPOCH:
        await _revalidate(ctx, group, [part for part, _ in named])
    await _acknowledge(ctx, group, member, acks)
    by_key = {(p.topic_id.hex, p.index): p for p, _ in named}
    parts = [
        by_key.get(k) or _resolve(ctx, uuid.UUID(hex=k[0]), k[1])
        for k in sorted(session.partitions)
    ]
    # Named but not fetched: unknown, denied, or forgotten (its acknowledgements still count,
    # but nothing is acquired for a partition the member said it no longer fetches).
    answered_only = [p for p, _ in named if (p.topic_id.hex, p.index) not in session.partitions]
    for gone in [p for p in parts if p.error is ErrorCode.UNKNOWN_TOPIC_ID]:
        session.partitions.discard((gone.topic_id.hex, gone.index))  # its topic was deleted
    max_records = max(int(request.max_records), 1)
    deadline = time.monotonic() + millis(request.max_wait) / 1000
    while True:
        changed = manager.changed()
        got = await _acquire_all(ctx, group, member, parts, max_records)
        remaining = deadline - time.monotonic()
        errors = any(p.error is not ErrorCode.NONE for p in parts + answered_only)
        if got or remaining <= 0 or errors:
            break
        if changed.is_set():
            continue
        await _wait(ctx, parts, remaining)
    lock_ms = _share_config(ctx, group).record_lock_duration_ms
    return _fetch_body(ctx, parts + answered_only, lock_ms)


async def _is_member(ctx: RequestContext, group: str, member: str) -> bool:
    """Whether ``member`` is in ``group``: a share session is opened only for a member of the
    group, so made-up member ids neither take this broker's sessions nor acquire records.
    The cluster watch answers without an etcd read. A member's first ShareFetch may overtake
    the watch event of its own join: it is given up to ``JOIN_GRACE_S`` for that event, then
    etcd is read once (a loaded broker's watch can lag longer; the coordinator wrote the join
    before answering the heartbeat, so etcd has it). Only ids still unknown cost that read."""
    if await ctx.broker.view.share_members.wait_for(group, member, JOIN_GRACE_S):
        return True
    try:
        return await _manager(ctx).member_stored(group, member)
    except MetadataUnavailable:
        return False


async def _revalidate(ctx: RequestContext, group: str, parts: list[_Partition]) -> None:
    """A member opening its session: share-partitions whose stored state an admin changed
    since this broker read it are read again."""
    manager = _manager(ctx)
    for part in parts:
        if part.info is not None and part.error is ErrorCode.NONE:
            try:
                await manager.revalidate((group, part.info.name, part.index))
            except MetadataUnavailable:  # the flush round's revision check still holds
                part.error = ErrorCode.REQUEST_TIMED_OUT


def _expected(manager: ShareManager, key: tuple[str, str]) -> int:
    """A final request (-1) closes the session whatever epoch it is at."""
    session = manager.sessions.sessions.get(key)
    return session.epoch if session is not None else -2


def _leader(ctx: RequestContext, part: _Partition) -> tuple[int, int]:
    if part.info is None:
        return -1, -1
    tp = (part.info.name, part.index)
    leader = ctx.broker.leader_for(tp)
    return leader, ctx.broker.committed_state(tp).leader_epoch


def _endpoints(ctx: RequestContext, parts: list[_Partition]) -> list[Body]:
    wanted = {_leader(ctx, p)[0] for p in parts if p.error is ErrorCode.NOT_LEADER_OR_FOLLOWER}
    endpoints = []
    for node_id in sorted(wanted):
        info = ctx.broker.view.brokers.get(node_id)
        if info is not None:
            endpoints.append(
                {"node_id": node_id, "host": info.host, "port": info.port, "rack": info.rack}
            )
    return endpoints


def _fetch_body(ctx: RequestContext, parts: list[_Partition], lock_ms: int) -> Body:
    """The ShareFetch answer. A partition's code is one the Java share consumer handles
    (``fetch_partition_code``): its ShareFetchCollector throws IllegalStateException out of
    poll() on others, e.g. REQUEST_TIMED_OUT when etcd did not answer the state's load. The
    acknowledgement's code is another field, read by the client's acknowledgement path. NONE,
    the common answer, needs no mapping."""
    topics: dict[uuid.UUID, list[Body]] = {}
    for part in parts:
        leader, epoch = _leader(ctx, part)
        topics.setdefault(part.topic_id, []).append(
            {
                "partition_index": part.index,
                "error_code": fetch_partition_code(part.error) if part.error else part.error,
                "error_message": None,
                "acknowledge_error_code": part.ack_error,
                "acknowledge_error_message": None,
                "current_leader": {"leader_id": leader, "leader_epoch": epoch},
                "records": part.records,
                "acquired_records": [
                    {
                        "first_offset": a.first,
                        "last_offset": a.last,
                        "delivery_count": a.delivery_count,
                    }
                    for a in part.acquired
                ],
            }
        )
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "acquisition_lock_timeout": lock_ms,
        "responses": [{"topic_id": t, "partitions": ps} for t, ps in topics.items()],
        "node_endpoints": _endpoints(ctx, parts),
    }


# --- ShareAcknowledge -------------------------------------------------------------------------


async def handle_share_acknowledge(request: Any, ctx: RequestContext) -> Body:
    if (problem := _invalid(request)) is not None:
        return share_acknowledge_error_body(request, problem[0], problem[1])
    group, member = str(request.group_id), str(request.member_id)
    access.require(ctx, Operation.READ, access.GROUP, group)
    manager = _manager(ctx)
    epoch = int(request.share_session_epoch)
    key = (group, member)
    if epoch == INITIAL_EPOCH:
        message = "ShareAcknowledge cannot open a share session"
        return share_acknowledge_error_body(request, ErrorCode.INVALID_SHARE_SESSION_EPOCH, message)
    if epoch == FINAL_EPOCH:
        error, session = manager.sessions.check(key, _expected(manager, key))
    else:
        error, session = manager.sessions.open_or_advance(key, epoch, (), (), _session_owner(ctx))
    if session is None:
        return share_acknowledge_error_body(request, error)
    acks = [
        (_resolve(ctx, t.topic_id, int(p.partition_index)), p.acknowledgement_batches)
        for t in request.topics
        for p in t.partitions
    ]
    await _acknowledge(ctx, group, member, acks)
    if epoch == FINAL_EPOCH:
        manager.sessions.close(key)
        manager.release(group, member)
    topics: dict[uuid.UUID, list[Body]] = {}
    for part, _ in acks:
        leader, leader_epoch = _leader(ctx, part)
        topics.setdefault(part.topic_id, []).append(
            {
                "partition_index": part.index,
                "error_code": part.ack_error,
                "error_message": None,
                "current_leader": {"leader_id": leader, "leader_epoch": leader_epoch},
            }
        )
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "acquisition_lock_timeout": _share_config(ctx, group).record_lock_duration_ms,
        "responses": [{"topic_id": t, "partitions": ps} for t, ps in topics.items()],
        "node_endpoints": _endpoints(ctx, [p for p, _ in acks]),
    }
