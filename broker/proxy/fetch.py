"""Fetch through the proxy: split by owner, long-poll on the proxy's own watch, merge.

Upstream fetches never long-poll blindly: the first round asks every owner with
``max_wait=0``; if that gives the client less than ``min_bytes``, the proxy waits on the
high-watermark events of the requested partitions (the same watch the brokers wake their own
long polls on) until one fires or ``max_wait`` passes, then asks only the owners of the
partitions that moved, letting them wait ``routing.fetch_wake_wait_ms`` for data they may not
have seen yet. So a long poll ends when any part has data, and no upstream connection is held
by a poll the client no longer waits for.

Fetch sessions (KIP-227): the proxy keeps the sessions its clients open (the brokers' own pure
session logic, ``fetch_sessions``) and fetches upstream without sessions, naming every partition
of the session. A proxy replica that restarts, or a client sent to another replica, gets
FETCH_SESSION_ID_NOT_FOUND and opens a new session with a full request, as the protocol intends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from dataclasses import dataclass
from typing import Any

from kafscale.broker.api.fetch_sessions import (
    FetchContext,
    FetchPosition,
    FetchSessionCache,
    PartitionKey,
    PartitionResult,
)
from kafscale.broker.protocol import codec
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.proxy.forward import Call, Forwarder
from kafscale.broker.proxy.split import entity_fields, fetch_topic_key
from kafscale.broker.proxy.upstream import UpstreamError, UpstreamPool

FETCH_KEY = 1
_NO_LEADER_EPOCH = -1


@dataclass(slots=True)
class Wanted:
    key: PartitionKey  # (topic name or id as the client named it, partition)
    name: str | None  # the topic's name, None if unknown
    position: FetchPosition


async def forward_fetch(
    forwarder: Forwarder,
    sessions: FetchSessionCache,
    pool: UpstreamPool,
    call: Call,
    request: Any,
) -> dict[str, Any]:
    requested = _requested(request)
    context = _context(sessions, request, requested)
    if isinstance(context, ErrorCode):
        return fetch_error_body(context)
    wanted = _resolve(forwarder, context.partitions(requested))
    deadline = time.monotonic() + codec.millis(request.max_wait) / 1000
    min_bytes = int(request.min_bytes)
    total_max = int(getattr(request, "max_bytes", 0x7FFFFFFF))
    results: dict[PartitionKey, Any] = {}
    needed: set[PartitionKey] | None = None  # None: every partition
    refused: set[int] = set()  # brokers that could not be reached for this request
    upstream_wait_ms = 0
    attempts = 0
    while True:
        events = {
            w.key: forwarder.routes.view.watermarks.event((w.name, w.key[1]))
            for w in wanted
            if w.name is not None
        }
        asked = _route(forwarder, [w for w in wanted if needed is None or w.key in needed], refused)
        failed, failed_brokers = await _fetch_round(
            forwarder, pool, call, request, asked, upstream_wait_ms, results
        )
        remaining = deadline - time.monotonic()
        if failed:
            attempts += 1
            refused |= failed_brokers
            if attempts < forwarder.settings.max_attempts and remaining > 0:
                # Any broker serves any committed offset: ask another one right away.
                forwarder.stats.count_retry("connection")
                needed = failed
                await asyncio.sleep(min(0.01 * attempts, remaining))  # all down: do not spin
                continue
            for key in failed:
                results.setdefault(key, _partition_error(key[1], ErrorCode.NOT_LEADER_OR_FOLLOWER))
        size = sum(
            len(getattr(r, "records", None) or b"")
            for r in results.values()
            if not isinstance(r, dict)
        )
        errors = any(_code(r) != ErrorCode.NONE for r in results.values())
        if size >= min_bytes or errors or remaining <= 0 or not events:
            break
        needed = await wait_any_event(events, remaining)
        upstream_wait_ms = min(forwarder.settings.fetch_wake_wait_ms, int(max(remaining, 0) * 1000))
    if context.overtaken:
        return fetch_error_body(ErrorCode.INVALID_FETCH_SESSION_EPOCH)
    return _body(wanted, trim_results(wanted, results, total_max), context)


def _requested(request: Any) -> list[tuple[PartitionKey, FetchPosition]]:
    return [
        (
            (fetch_topic_key(topic), int(p.partition)),
            FetchPosition(
                int(p.fetch_offset),
                int(p.partition_max_bytes),
                int(getattr(p, "current_leader_epoch", _NO_LEADER_EPOCH)),
            ),
        )
        for topic in request.topics
        for p in topic.partitions
    ]


def _context(
    sessions: FetchSessionCache,
    request: Any,
    requested: list[tuple[PartitionKey, FetchPosition]],
) -> FetchContext | ErrorCode:
    if not hasattr(request, "session_epoch"):  # v4-v6: no sessions
        return FetchContext(None, incremental=False)
    forgotten = [
        (fetch_topic_key(topic), int(partition))
        for topic in request.forgotten_topics_data
        for partition in topic.partitions
    ]
    return sessions.context(
        int(request.session_id), int(request.session_epoch), requested, forgotten
    )


def _resolve(
    forwarder: Forwarder, partitions: list[tuple[PartitionKey, FetchPosition]]
) -> list[Wanted]:
    view = forwarder.routes.view
    by_id = None
    wanted = []
    for key, position in partitions:
        topic = key[0]
        if isinstance(topic, uuid.UUID):
            by_id = view.topics_by_id if by_id is None else by_id
            info = by_id.get(topic.hex)
            name = info.name if info is not None else None
        else:
            name = topic if topic in view.topics else None
        wanted.append(Wanted(key, name, position))
    return wanted


def _route(
    forwarder: Forwarder, wanted: list[Wanted], refused: set[int]
) -> dict[int, list[Wanted]]:
    """Owner -> its partitions. Unknown topics go to any broker, which answers the error, and
    so do partitions whose owner could not be reached (every broker serves committed data)."""
    routes = forwarder.routes
    avoid = frozenset(refused)
    by_broker: dict[int, list[Wanted]] = {}
    for item in wanted:
        broker = -1
        if item.name is not None:
            broker = routes.partition_owner((item.name, item.key[1]))
        if broker < 0 or broker in avoid:
            broker = routes.any_broker(avoid)
        by_broker.setdefault(broker, []).append(item)
    return by_broker


async def _fetch_round(
    forwarder: Forwarder,
    pool: UpstreamPool,
    call: Call,
    request: Any,
    asked: dict[int, list[Wanted]],
    max_wait_ms: int,
    results: dict[PartitionKey, Any],
) -> tuple[set[PartitionKey], set[int]]:
    """Ask each broker for its partitions; record the answers in ``results``. The partitions
    whose broker could not be reached, and those brokers."""
    parts = [
        (broker, _frame(_sub_request(call, request, items, max_wait_ms)))
        for broker, items in asked.items()
        if broker >= 0
    ]
    failed = {item.key for item in asked.get(-1, [])}
    failed_brokers: set[int] = set()
    futures = await forwarder.send(pool, parts)
    outcomes = await asyncio.gather(*futures, return_exceptions=True)
    for (broker, _), outcome in zip(parts, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            if not isinstance(outcome, UpstreamError):
                raise outcome
            failed_brokers.add(broker)
            failed.update(item.key for item in asked[broker])
            continue
        response = codec.decode_response(outcome, call.api_key, call.api_version)
        unanswered = record_answer(response, asked[broker], results)
        if unanswered:
            failed_brokers.add(broker)
            failed |= unanswered
    return failed, failed_brokers


def record_answer(
    response: Any, items: list[Wanted], results: dict[PartitionKey, Any]
) -> set[PartitionKey]:
    """Record a broker's answers in ``results``; the partitions to ask another broker: left
    out of the answer (a request-level error, say from a broker shutting down) or answered
    UNKNOWN_SERVER_ERROR. kafka-python raises that code to the user; any broker serves
    committed data, so another one is asked first."""
    answered: set[PartitionKey] = set()
    if int(getattr(response, "error_code", ErrorCode.NONE)) == ErrorCode.NONE:
        for topic in response.responses:
            key = fetch_topic_key(topic)
            for p in topic.partitions:
                results[(key, int(p.partition_index))] = p
                if int(p.error_code) != ErrorCode.UNKNOWN_SERVER_ERROR:
                    answered.add((key, int(p.partition_index)))
    return {item.key for item in items} - answered


def _sub_request(call: Call, request: Any, items: list[Wanted], max_wait_ms: int) -> bytes:
    topics: dict[Any, list[dict[str, Any]]] = {}
    for item in items:
        topics.setdefault(item.key[0], []).append(
            {
                "partition": item.key[1],
                "fetch_offset": item.position.fetch_offset,
                "partition_max_bytes": item.position.max_bytes,
                "current_leader_epoch": item.position.current_leader_epoch,
                "log_start_offset": -1,
                "last_fetched_epoch": -1,
            }
        )
    body = entity_fields(request)
    body.update(
        max_wait=max_wait_ms,
        min_bytes=1 if max_wait_ms else 0,
        topics=[
            {("topic_id" if isinstance(key, uuid.UUID) else "topic"): key, "partitions": parts}
            for key, parts in topics.items()
        ],
    )
    if "session_epoch" in body:
        body.update(session_id=0, session_epoch=-1, forgotten_topics_data=[])
    return codec.encode_request(FETCH_KEY, call.api_version, 0, body, call.client_id)


def _frame(encoded: bytes) -> memoryview:
    return memoryview(encoded)[4:]


def _code(result: Any) -> int:
    return int(result["error_code"] if isinstance(result, dict) else result.error_code)


def _partition_error(partition: int, code: ErrorCode) -> dict[str, Any]:
    return {
        "partition_index": partition,
        "error_code": code,
        "high_watermark": -1,
        "last_stable_offset": -1,
        "log_start_offset": -1,
        "aborted_transactions": [],
        "preferred_read_replica": -1,
        "records": b"",
    }


def trim_results(
    wanted: list[Wanted], results: dict[PartitionKey, Any], total_max: int
) -> list[Any]:
    """Results in request order, kept to the response's ``max_bytes``: whole partitions, and
    the first partition that has records always (as a broker does: were it only the first
    partition asked, a client whose first partition is read to its end would never be given
    the others' records). A partition cut gets empty records this time, never null ones:
    kafka-python's fetcher cannot parse a null record set and fails the poll."""
    ordered = []
    budget = total_max
    for item in wanted:
        result = results.get(item.key)
        if result is None:  # not answered in time: the client retries, and so can we
            result = _partition_error(item.key[1], ErrorCode.NOT_LEADER_OR_FOLLOWER)
        if not isinstance(result, dict):
            size = len(result.records or b"")
            if budget < total_max and size > budget:
                result = dataclasses.replace(result, records=b"")
                size = 0
            budget -= size
        ordered.append(result)
    return ordered


def _body(wanted: list[Wanted], results: list[Any], context: FetchContext) -> dict[str, Any]:
    chosen = context.respond(
        [
            (
                item.key,
                PartitionResult(
                    _code(result),
                    int(_field(result, "high_watermark")),
                    int(_field(result, "log_start_offset", -1)),  # v5+ only
                    bool(_field(result, "records")),
                ),
            )
            for item, result in zip(wanted, results, strict=True)
        ]
    )
    topics: dict[Any, list[Any]] = {}
    for item, result, send in zip(wanted, results, chosen, strict=True):
        if send:
            topics.setdefault(item.key[0], []).append(result)
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.NONE,
        "session_id": context.session_id,
        "responses": [
            {("topic_id" if isinstance(key, uuid.UUID) else "topic"): key, "partitions": parts}
            for key, parts in topics.items()
        ],
    }


def _field(result: Any, name: str, default: Any = None) -> Any:
    """A partition result's field; ``default`` where the client's version lacks it."""
    if isinstance(result, dict):
        return result.get(name, default)
    return getattr(result, name) if default is None else getattr(result, name, default)


async def wait_any_event(
    events: dict[PartitionKey, asyncio.Event], timeout_s: float
) -> set[PartitionKey]:
    """The partitions whose event fired first (or none, after ``timeout_s``)."""
    waiters = {asyncio.ensure_future(e.wait()): key for key, e in events.items()}
    try:
        done, _ = await asyncio.wait(
            waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
    return {waiters[w] for w in done} | {k for k, e in events.items() if e.is_set()}


def fetch_error_body(code: ErrorCode) -> dict[str, Any]:
    return {"throttle_time": 0, "error_code": code, "session_id": 0, "responses": []}
