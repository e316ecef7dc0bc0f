"""Produce: validate batches, append them in arrival order, answer once they are durable.

A topic's configs shape what is appended (``TopicRules``, a pure check): ``max.message.bytes``
caps each batch (MESSAGE_TOO_LARGE), ``message.timestamp.after.max.ms`` and ``.before.max.ms``
bound CreateTime timestamps around the broker's clock (INVALID_TIMESTAMP), and
``message.timestamp.type=LogAppendTime`` gives every batch the time of its append (returned in
the response as ``log_append_time``, -1 otherwise).

Transactional batches come from producers with a transactional id (the request carries it): the
principal needs WRITE on that transactional id, and the batch's producer epoch is checked against
what the partition remembers (an older epoch, a fenced zombie, gets INVALID_PRODUCER_EPOCH). A
transactional producer's first batch on a partition opens its transaction there (see
``partition_log``); the coordinator's marker closes it. As Kafka refuses them: a request whose
first batch of some partition is transactional, from a producer without a transactional id, gets
TRANSACTIONAL_ID_AUTHORIZATION_FAILED for the whole request (KafkaApis'
``hasTransactionalRecords`` check), and a control batch gets INVALID_RECORD for its partition
(LogValidator: "Clients are not allowed to write control records"): only the partition's owner
writes markers, for WriteTxnMarkers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.api.error_bodies import (
    NO_TIMESTAMP,
    every_partition_failed,
)
from kafscale.broker.api.produce_refusals import log_refusal
from kafscale.broker.api.produce_verification import confirm, forget, verify_transactional
from kafscale.broker.authz.model import Operation
from kafscale.broker.metadata.topics import DEFAULT_CONFIGS, NO_LIMIT_MS, effective_configs
from kafscale.broker.observability.metrics import METRICS
from kafscale.broker.protocol import legacy_messages
from kafscale.broker.protocol.codec import millis
from kafscale.broker.protocol.errors import ErrorCode, KafkaError, code_for
from kafscale.broker.protocol.record_batch import (
    BatchHeader,
    InvalidBatch,
    null_key_indexes,
    read_header,
    record_timestamps,
    split_batches,
    with_log_append_time,
)
from kafscale.broker.storage.compaction_plan import is_compacted
from kafscale.broker.storage.partition_log import NO_APPEND_TIME, Ack

FIRST_RECORD_BATCH_VERSION = 3  # Produce v0-v2 carry message sets (message format v0/v1)
INLINE_DECODE_BYTES = 16 * 1024
"""Uncompressed batches up to this size have their records read on the event loop (a thread hop
costs more than reading them); larger or compressed ones are read by ``_DECODERS``."""
_DECODERS = ThreadPoolExecutor(2, thread_name_prefix="kafscale-produce-decode")
"""Where the records of large or compressed produced batches are read (keys of a compacted
topic, timestamps for ``message.timestamp.before.max.ms``): a few KB of zstd can decompress to
``record_batch.MAX_DECOMPRESSED_BYTES`` (64 MiB), which on the event loop would stall every
other connection. Two workers bound the memory such reads hold at once to twice that."""

_T = TypeVar("_T")


async def _read_records(
    read: Callable[[memoryview], _T], batch: memoryview, header: BatchHeader
) -> _T:
    """``read(batch)``, inline for a small uncompressed batch, else in ``_DECODERS``."""
    if header.compression == 0 and len(batch) <= INLINE_DECODE_BYTES:
        return read(batch)
    return await asyncio.get_running_loop().run_in_executor(_DECODERS, read, batch)


async def handle_produce(request: Any, ctx: RequestContext) -> Body | None:
    acks = int(request.acks)
    if acks not in (0, 1, -1):
        return every_partition_failed(request, ErrorCode.INVALID_REQUIRED_ACKS)
    legacy = ctx.api_version < FIRST_RECORD_BATCH_VERSION
    if not legacy and not _transactions_allowed(request, ctx):
        return every_partition_failed(request, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    async with ctx.connection.append_lock:
        size = request_bytes(request)
        if not await _admit(ctx, size, None if acks == 0 else millis(request.timeout)):
            return every_partition_failed(request, ErrorCode.REQUEST_TIMED_OUT)
        acked = await _append_all(request, ctx)
        _give_back_when_durable(ctx, size, acked)
    if acks == 0:
        for future in acked.values():
            if isinstance(future, asyncio.Future):
                future.add_done_callback(_consume_outcome)
        return None
    return await _response(request, ctx, acked, millis(request.timeout))


@dataclass(frozen=True, slots=True)
class TopicRules:
    """What a topic's configs ask of a produce to it."""

    max_batch_bytes: int
    log_append_time: bool
    after_max_ms: int  # how far ahead of the broker's clock a CreateTime timestamp may be
    before_max_ms: int  # and how far behind
    compacted: bool = False  # cleanup.policy includes compact: every record needs a key

    @classmethod
    def of(cls, ctx: RequestContext, topic: str) -> TopicRules:
        """From the topic's effective configs (the defaults' for a topic the view has yet to
        see: one this request auto-creates gets them)."""
        defaults = ctx.broker.settings.topic_defaults()
        info = ctx.broker.view.topics.get(topic)
        configs = effective_configs(info, defaults) if info else {**DEFAULT_CONFIGS, **defaults}
        return cls(
            max_batch_bytes=int(configs["max.message.bytes"]),
            log_append_time=configs["message.timestamp.type"] == "LogAppendTime",
            after_max_ms=int(configs["message.timestamp.after.max.ms"]),
            before_max_ms=int(configs["message.timestamp.before.max.ms"]),
            compacted=is_compacted(configs),
        )

    async def check(
        self, batches: list[memoryview], headers: list[BatchHeader], now_ms: int
    ) -> None:
        """MESSAGE_TOO_LARGE for a batch over ``max.message.bytes`` (as stored: compressed,
        with its 12-byte log header), INVALID_TIMESTAMP for a CreateTime record too far from
        the broker's clock, as Kafka checks them (records without a timestamp, -1, pass).
        Records are read (decompressed) off the event loop unless the batch is small and
        uncompressed (``_read_records``)."""
        largest = max(len(batch) for batch in batches)
        if largest > self.max_batch_bytes:
            raise KafkaError(
                f"record batch of {largest} bytes over max.message.bytes={self.max_batch_bytes}",
                ErrorCode.MESSAGE_TOO_LARGE,
            )
        if self.compacted:
            # Kafka's LogValidator: the cleaner keeps records by key, so a record without one
            # could never be kept or removed. Read only for compacted topics: free elsewhere.
            for batch, header in zip(batches, headers, strict=True):
                keyless = await _read_records(null_key_indexes, batch, header)
                if keyless:
                    raise KeylessRecords(keyless)
        if self.log_append_time:
            return
        for batch, header in zip(batches, headers, strict=True):
            latest = header.max_timestamp  # the max bounds every record: exact
            if latest > now_ms + self.after_max_ms:
                raise KafkaError(
                    f"timestamp {latest} is more than message.timestamp.after.max.ms="
                    f"{self.after_max_ms} ahead of the broker's clock",
                    ErrorCode.INVALID_TIMESTAMP,
                )
            if self.before_max_ms < NO_LIMIT_MS:  # records decoded only when a topic sets it
                timestamps = await _read_records(record_timestamps, batch, header)
                stamps = [t for _, t in timestamps if t != NO_TIMESTAMP]
                if stamps and min(stamps) < now_ms - self.before_max_ms:
                    raise KafkaError(
                        f"timestamp {min(stamps)} is more than message.timestamp.before.max.ms="
                        f"{self.before_max_ms} behind the broker's clock",
                        ErrorCode.INVALID_TIMESTAMP,
                    )


class KeylessRecords(KafkaError):
    """Records without a key sent to a compacted topic (``indexes``: in their batch)."""

    code = ErrorCode.INVALID_RECORD

    def __init__(self, indexes: list[int]) -> None:
        super().__init__("Compacted topic cannot accept message without key")
        self.indexes = indexes

    def refusal(self, tp: tuple[str, int]) -> Refusal:
        """Kafka's answer word for word (``LogValidator.validateKey``, ``processRecordErrors``),
        so clients that show ``error_message`` or ``record_errors`` show what Kafka's would."""
        reason = (
            f"Compacted topic cannot accept message without key in topic partition {tp[0]}-{tp[1]}."
        )
        errors = [(index, reason) for index in self.indexes]
        shown = ", ".join(f"RecordError(batchIndex={i}, message='{m}')" for i, m in errors[:3])
        message = (
            f"One or more records have been rejected due to {len(errors)} record errors in "
            f"total, and only showing the first three errors at most: [{shown}]"
        )
        return Refusal(self.code, message, errors)


@dataclass(frozen=True)
class Refusal:
    """A partition's batch refused with a message and per-record errors for the response."""

    code: ErrorCode
    message: str
    record_errors: list[tuple[int, str]]


def request_bytes(request: Any) -> int:
    """The record bytes a produce request would add to the broker's buffers."""
    return sum(
        len(partition.records or b"")
        for topic in request.topic_data
        for partition in topic.partition_data
    )


async def _admit(ctx: RequestContext, size: int, timeout_ms: int | None) -> bool:
    """Take ``size`` bytes of the broker's produce budget (``max_buffered_produce_bytes``),
    waiting while it is spent; False if ``timeout_ms`` passed first. acks=0 waits as long as
    it takes: its connection's in-flight bounds then stop the socket being read (TCP
    back-pressure), where it used to grow the buffers without bound."""
    budget = ctx.broker.produce_budget
    if budget.try_take(size):  # the usual case: no timer to arm and cancel
        return True
    try:
        async with asyncio.timeout(None if timeout_ms is None else max(timeout_ms, 1) / 1000):
            await budget.take(size)
    except TimeoutError:
        return False
    return True


def _give_back_when_durable(
    ctx: RequestContext, size: int, acked: dict[tuple[str, int], Outcome]
) -> None:
    """Return the budget once every appended batch is flushed (or failed): a countdown in the
    futures' own callbacks, not a gathering future per request."""
    budget = ctx.broker.produce_budget
    futures = [f for f in acked.values() if isinstance(f, asyncio.Future)]
    if not futures:
        budget.give(size)
        return
    remaining = len(futures)

    def one_done(future: asyncio.Future[Ack]) -> None:
        nonlocal remaining
        if not future.cancelled():
            future.exception()  # seen here, as gather would mark it
        remaining -= 1
        if remaining == 0:
            budget.give(size)

    for future in futures:
        future.add_done_callback(one_done)


def _transactions_allowed(request: Any, ctx: RequestContext) -> bool:
    """A transactional id needs WRITE on it; transactional batches need a transactional id."""
    transactional_id = request.transactional_id
    if transactional_id:
        return access.allowed(ctx, Operation.WRITE, access.TRANSACTIONAL_ID, transactional_id)
    return not has_transactional_records(request)


def has_transactional_records(request: Any) -> bool:
    """True if some partition's first batch has the transactional bit (as Kafka's
    ``ProduceRequest.hasTransactionalRecords`` decides it: from the first batch)."""
    for topic in request.topic_data:
        for partition in topic.partition_data:
            records = partition.records
            if not records:
                continue
            try:
                if read_header(records).is_transactional:
                    return True
            except InvalidBatch:
                continue  # refused as CORRUPT_MESSAGE when appended
    return False


def stored_form(records: bytes | None, api_version: int) -> memoryview:
    """The records as v2 batches: a v0-v2 message set becomes one batch (CORRUPT_MESSAGE,
    via ``InvalidBatch``, if it does not parse or a CRC fails)."""
    if api_version >= FIRST_RECORD_BATCH_VERSION:
        return memoryview(records or b"")
    message_set = legacy_messages.parse_message_set(records or b"")
    return memoryview(legacy_messages.to_record_batch(message_set))


def check_not_control(headers: list[BatchHeader]) -> None:
    """INVALID_RECORD for a control batch: only a transaction coordinator writes those."""
    if any(header.is_control for header in headers):
        raise KafkaError(
            "clients are not allowed to write control records", ErrorCode.INVALID_RECORD
        )


Outcome = asyncio.Future[Ack] | ErrorCode | Refusal | KafkaError


async def _append_all(request: Any, ctx: RequestContext) -> dict[tuple[str, int], Outcome]:
    """Append every partition's batches; each outcome is a future (acked) or an error code."""
    manager = ctx.broker.log_manager
    outcomes: dict[tuple[str, int], Outcome] = {}
    checks = await verify_transactional(request, ctx)  # KIP-890: before anything is appended
    now_ms = int(time.time() * 1000)
    for topic in request.topic_data:
        rules = TopicRules.of(ctx, topic.name)
        denied = access.topic_denied(ctx, Operation.WRITE, topic.name)
        for partition in topic.partition_data:
            tp = (topic.name, int(partition.index))
            if denied is not None:
                outcomes[tp] = denied
                continue
            try:
                batches = split_batches(stored_form(partition.records, ctx.api_version))
                owned = await manager.owned_partition(tp)
                try:
                    headers = [read_header(batch) for batch in batches]
                    check_not_control(headers)
                    await rules.check(batches, headers, now_ms)  # may read records in a thread
                except BaseException:
                    forget(checks.get(tp))
                    raise
                # KIP-890: from the guard's check to the append, no await (a marker that came
                # while the records were read voids the guard, and is seen here)
                confirm(checks.get(tp), owned)
                stamped = list(zip(batches, headers, strict=True))
                append_time = NO_APPEND_TIME
                if rules.log_append_time:
                    append_time = now_ms
                    stamped = [with_log_append_time(b, now_ms) for b in batches]
                try:
                    futures = [owned.append(b, header, append_time) for b, header in stamped]
                finally:
                    manager.appended(owned)  # schedules a round for what was appended
                METRICS.produced_batches(tp[0], batches, headers)
                outcomes[tp] = futures[0] if len(futures) == 1 else _first_ack(futures)
            except InvalidBatch:
                outcomes[tp] = ErrorCode.CORRUPT_MESSAGE
            except KeylessRecords as exc:
                outcomes[tp] = exc.refusal(tp)
            except KafkaError as exc:
                outcomes[tp] = exc  # its code answers; its text is what the log says why
    return outcomes


def _first_ack(futures: list[asyncio.Future[Ack]]) -> asyncio.Future[Ack]:
    """A future for the first batch's ack, done when all batches are durable."""

    async def wait_all() -> Ack:
        acks = await asyncio.gather(*futures)
        return acks[0]

    return asyncio.ensure_future(wait_all())


async def _response(
    request: Any,
    ctx: RequestContext,
    acked: dict[tuple[str, int], Outcome],
    timeout_ms: int,
) -> Body:
    futures = [f for f in acked.values() if isinstance(f, asyncio.Future)]
    if futures:
        await asyncio.wait(futures, timeout=max(timeout_ms, 1) / 1000)
    responses = []
    for topic in request.topic_data:
        partitions = []
        for partition in topic.partition_data:
            tp = (topic.name, int(partition.index))
            partitions.append(_partition_result(ctx, tp, acked[tp]))
        responses.append({"name": topic.name, "partition_responses": partitions})
    return {"responses": responses, "throttle_time": 0}


def _partition_result(ctx: RequestContext, tp: tuple[str, int], outcome: Outcome) -> Body:
    ack = Ack(-1, NO_APPEND_TIME)
    refusal = outcome if isinstance(outcome, Refusal) else None
    reason = ""
    if isinstance(outcome, ErrorCode):
        code = outcome
    elif isinstance(outcome, Refusal):
        code, reason = outcome.code, outcome.message
    elif isinstance(outcome, KafkaError):
        code, reason = outcome.code, str(outcome)
    elif not outcome.done():
        outcome.add_done_callback(_consume_outcome)
        code, reason = ErrorCode.REQUEST_TIMED_OUT, "not durable within the request's timeout"
    elif (error := outcome.exception()) is not None:
        code, reason = code_for(error), str(error)
    else:
        code = ErrorCode.NONE
        ack = outcome.result()
    log_refusal(tp[0], tp[1], code, reason, ctx.connection.peer)
    result: Body = {
        "index": tp[1],
        "error_code": code,
        "base_offset": ack.offset,
        "log_append_time": ack.append_time,
        "log_start_offset": ctx.broker.committed_state(tp).log_start_offset,
    }
    if refusal is not None:  # fields of Produce v8+; older versions leave them out
        result["error_message"] = refusal.message
        result["record_errors"] = [
            {"batch_index": index, "batch_index_error_message": message}
            for index, message in refusal.record_errors
        ]
    if code == ErrorCode.NOT_LEADER_OR_FOLLOWER:
        leader = ctx.broker.leader_for(tp)
        epoch = ctx.broker.committed_state(tp).leader_epoch
        result["current_leader"] = {"leader_id": leader, "leader_epoch": epoch}
    return result


def _consume_outcome(future: asyncio.Future[Ack]) -> None:
    """Nobody awaits acks=0 or timed-out outcomes; mark their errors as seen."""
    if not future.cancelled():
        future.exception()
