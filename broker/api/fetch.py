"""Fetch: committed data from any broker, long-polling on high-watermark changes; incremental
fetch sessions as ``fetch_sessions`` decides.

``isolation_level`` 1 (read_committed) reads only below the last stable offset (the first
offset of the oldest open transaction) and lists the aborted transactions overlapping what it
returns, so that clients drop their records; every answer carries the partition's LSO."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.configs import FETCH_MAX_BYTES
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.api.error_bodies import fetch_error_body
from kafscale.broker.api.fetch_sessions import (
    FetchContext,
    FetchPosition,
    PartitionKey,
    PartitionResult,
)
from kafscale.broker.authz.model import Operation
from kafscale.broker.metadata.cluster import TopicInfo
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.metadata.partition_state import PartitionState
from kafscale.broker.metadata.partition_txns import last_stable_offset
from kafscale.broker.observability.metrics import METRICS
from kafscale.broker.protocol import legacy_messages
from kafscale.broker.protocol.codec import millis
from kafscale.broker.protocol.errors import (
    ErrorCode,
    KafkaError,
    ObjectGone,
    fetch_partition_code,
)
from kafscale.broker.protocol.record_batch import batches_below, next_offset_after

TopicPartition = tuple[str, int]
FIRST_RECORD_BATCH_VERSION = 4  # Fetch v0-v3 read message sets (message format v0/v1)
READ_COMMITTED = 1


@dataclass(slots=True)
class _Wanted:
    key: Any  # the topic name (v4-v12) or topic id (v13+) as the client sent it
    info: TopicInfo | None
    partition: int
    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int
    read_committed: bool = False


async def handle_fetch(request: Any, ctx: RequestContext) -> Body:
    requested = _requested(request)
    context = _context(request, requested, ctx)
    if isinstance(context, ErrorCode):
        return fetch_error_body(request, context)
    wanted = _resolve(context.partitions(requested), ctx, _read_committed(request))
    max_wait_s = millis(request.max_wait) / 1000
    deadline = time.monotonic() + max_wait_s
    min_bytes = int(request.min_bytes)
    total_max = int(getattr(request, "max_bytes", 0x7FFFFFFF))
    refreshed = False
    while True:
        events = [
            ctx.broker.view.watermarks.event((w.info.name, w.partition))
            for w in wanted
            if w.info is not None
        ]
        results = await _read_all(wanted, ctx, total_max, deadline, refresh=not refreshed)
        refreshed = True
        size = sum(len(r.get("records") or b"") for r in results)
        errors = any(r["error_code"] != ErrorCode.NONE for r in results)
        remaining = deadline - time.monotonic()
        if size >= min_bytes or errors or remaining <= 0 or not events:
            if context.overtaken:
                return fetch_error_body(request, ErrorCode.INVALID_FETCH_SESSION_EPOCH)
            _count_fetched(wanted, results)
            return _body(wanted, results, context, ctx.api_version)
        await _wait_any(events, remaining)


def _count_fetched(wanted: list[_Wanted], results: list[Body]) -> None:
    for item, result in zip(wanted, results, strict=True):
        if item.info is not None:
            METRICS.fetched(item.info.name, result.get("records") or b"")


def _topic_key(topic: Any) -> Any:
    """How the client names a topic: by name (v4-v12) or by id (v13+; kio reads the all-zero
    id as None)."""
    if hasattr(topic, "topic"):
        return topic.topic
    return topic.topic_id or uuid.UUID(int=0)


def _requested(request: Any) -> list[tuple[PartitionKey, FetchPosition]]:
    return [
        (
            (_topic_key(topic), int(p.partition)),
            FetchPosition(
                int(p.fetch_offset),
                int(p.partition_max_bytes),
                int(getattr(p, "current_leader_epoch", -1)),
            ),
        )
        for topic in request.topics
        for p in topic.partitions
    ]


def _context(
    request: Any, requested: list[tuple[PartitionKey, FetchPosition]], ctx: RequestContext
) -> FetchContext | ErrorCode:
    if not hasattr(request, "session_epoch"):  # v4-v6: no sessions
        return FetchContext(None, incremental=False)
    forgotten = [
        (_topic_key(topic), int(partition))
        for topic in request.forgotten_topics_data
        for partition in topic.partitions
    ]
    return ctx.broker.fetch_sessions.context(
        int(request.session_id), int(request.session_epoch), requested, forgotten
    )


def _read_committed(request: Any) -> bool:
    """isolation_level 1 (v4+): only records below the last stable offset."""
    return int(getattr(request, "isolation_level", 0)) == READ_COMMITTED


def _resolve(
    partitions: list[tuple[PartitionKey, FetchPosition]],
    ctx: RequestContext,
    read_committed: bool,
) -> list[_Wanted]:
    view = ctx.broker.view
    by_id: dict[str, TopicInfo] | None = None  # built only for v13+, which names topics by id
    wanted = []
    for (key, partition), position in partitions:
        if isinstance(key, uuid.UUID):
            by_id = view.topics_by_id if by_id is None else by_id
            info = by_id.get(key.hex)
        else:
            info = view.topics.get(key)
        wanted.append(
            _Wanted(
                key,
                info,
                partition,
                position.fetch_offset,
                position.max_bytes,
                position.current_leader_epoch,
                read_committed,
            )
        )
    return wanted


async def _read_all(
    wanted: list[_Wanted], ctx: RequestContext, total_max: int, deadline: float, refresh: bool
) -> list[Body]:
    """Kafka's limits: the response holds at most ``total_max`` bytes of records, filled in
    request order; only the first partition with data may go beyond, by its first batch.
    Past ``deadline`` (the request's ``max_wait``) each partition's read stops at what it holds
    (``LogReader.read``): the answer is due, and every answer behind it on the connection.

    Each read is given what the response has left before it starts, so what a request holds
    follows its ``max_bytes`` (capped at ``FETCH_MAX_BYTES``), not the sum of its partition
    limits. Until a partition gives records, partitions are read one at a time (each may be
    the first with data); then in groups whose limits together fit in what is left, each read
    counted as at least a segment (it may GET one whole), so a request naming many partitions
    with tiny limits does not read thousands of segments at once.
    """
    prepared = list(await asyncio.gather(*(_prepare(item, ctx, refresh) for item in wanted)))
    results: list[Body] = [body for _, body in prepared]
    budget = min(total_max, FETCH_MAX_BYTES)
    index = 0
    while index < len(wanted) and not any(r.get("records") for r in results[:index]):
        state = prepared[index][0]
        if state is not None:
            await _read_into(
                results[index], wanted[index], state, ctx, budget, deadline, min_one=True
            )
            budget -= len(results[index]["records"])
        index += 1
    # A read may GET a whole segment beyond its share: count it at least a segment's size.
    floor = ctx.broker.settings.log.segment_bytes
    while index < len(wanted):
        group: list[tuple[int, int]] = []
        allotted = cost = 0
        while index < len(wanted) and (not group or cost < budget):
            share = max(0, min(wanted[index].max_bytes, budget - allotted))
            group.append((index, share))
            allotted += share
            cost += max(share, floor) if prepared[index][0] is not None and share else 0
            index += 1
        reads = [
            _read_into(results[i], wanted[i], state, ctx, share, deadline, min_one=False)
            for i, share in group
            if (state := prepared[i][0]) is not None and share > 0
        ]
        await asyncio.gather(*reads)
        budget -= sum(len(results[i]["records"]) for i, _ in group)
    return results


async def _prepare(
    item: _Wanted, ctx: RequestContext, refresh: bool
) -> tuple[PartitionState | None, Body]:
    """(the partition's committed state, or None if there is nothing to read; its response
    entry without records)."""
    broker = ctx.broker
    info = item.info
    name = info.name if info is not None else item.key
    if isinstance(name, str) and (denied := access.topic_denied(ctx, Operation.READ, name)):
        return None, _partition_body(item.partition, denied, -1, -1)
    if info is not None and not _still_there(info, ctx):
        info = None  # deleted while the fetch waited: not an offset out of range
    if info is None or not 0 <= item.partition < info.partitions:
        code = (
            ErrorCode.UNKNOWN_TOPIC_ID
            if isinstance(item.key, uuid.UUID)
            else (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        )
        return None, _partition_body(item.partition, code, -1, -1)
    tp = (info.name, item.partition)
    if broker.suspended_owner(tp):  # served again once its session resumes (app.py)
        return None, _partition_body(item.partition, ErrorCode.NOT_LEADER_OR_FOLLOWER, -1, -1)
    try:
        state = broker.committed_state(tp)
        if refresh and item.fetch_offset >= _readable_end(state, item.read_committed):
            state = await broker.fresh_state(tp)
    except KafkaError as exc:
        return None, _partition_body(item.partition, exc.code, -1, -1)
    except MetadataUnavailable:  # a non-owner's read of etcd: the log's state is not here now
        return None, _partition_body(item.partition, ErrorCode.KAFKA_STORAGE_ERROR, -1, -1)
    epoch_error = _check_epoch(item.current_leader_epoch, state.leader_epoch)
    body = _partition_body(
        item.partition, epoch_error or ErrorCode.NONE, state.high_watermark, state.log_start_offset
    )
    body["last_stable_offset"] = last_stable_offset(state)
    end = _readable_end(state, item.read_committed)
    if epoch_error is not None or item.fetch_offset == state.high_watermark:
        return None, body
    if end <= item.fetch_offset <= state.high_watermark:
        return None, body  # read_committed at the LSO: nothing decided to give yet
    return state, body


def _readable_end(state: PartitionState, read_committed: bool) -> int:
    return last_stable_offset(state) if read_committed else state.high_watermark


def _still_there(info: TopicInfo, ctx: RequestContext) -> bool:
    """Whether the topic a fetch resolved is still the one by that name: a long-poll outlives
    a DeleteTopics, and the deleted topic's partitions then look empty, which answered a
    consumer's position with OFFSET_OUT_OF_RANGE (it reset its offsets) instead of the
    unknown topic it now is."""
    current = ctx.broker.view.topics.get(info.name)
    return current is not None and current.topic_id == info.topic_id


async def _read_into(
    body: Body,
    item: _Wanted,
    state: PartitionState,
    ctx: RequestContext,
    budget: int,
    deadline: float,
    min_one: bool,
) -> None:
    """Fill ``body``'s records from ``state`` with at most ``budget`` bytes (``min_one``: at
    least one batch), or set its error."""
    max_bytes = min(item.max_bytes, budget)
    if (max_bytes <= 0 and not min_one) or item.info is None:
        return
    try:
        records, state = await _read_records(
            item, item.info, state, ctx, max(max_bytes, 0), min_one, deadline
        )
    except KafkaError as exc:
        body["error_code"] = exc.code
        return
    body["high_watermark"], body["log_start_offset"] = state.high_watermark, state.log_start_offset
    body["last_stable_offset"] = last_stable_offset(state)
    if item.read_committed:
        try:
            records = await _committed_part(body, item, state, records, ctx)
        except KafkaError as exc:
            body["error_code"] = exc.code
            return
    if ctx.api_version < FIRST_RECORD_BATCH_VERSION and records:
        magic = legacy_messages.legacy_magic(ctx.api_version)
        records = legacy_messages.down_convert(records, magic, item.fetch_offset, max_bytes)
    body["records"] = records


async def _read_records(
    item: _Wanted,
    info: TopicInfo,
    state: PartitionState,
    ctx: RequestContext,
    max_bytes: int,
    min_one: bool,
    deadline: float | None = None,
) -> tuple[bytes, PartitionState]:
    """The records from ``state`` (and the state read from): if an object it located was
    deleted meanwhile (a compaction pass or retention committed since and its delete ran),
    once more from the committed state read again."""
    reader = ctx.broker.reader
    where = (info.name, info.topic_id, item.partition)
    try:
        records = await reader.read(
            *where, state, item.fetch_offset, max_bytes, min_one=min_one, deadline=deadline
        )
        return records, state
    except ObjectGone:
        fresh = await ctx.broker.fresh_state((info.name, item.partition))
        if (fresh.cleaned, fresh.log_start_offset) == (state.cleaned, state.log_start_offset):
            raise
    records = await reader.read(
        *where, fresh, item.fetch_offset, max_bytes, min_one=min_one, deadline=deadline
    )
    return records, fresh


async def _committed_part(
    body: Body, item: _Wanted, state: PartitionState, records: bytes, ctx: RequestContext
) -> bytes:
    """The batches below the last stable offset (a batch never straddles it: an open
    transaction starts at a batch), and in ``body`` every aborted transaction they overlap
    (older ones from the index objects the state spilled them to)."""
    kept = batches_below(records, last_stable_offset(state))
    end = next_offset_after(kept, item.fetch_offset)
    assert item.info is not None  # checked by the caller
    aborted = await ctx.broker.reader.aborted_in_range(
        item.info.name, item.info.topic_id, item.partition, state, item.fetch_offset, end
    )
    body["aborted_transactions"] = [
        {"producer_id": txn.producer_id, "first_offset": txn.first_offset} for txn in aborted
    ]
    return kept


def _check_epoch(client_epoch: int, known_epoch: int) -> ErrorCode | None:
    if client_epoch < 0 or known_epoch < 0:
        return None
    if client_epoch > known_epoch:
        return ErrorCode.UNKNOWN_LEADER_EPOCH
    if client_epoch < known_epoch:
        return ErrorCode.FENCED_LEADER_EPOCH
    return None


def _partition_body(partition: int, code: ErrorCode, high_watermark: int, log_start: int) -> Body:
    return {
        "partition_index": partition,
        "error_code": code,
        "high_watermark": high_watermark,
        "last_stable_offset": high_watermark,
        "log_start_offset": log_start,
        "aborted_transactions": [],
        "preferred_read_replica": -1,
        "records": b"",
    }


def _body(wanted: list[_Wanted], results: list[Body], context: FetchContext, version: int) -> Body:
    """The response: every partition read, or of an incremental session's only the ones that
    changed (``FetchContext.respond``). Each partition's code is one consumers of ``version``
    handle (``fetch_partition_code``): the Java consumer throws out of poll() on any other.
    NONE (0), nearly every partition of nearly every answer, is one already: only the others
    take the enum and the mapping, which stays the safety net for a code no one mapped."""
    for result in results:
        code = result["error_code"]
        if code:
            result["error_code"] = fetch_partition_code(ErrorCode(code), version)
    chosen = context.respond(
        [
            (
                (item.key, item.partition),
                PartitionResult(
                    int(result["error_code"]),
                    int(result["high_watermark"]),
                    int(result["log_start_offset"]),
                    bool(result.get("records")),
                ),
            )
            for item, result in zip(wanted, results, strict=True)
        ]
    )
    topics: dict[Any, list[Body]] = {}
    for item, result, send in zip(wanted, results, chosen, strict=True):
        if send:
            topics.setdefault(item.key, []).append(result)
    responses = []
    for key, partitions in topics.items():
        entry: Body = {"partitions": partitions}
        if isinstance(key, uuid.UUID):
            entry["topic_id"] = key
        else:
            entry["topic"] = key
        responses.append(entry)
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.NONE,
        "session_id": context.session_id,
        "responses": responses,
    }


async def _wait_any(events: list[asyncio.Event], timeout_s: float) -> None:
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
