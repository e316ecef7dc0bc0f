"""ShareFetch and ShareAcknowledge (KIP-932) through the proxy: one client session, one
upstream session per owning broker (``share_sessions``), answers merged as one broker's.

A client request is checked against its session at the proxy (epochs as a broker checks them),
then runs in rounds. Each round asks the owners of the session's partitions at once, on the
proxy's own session with each, with the acknowledgements for each partition going to its
owner. A long poll never lets a broker hold records nobody will receive: with several owners,
the first round asks each with ``max_wait=0``; if none had records, the proxy waits on the
high-watermark events of the session's partitions (and on route changes) for at most
``POLL_INTERVAL_S`` at a time, then asks the owners of the partitions that moved (letting them
wait ``routing.fetch_wake_wait_ms``), or all of them when the interval passed (records a member
released or whose lock expired show no event), until some records come or ``max_wait`` passes.
A session with a single owner lets that broker long-poll itself.

Partitions whose owner cannot be reached, or that the broker no longer owns, are asked again
in the next round of the same request (at its new owner, once the lease moved); at the end
they are answered NOT_LEADER_OR_FOLLOWER with the proxy as their leader, and clients fetch
again. Acknowledgements that could not be delivered are answered with their error code
(``acknowledge_error_code``): the records may come again, as Kafka's at-least-once allows.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kafscale.broker.api.error_bodies import share_fetch_error_body
from kafscale.broker.protocol import codec
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.proxy import answers
from kafscale.broker.proxy.fetch import wait_any_event
from kafscale.broker.proxy.forward import Call, Forwarder, backoff_s
from kafscale.broker.proxy.share_sessions import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    NO_BROKER,
    ClientSession,
    ClientSessions,
    PartitionKey,
    Round,
    UpstreamPart,
    forget_upstream,
    needs_opening,
    plan_acknowledge,
    plan_opening,
    plan_round,
    update_partitions,
)
from kafscale.broker.proxy.split import entity_fields
from kafscale.broker.proxy.upstream import UpstreamError, UpstreamPool

SHARE_FETCH_KEY = 78
SHARE_ACKNOWLEDGE_KEY = 79
POLL_INTERVAL_S = 0.5
"""How long a long poll over several owners waits for a high-watermark event before asking
every owner again (released and expired records show no event)."""
SESSION_LOST = frozenset({ErrorCode.SHARE_SESSION_NOT_FOUND, ErrorCode.INVALID_SHARE_SESSION_EPOCH})
RETRIABLE = frozenset({ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE})
ZERO_ID = uuid.UUID(int=0)
Body = dict[str, Any]


@dataclass(slots=True)
class _Answers:
    """What the brokers answered a client request, partition by partition."""

    answered: dict[PartitionKey, Any] = field(default_factory=dict)  # kio PartitionData
    errors: dict[PartitionKey, ErrorCode] = field(default_factory=dict)  # the proxy's own
    ack_errors: dict[PartitionKey, ErrorCode] = field(default_factory=dict)
    retry: set[int] = field(default_factory=set)  # brokers to ask again next round
    lost_acks: dict[PartitionKey, Any] = field(default_factory=dict)
    """Acknowledgements whose broker lost the proxy's session (or connection) with them: they
    are delivered again on a session opened anew (``_deliver_acks``)."""
    top_errors: list[ErrorCode] = field(default_factory=list)
    lock_ms: int = 0
    throttle_ms: int = 0

    def fail(self, part: UpstreamPart, code: ErrorCode) -> None:
        for key in part.partitions:
            self.errors[key] = code
        for key in part.acks:
            self.ack_errors[key] = code

    def has_records(self) -> bool:
        return any(
            getattr(p, "acquired_records", None)
            for key, p in self.answered.items()
            if key not in self.errors
        )

    def final_errors(self) -> bool:
        """Some partition has an error a new round would not cure."""
        codes = [int(p.error_code) for k, p in self.answered.items() if k not in self.errors]
        return any(c not in (ErrorCode.NONE, *RETRIABLE) for c in codes)


@dataclass(frozen=True, slots=True)
class ShareCall:
    """One client request as the rounds need it."""

    forwarder: Forwarder
    pool: UpstreamPool
    call: Call
    request: Any
    me: answers.Identity


# --- the client's request ---------------------------------------------------------------------


def _invalid(request: Any) -> tuple[ErrorCode, str] | None:
    if not request.group_id:
        return ErrorCode.INVALID_GROUP_ID, "group id can't be empty"
    if not request.member_id:
        return ErrorCode.INVALID_REQUEST, "member id can't be empty"
    return None


def _named(request: Any) -> list[tuple[PartitionKey, Any]]:
    """Every (partition, acknowledgement batches) the request names, in order."""
    return [
        ((t.topic_id or ZERO_ID, int(p.partition_index)), tuple(p.acknowledgement_batches))
        for t in request.topics
        for p in t.partitions
    ]


def _name_of(forwarder: Forwarder, key: PartitionKey) -> str | None:
    """The topic's name if the partition exists (None: UNKNOWN_TOPIC_ID)."""
    info = forwarder.routes.view.topics_by_id.get(key[0].hex)
    if info is None or not 0 <= key[1] < info.partitions:
        return None
    return str(info.name)


def _owner_of(forwarder: Forwarder) -> Any:
    routes = forwarder.routes

    def owner(key: PartitionKey) -> int:
        name = _name_of(forwarder, key)
        return NO_BROKER if name is None else routes.partition_owner((name, key[1]))

    return owner


async def forward_share_fetch(c: ShareCall) -> Body:
    request = c.request
    if (problem := _invalid(request)) is not None:
        return error_body(problem[0], problem[1])
    epoch = int(request.share_session_epoch)
    named = _named(request)
    if epoch == INITIAL_EPOCH and any(batches for _, batches in named):
        message = "acknowledgements on the request that opens a share session"
        return error_body(ErrorCode.INVALID_REQUEST, message)
    sessions: ClientSessions = c.pool.share_sessions
    key = (str(request.group_id), str(request.member_id))
    closing = epoch == FINAL_EPOCH
    if closing:
        error, session = sessions.close(key)
    elif epoch == INITIAL_EPOCH:
        error, session = sessions.open(key)
    else:
        error, session = sessions.advance(key, epoch)
    if session is None:
        return error_body(error)
    unknown = {k for k, _ in named if _name_of(c.forwarder, k) is None}
    acks = {k: batches for k, batches in named if batches and k not in unknown}
    if not closing:
        forgotten = [
            (t.topic_id or ZERO_ID, int(i))
            for t in request.forgotten_topics_data
            for i in t.partitions
        ]
        added = [k for k, _ in named if k not in unknown]
        update_partitions(session, added, forgotten)
        gone = [k for k in session.partitions if _name_of(c.forwarder, k) is None]
        update_partitions(session, (), gone)  # a deleted topic's partitions leave the session
        unknown.update(gone)
    state = _Answers()
    state.ack_errors.update({k: ErrorCode.UNKNOWN_TOPIC_ID for k, b in named if b and k in unknown})
    await _rounds(c, session, acks, closing, state)
    order = list(dict.fromkeys([*([] if closing else session.partitions), *(k for k, _ in named)]))
    if not state.answered and state.top_errors and not state.has_records():
        return error_body(state.top_errors[0])
    lock_ms = 0 if closing else state.lock_ms
    return _fetch_body(c, order, state, unknown, lock_ms)


async def _rounds(
    c: ShareCall,
    session: ClientSession,
    acks: Mapping[PartitionKey, Any],
    closing: bool,
    state: _Answers,
) -> None:
    """Ask the owners until some records come, an error a client must see, or ``max_wait``."""
    request = c.request
    deadline = time.monotonic() + codec.millis(request.max_wait) / 1000
    only: set[int] | None = None
    wait_ms = 0
    attempt = 0
    if not closing:
        # Owners without the proxy's session take their acknowledgements on one opened first.
        owner = _owner_of(c.forwarder)
        opening = {k: b for k, b in acks.items() if needs_opening(session, owner(k))}
        acks = {k: b for k, b in acks.items() if k not in opening}
        await _deliver_acks(c, session, opening, state)
    while True:
        if session.closed and not closing:
            return
        events = _events(c, session)
        round_ = await _send_round(c, session, acks, closing, only, wait_ms, deadline, state)
        acks = {}  # acknowledgements go once, in the first round
        lost, state.lost_acks = state.lost_acks, {}
        if not closing:
            await _deliver_acks(c, session, lost, state)  # once more, on a session opened anew
        for key, code in round_.unacknowledged.items():
            state.ack_errors[key] = code
        for key in round_.unroutable:
            state.errors[key] = ErrorCode.LEADER_NOT_AVAILABLE
        remaining = deadline - time.monotonic()
        if closing or state.has_records() or state.final_errors() or remaining <= 0:
            return
        if state.top_errors and not state.retry:
            return
        if state.retry or round_.unroutable:
            attempt += 1
            await c.forwarder.routes.wait_changed(min(backoff_s(attempt), remaining))
            only = set(state.retry) | {_owner_of(c.forwarder)(k) for k in round_.unroutable}
            state.retry.clear()
            wait_ms = 0
            continue
        woken = await _wait_any(events, min(POLL_INTERVAL_S, remaining))
        owner = _owner_of(c.forwarder)
        only = None if woken is None else {owner(k) for k in woken}
        wait_ms = 0 if woken is None else c.forwarder.settings.fetch_wake_wait_ms
        wait_ms = min(wait_ms, int(max(deadline - time.monotonic(), 0) * 1000))


async def _send_round(
    c: ShareCall,
    session: ClientSession,
    acks: Mapping[PartitionKey, Any],
    closing: bool,
    only: set[int] | None,
    wait_ms: int,
    deadline: float,
    state: _Answers,
) -> Round:
    owner = _owner_of(c.forwarder)
    async with session.lock:
        round_ = plan_round(session, owner, acks, closing, only)
        fetching = {b for b, up in session.upstream.items() if up.partitions}
        if not closing and len(round_.parts) == 1 and len(fetching) == 1:
            # One owner: it long-polls itself, no record can be acquired for nobody.
            wait_ms = int(max(deadline - time.monotonic(), 0) * 1000)
        frames = []
        for part in round_.parts:
            # A session left with no partition (all forgotten) has nothing to wait for.
            wait = wait_ms if part.broker in fetching else 0
            frames.append((part.broker, _frame(c.call, _fetch_request(c.request, part, wait))))
        futures = await c.forwarder.send(c.pool, frames)
    await _read(c, session, round_.parts, futures, state)
    return round_


async def _read(
    c: ShareCall,
    session: ClientSession,
    parts: list[UpstreamPart],
    futures: list[asyncio.Future[bytes]],
    state: _Answers,
) -> None:
    outcomes = await asyncio.gather(*futures, return_exceptions=True)
    for part, outcome in zip(parts, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            if not isinstance(outcome, UpstreamError):
                raise outcome
            c.forwarder.stats.count_retry("connection")
            forget_upstream(session, part.broker)  # its connection closed: so did its session
            state.fail(part, ErrorCode.NOT_LEADER_OR_FOLLOWER)
            state.retry.add(part.broker)
            if part.epoch != FINAL_EPOCH:
                state.lost_acks.update(part.acks)
            continue
        response = codec.decode_response(outcome, c.call.api_key, c.call.api_version)
        state.throttle_ms = max(state.throttle_ms, codec.millis(response.throttle_time))
        code = ErrorCode(int(response.error_code))
        if code in SESSION_LOST:  # the broker restarted, or dropped the session: open anew
            forget_upstream(session, part.broker)
            state.fail(part, ErrorCode.NOT_LEADER_OR_FOLLOWER)
            if part.epoch != FINAL_EPOCH:
                state.retry.add(part.broker)
                state.lost_acks.update(part.acks)
            continue
        if code is not ErrorCode.NONE:
            if part.epoch == INITIAL_EPOCH:
                # The broker opened nothing (a member its watch has not shown, no access): the
                # next round opens again rather than moving on a session that is not there.
                forget_upstream(session, part.broker)
            state.fail(part, code)
            state.top_errors.append(code)
            continue
        lock = getattr(response, "acquisition_lock_timeout", 0)  # ShareAcknowledge v2+ only
        state.lock_ms = max(state.lock_ms, codec.millis(lock))
        _record(response, part, state, c.call.api_key)


async def _deliver_acks(
    c: ShareCall, session: ClientSession, acks: Mapping[PartitionKey, Any], state: _Answers
) -> None:
    """Acknowledgements for owners where the proxy has no session (or lost it): the session
    opened there first (ShareFetch, epoch 0, no partition: nothing acquired), then the
    acknowledgements on it (ShareAcknowledge). The member's records are its own, not its
    session's, so the owner answers as Kafka does: NONE for records the member still holds,
    INVALID_RECORD_STATE for records it no longer does. Only their answers reach ``state``."""
    if not acks:
        return
    owner = _owner_of(c.forwarder)
    fetch = replace(c, call=replace(c.call, api_key=SHARE_FETCH_KEY))
    acknowledge = replace(c, call=replace(c.call, api_key=SHARE_ACKNOWLEDGE_KEY))
    async with session.lock:
        opening = plan_opening(session, owner, acks)
        frames = [(p.broker, _frame(fetch.call, _open_request(c.request, p))) for p in opening]
        futures = await c.forwarder.send(c.pool, frames)
    await _read(fetch, session, opening, futures, _Answers())  # a refusal forgets the session
    answers = _Answers()
    async with session.lock:
        round_ = plan_acknowledge(session, owner, acks)
        frames = [
            (p.broker, _frame(acknowledge.call, _acknowledge_request(c.request, p)))
            for p in round_.parts
        ]
        futures = await c.forwarder.send(c.pool, frames)
    await _read(acknowledge, session, round_.parts, futures, answers)
    answers.ack_errors.update(round_.unacknowledged)
    state.ack_errors.update(
        {k: answers.ack_errors.get(k, ErrorCode.NOT_LEADER_OR_FOLLOWER) for k in acks}
    )


def _record(response: Any, part: UpstreamPart, state: _Answers, api_key: int) -> None:
    for topic in response.responses:
        for p in topic.partitions:
            key = (topic.topic_id or ZERO_ID, int(p.partition_index))
            if api_key == SHARE_ACKNOWLEDGE_KEY:
                state.ack_errors[key] = ErrorCode(int(p.error_code))
                continue
            state.errors.pop(key, None)
            state.answered[key] = p
            if key in part.acks:
                state.ack_errors[key] = ErrorCode(int(p.acknowledge_error_code))
            if int(p.error_code) in RETRIABLE:
                state.retry.add(part.broker)


def _events(c: ShareCall, session: ClientSession) -> dict[PartitionKey, asyncio.Event]:
    watermarks = c.forwarder.routes.view.watermarks
    events = {}
    for key in session.partitions:
        name = _name_of(c.forwarder, key)
        if name is not None:
            events[key] = watermarks.event((name, key[1]))
    return events


async def _wait_any(
    events: dict[PartitionKey, asyncio.Event], timeout_s: float
) -> set[PartitionKey] | None:
    """The partitions whose high watermark moved first; None after ``timeout_s``."""
    if not events:
        await asyncio.sleep(timeout_s)
        return None
    return await wait_any_event(events, timeout_s) or None


# --- ShareAcknowledge -------------------------------------------------------------------------


async def forward_share_acknowledge(c: ShareCall) -> Body:
    request = c.request
    if (problem := _invalid(request)) is not None:
        return error_body(problem[0], problem[1])
    epoch = int(request.share_session_epoch)
    if epoch == INITIAL_EPOCH:
        message = "ShareAcknowledge cannot open a share session"
        return error_body(ErrorCode.INVALID_SHARE_SESSION_EPOCH, message)
    sessions: ClientSessions = c.pool.share_sessions
    key = (str(request.group_id), str(request.member_id))
    closing = epoch == FINAL_EPOCH
    error, session = sessions.close(key) if closing else sessions.advance(key, epoch)
    if session is None:
        return error_body(error)
    named = _named(request)
    unknown = {k for k, _ in named if _name_of(c.forwarder, k) is None}
    acks = {k: batches for k, batches in named if k not in unknown}
    state = _Answers()
    state.ack_errors.update(dict.fromkeys(unknown, ErrorCode.UNKNOWN_TOPIC_ID))
    if not closing:
        owner = _owner_of(c.forwarder)
        opening = {k: b for k, b in acks.items() if needs_opening(session, owner(k))}
        acks = {k: b for k, b in acks.items() if k not in opening}
        await _deliver_acks(c, session, opening, state)
    async with session.lock:
        round_ = plan_acknowledge(session, _owner_of(c.forwarder), acks, closing)
        frames = [
            (part.broker, _frame(c.call, _acknowledge_request(request, part)))
            for part in round_.parts
        ]
        futures = await c.forwarder.send(c.pool, frames)
    await _read(c, session, round_.parts, futures, state)
    state.ack_errors.update(round_.unacknowledged)
    lost, state.lost_acks = state.lost_acks, {}
    if not closing:
        await _deliver_acks(c, session, lost, state)  # once more, on a session opened anew
    if state.top_errors and len(state.top_errors) == len(round_.parts) and round_.parts:
        return error_body(state.top_errors[0])  # every broker refused it (say, group ACLs)
    return _acknowledge_body(c, list(dict.fromkeys(k for k, _ in named)), state)


# --- upstream requests ------------------------------------------------------------------------


def _topics(keys: tuple[PartitionKey, ...], acks: Mapping[PartitionKey, Any]) -> list[Body]:
    topics: dict[uuid.UUID, list[Body]] = {}
    for key in keys:
        topics.setdefault(key[0], []).append(
            {
                "partition_index": key[1],
                # As fields: they may go out in the other API's request (``_deliver_acks``).
                "acknowledgement_batches": [entity_fields(b) for b in acks.get(key, ())],
            }
        )
    return [{"topic_id": topic_id, "partitions": parts} for topic_id, parts in topics.items()]


def _fetch_request(request: Any, part: UpstreamPart, wait_ms: int) -> Body:
    body = entity_fields(request)
    forgotten: dict[uuid.UUID, list[int]] = {}
    for key in part.forgotten:
        forgotten.setdefault(key[0], []).append(key[1])
    body.update(
        share_session_epoch=part.epoch,
        max_wait=wait_ms,
        topics=_topics(part.partitions, part.acks),
        forgotten_topics_data=[
            {"topic_id": topic_id, "partitions": indexes} for topic_id, indexes in forgotten.items()
        ],
    )
    return body


def _acknowledge_request(request: Any, part: UpstreamPart) -> Body:
    """ShareAcknowledge upstream, for the client's ShareAcknowledge or ShareFetch (whose
    acknowledgements the proxy delivers on their own)."""
    body: Body = {
        "group_id": request.group_id,
        "member_id": request.member_id,
        "share_session_epoch": part.epoch,
        "topics": _topics(part.partitions, part.acks),
    }
    if hasattr(request, "is_renew_ack"):  # v2
        body["is_renew_ack"] = request.is_renew_ack
    return body


def _open_request(request: Any, part: UpstreamPart) -> Body:
    """ShareFetch opening the proxy's session on a broker: no partition, no wait, so the
    broker acquires nothing (the next fetch round names the partitions)."""
    body: Body = {
        "group_id": request.group_id,
        "member_id": request.member_id,
        "share_session_epoch": part.epoch,
        "max_wait": 0,
        "min_bytes": 1,
        "max_bytes": 1,
        "max_records": 1,
        "batch_size": 1,
        "topics": [],
        "forgotten_topics_data": [],
    }
    if hasattr(request, "is_renew_ack"):  # v2
        body.update(share_acquire_mode=getattr(request, "share_acquire_mode", 0))
        body.update(is_renew_ack=False)
    return body


def _frame(call: Call, body: Body) -> memoryview:
    encoded = codec.encode_request(call.api_key, call.api_version, 0, body, call.client_id)
    return memoryview(encoded)[4:]


# --- the proxy's answers ----------------------------------------------------------------------


def _leader(c: ShareCall, key: PartitionKey) -> tuple[int, int]:
    """The partition's leader as the proxy's clients know it (the proxy), and its epoch."""
    name = _name_of(c.forwarder, key)
    if name is None:
        return -1, -1
    routes = c.forwarder.routes
    tp = (name, key[1])
    return answers.leader_id(routes.partition_owner(tp), c.me), routes.leader_epoch(tp)


def _endpoints(c: ShareCall, leaders: set[int]) -> list[Body]:
    """Where the leaders named beside errors are: all at the proxy's address."""
    me = c.me
    return [
        {"node_id": node, "host": me.host, "port": me.port, "rack": None}
        for node in sorted(leaders)
        if node >= 0
    ]


def _fetch_body(
    c: ShareCall,
    order: list[PartitionKey],
    state: _Answers,
    unknown: set[PartitionKey],
    lock_ms: int,
) -> Body:
    topics: dict[uuid.UUID, list[Body]] = {}
    troubled: set[int] = set()
    for key in order:
        leader, leader_epoch = _leader(c, key)
        answer = None if key in state.errors else state.answered.get(key)
        if key in unknown:
            code = ErrorCode.UNKNOWN_TOPIC_ID
        elif key in state.errors:
            code = state.errors[key]
        else:
            code = ErrorCode(int(answer.error_code)) if answer is not None else ErrorCode.NONE
        ack_code = state.ack_errors.get(key, ErrorCode.NONE)
        if code is not ErrorCode.NONE or ack_code is not ErrorCode.NONE:
            troubled.add(leader)
        topics.setdefault(key[0], []).append(
            {
                "partition_index": key[1],
                "error_code": code,
                "error_message": None,
                "acknowledge_error_code": ack_code,
                "acknowledge_error_message": None,
                "current_leader": {"leader_id": leader, "leader_epoch": leader_epoch},
                "records": (answer.records or b"") if answer is not None else b"",
                "acquired_records": [
                    {
                        "first_offset": int(a.first_offset),
                        "last_offset": int(a.last_offset),
                        "delivery_count": int(a.delivery_count),
                    }
                    for a in (answer.acquired_records if answer is not None else ())
                ],
            }
        )
    return {
        "throttle_time": state.throttle_ms,
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "acquisition_lock_timeout": lock_ms,
        "responses": [{"topic_id": t, "partitions": ps} for t, ps in topics.items()],
        "node_endpoints": _endpoints(c, troubled),
    }


def _acknowledge_body(c: ShareCall, order: list[PartitionKey], state: _Answers) -> Body:
    topics: dict[uuid.UUID, list[Body]] = {}
    troubled: set[int] = set()
    for key in order:
        leader, leader_epoch = _leader(c, key)
        code = state.ack_errors.get(key, ErrorCode.NOT_LEADER_OR_FOLLOWER)
        if code is not ErrorCode.NONE:
            troubled.add(leader)
        topics.setdefault(key[0], []).append(
            {
                "partition_index": key[1],
                "error_code": code,
                "error_message": None,
                "current_leader": {"leader_id": leader, "leader_epoch": leader_epoch},
            }
        )
    return {
        "throttle_time": state.throttle_ms,
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "acquisition_lock_timeout": state.lock_ms,
        "responses": [{"topic_id": t, "partitions": ps} for t, ps in topics.items()],
        "node_endpoints": _endpoints(c, troubled),
    }


def error_body(code: ErrorCode, message: str | None = None) -> Body:
    """ShareFetch's and ShareAcknowledge's top-level fields (the same in both), as a broker
    answers them."""
    return share_fetch_error_body(None, code, message)
