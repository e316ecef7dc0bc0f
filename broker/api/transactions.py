"""Transaction APIs: InitProducerId with a transactional id, AddPartitionsToTxn, AddOffsetsToTxn,
EndTxn, TxnOffsetCommit, DescribeTransactions and ListTransactions.

Handlers translate between the wire (every version's fields) and the transaction coordinator
(``kafscale.broker.transactions``); the state machine decides. TxnOffsetCommit goes to the
group's coordinator, which checks the transaction in etcd and writes the offsets as pending
until the transaction coordinator completes it. Errors follow Kafka: NOT_COORDINATOR when the
transactional id's lease is elsewhere, COORDINATOR_NOT_AVAILABLE when etcd cannot answer,
PRODUCER_FENCED (INVALID_PRODUCER_EPOCH for clients older than KIP-588) for a stale epoch.
"""

from __future__ import annotations

import re
from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.api.error_bodies import (
    add_partitions_results,
    txn_offset_commit_error_body,
)
from kafscale.broker.api.group_access import group_runtime
from kafscale.broker.api.group_offsets import OFFSET_METADATA_MAX_BYTES
from kafscale.broker.authz.model import Operation
from kafscale.broker.groups.store import CommittedOffset, TopicPartition
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.protocol.codec import millis
from kafscale.broker.protocol.errors import ErrorCode, KafkaError
from kafscale.broker.transactions.coordinator import (
    EndResult,
    InitResult,
    TransactionCoordinator,
    now_ms,
)
from kafscale.broker.transactions.state import TxnMetadata, TxnState, check_producer, wire_error

WRITE, DESCRIBE, READ = Operation.WRITE, Operation.DESCRIBE, Operation.READ
_TXN_OFFSET_COMMIT_ATTEMPTS = 3
TRANSACTION_V2_END_TXN = 5  # EndTxn v5: the epoch bump of transaction protocol v2 (KIP-890)
TRANSACTION_V2_TXN_OFFSET_COMMIT = 5  # TxnOffsetCommit v5: the group is added implicitly


def coordinator(ctx: RequestContext) -> TransactionCoordinator:
    txn = ctx.broker.transactions
    if txn is None:
        raise KafkaError("the transaction coordinator is not running", ErrorCode.NOT_COORDINATOR)
    return txn


async def _code_of(ctx: RequestContext, call: Any) -> ErrorCode:
    """Run a coordinator call, its failures as codes (as the client must see them)."""
    try:
        result: ErrorCode = await call
    except MetadataUnavailable:
        result = ErrorCode.COORDINATOR_NOT_AVAILABLE
    except KafkaError as exc:
        result = exc.code
    return wire_error(result, ctx.header.api_key, ctx.api_version)


# --- InitProducerId ---------------------------------------------------------------------------


async def handle_init_transactional(request: Any, ctx: RequestContext) -> Body:
    txn_id = str(request.transactional_id)
    result = InitResult(ErrorCode.NONE)
    if not access.allowed(ctx, WRITE, access.TRANSACTIONAL_ID, txn_id):
        result = InitResult(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    else:
        try:
            result = await coordinator(ctx).init_producer_id(
                txn_id,
                millis(request.transaction_timeout),
                int(getattr(request, "producer_id", -1)),
                int(getattr(request, "producer_epoch", -1)),
            )
        except MetadataUnavailable:
            result = InitResult(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        except KafkaError as exc:
            result = InitResult(exc.code)
    return {
        "throttle_time": 0,
        "error_code": wire_error(result.error, 22, ctx.api_version),
        "producer_id": result.producer_id,
        "producer_epoch": result.producer_epoch,
    }


# --- AddPartitionsToTxn, AddOffsetsToTxn, EndTxn ----------------------------------------------


async def handle_add_partitions_to_txn(request: Any, ctx: RequestContext) -> Body:
    if ctx.api_version <= 3:
        topics = await _add_partitions(
            ctx,
            str(request.v3_and_below_transactional_id),
            int(request.v3_and_below_producer_id),
            int(request.v3_and_below_producer_epoch),
            request.v3_and_below_topics,
        )
        return {"throttle_time": 0, "results_by_topic_v3_and_below": topics}
    results = []
    for txn in request.transactions:
        topics = await _add_partitions(
            ctx,
            str(txn.transactional_id),
            int(txn.producer_id),
            int(txn.producer_epoch),
            txn.topics,
            verify_only=bool(txn.verify_only),
        )
        results.append({"transactional_id": txn.transactional_id, "topic_results": topics})
    return {"throttle_time": 0, "error_code": ErrorCode.NONE, "results_by_transaction": results}


async def _add_partitions(
    ctx: RequestContext,
    txn_id: str,
    producer_id: int,
    epoch: int,
    topics: Any,
    verify_only: bool = False,
) -> list[Body]:
    asked = [(str(t.name), int(p)) for t in topics for p in t.partitions]
    codes = {tp: _partition_problem(ctx, tp) for tp in asked}
    if not access.allowed(ctx, WRITE, access.TRANSACTIONAL_ID, txn_id):
        codes = dict.fromkeys(asked, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    elif any(code is not ErrorCode.NONE for code in codes.values()):
        # Kafka adds nothing when one partition is refused: the others were not attempted.
        codes = {tp: code or ErrorCode.OPERATION_NOT_ATTEMPTED for tp, code in codes.items()}
    elif verify_only:
        codes = await _verify(ctx, txn_id, producer_id, epoch, asked)
    else:
        call = coordinator(ctx).add(txn_id, producer_id, epoch, partitions=asked)
        codes = dict.fromkeys(asked, await _code_of(ctx, call))
    return add_partitions_results(codes)


def _partition_problem(ctx: RequestContext, tp: TopicPartition) -> ErrorCode:
    topic, partition = tp
    if not access.allowed(ctx, WRITE, access.TOPIC, topic):
        return ErrorCode.TOPIC_AUTHORIZATION_FAILED
    info = ctx.broker.view.topics.get(topic)
    if info is None or not 0 <= partition < info.partitions:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    return ErrorCode.NONE


async def _verify(
    ctx: RequestContext, txn_id: str, producer_id: int, epoch: int, asked: list[TopicPartition]
) -> dict[TopicPartition, ErrorCode]:
    """v4 ``verify_only``: whether each partition is in the producer's ongoing transaction."""
    try:
        return await coordinator(ctx).verify(txn_id, producer_id, epoch, asked)
    except MetadataUnavailable:
        return dict.fromkeys(asked, ErrorCode.COORDINATOR_NOT_AVAILABLE)
    except KafkaError as exc:
        return dict.fromkeys(asked, exc.code)


async def handle_add_offsets_to_txn(request: Any, ctx: RequestContext) -> Body:
    txn_id, group_id = str(request.transactional_id), str(request.group_id)
    if not access.allowed(ctx, WRITE, access.TRANSACTIONAL_ID, txn_id):
        code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    elif not access.allowed(ctx, READ, access.GROUP, group_id):
        code = ErrorCode.GROUP_AUTHORIZATION_FAILED
    else:
        call = coordinator(ctx).add(
            txn_id, int(request.producer_id), int(request.producer_epoch), groups=[group_id]
        )
        code = await _code_of(ctx, call)
    return {"throttle_time": 0, "error_code": code}


async def handle_end_txn(request: Any, ctx: RequestContext) -> Body:
    """v5 (transaction protocol v2): the epoch is bumped with every decision and the answer
    carries the producer id and epoch to use next."""
    txn_id = str(request.transactional_id)
    result = EndResult(ErrorCode.NONE)
    if not access.allowed(ctx, WRITE, access.TRANSACTIONAL_ID, txn_id):
        result = EndResult(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    else:
        try:
            result = await coordinator(ctx).end(
                txn_id,
                int(request.producer_id),
                int(request.producer_epoch),
                bool(request.committed),
                bump=ctx.api_version >= TRANSACTION_V2_END_TXN,
            )
        except MetadataUnavailable:
            result = EndResult(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        except KafkaError as exc:
            result = EndResult(exc.code)
    return {
        "throttle_time": 0,
        "error_code": wire_error(result.error, 26, ctx.api_version),
        "producer_id": result.producer_id,
        "producer_epoch": result.producer_epoch,
    }


# --- TxnOffsetCommit (on the group coordinator) -------------------------------------------------


async def handle_txn_offset_commit(request: Any, ctx: RequestContext) -> Body:
    txn_id, group_id = str(request.transactional_id), str(request.group_id)
    # As Kafka checks: the transactional id, then the group, refuse the whole request.
    refused = None
    if not access.allowed(ctx, WRITE, access.TRANSACTIONAL_ID, txn_id):
        refused = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    elif not access.allowed(ctx, READ, access.GROUP, group_id):
        refused = ErrorCode.GROUP_AUTHORIZATION_FAILED
    if refused is not None:
        return txn_offset_commit_error_body(request, refused)
    offsets: dict[TopicPartition, CommittedOffset] = {}
    codes: dict[TopicPartition, ErrorCode] = {}
    for topic in request.topics:
        for part in topic.partitions:
            tp = (str(topic.name), int(part.partition_index))
            metadata = part.committed_metadata or ""
            if len(metadata.encode()) > OFFSET_METADATA_MAX_BYTES:
                codes[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
                continue
            if not access.allowed(ctx, READ, access.TOPIC, tp[0]):
                codes[tp] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                continue
            info = ctx.broker.view.topics.get(tp[0])
            if info is None:
                codes[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            offsets[tp] = CommittedOffset(
                offset=int(part.committed_offset),
                leader_epoch=int(getattr(part, "committed_leader_epoch", -1)),
                metadata=metadata,
                topic_id=info.topic_id,
            )
    if not offsets:
        code = ErrorCode.NONE
    else:
        code = await _commit_pending(ctx, request, txn_id, group_id, offsets)
    code = wire_error(code, 28, ctx.api_version)
    codes.update(dict.fromkeys(offsets, code))
    by_topic: dict[str, list[Body]] = {}
    for (topic, partition), error in codes.items():
        by_topic.setdefault(topic, []).append({"partition_index": partition, "error_code": error})
    return {
        "throttle_time": 0,
        "topics": [{"name": name, "partitions": parts} for name, parts in by_topic.items()],
    }


async def _commit_pending(
    ctx: RequestContext,
    request: Any,
    txn_id: str,
    group_id: str,
    offsets: dict[TopicPartition, CommittedOffset],
) -> ErrorCode:
    try:
        runtime = await group_runtime(ctx, group_id, ErrorCode.COORDINATOR_NOT_AVAILABLE, READ)
    except KafkaError as exc:
        return exc.code
    error = runtime.validate_txn_commit(
        str(getattr(request, "member_id", "")),
        getattr(request, "group_instance_id", None),
        int(getattr(request, "generation_id", -1)),
    )
    if error is not ErrorCode.NONE:
        return error
    if ctx.api_version >= TRANSACTION_V2_TXN_OFFSET_COMMIT:  # no AddOffsetsToTxn with v2
        error = await coordinator(ctx).verifier.add_group(
            txn_id, int(request.producer_id), int(request.producer_epoch), group_id
        )
        if error is not ErrorCode.NONE:
            return error
    store = coordinator(ctx).store
    producer_id, producer_epoch = int(request.producer_id), int(request.producer_epoch)

    async def write() -> ErrorCode:
        """Pending offsets into etcd while the transaction is the one checked."""
        for _ in range(_TXN_OFFSET_COMMIT_ATTEMPTS):
            stored = await store.load(txn_id)
            meta = stored.metadata if stored is not None else None
            error = check_producer(meta, producer_id, producer_epoch)
            if error is not ErrorCode.NONE:
                return error
            assert stored is not None and meta is not None
            if meta.state is not TxnState.ONGOING or group_id not in meta.groups:
                return ErrorCode.INVALID_TXN_STATE  # AddOffsetsToTxn first
            if await store.save_pending_offsets(group_id, stored, offsets, runtime.fence):
                return ErrorCode.NONE
            if runtime.closed:
                return ErrorCode.NOT_COORDINATOR
        return ErrorCode.CONCURRENT_TRANSACTIONS

    try:
        return await runtime.add_pending(offsets, write)
    except MetadataUnavailable:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE


# --- DescribeTransactions, ListTransactions ---------------------------------------------------


async def handle_describe_transactions(request: Any, ctx: RequestContext) -> Body:
    states = [await _describe_one(ctx, str(txn_id)) for txn_id in request.transactional_ids]
    return {"throttle_time": 0, "transaction_states": states}


async def _describe_one(ctx: RequestContext, txn_id: str) -> Body:
    entry: Body = {
        "error_code": ErrorCode.NONE,
        "transactional_id": txn_id,
        "transaction_state": "",
        "transaction_timeout": 0,
        "transaction_start_time": -1,
        "producer_id": -1,
        "producer_epoch": -1,
        "topics": [],
    }
    if not access.allowed(ctx, DESCRIBE, access.TRANSACTIONAL_ID, txn_id):
        return {**entry, "error_code": ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
    try:
        meta = await coordinator(ctx).describe(txn_id)
    except MetadataUnavailable:
        return {**entry, "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE}
    except KafkaError as exc:
        return {**entry, "error_code": exc.code}
    if meta is None:
        return {**entry, "error_code": ErrorCode.TRANSACTIONAL_ID_NOT_FOUND}
    return {**entry, **_described(meta)}


def _described(meta: TxnMetadata) -> Body:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(meta.partitions):
        by_topic.setdefault(topic, []).append(partition)
    return {
        "transaction_state": meta.state.value,
        "transaction_timeout": meta.timeout_ms,
        "transaction_start_time": meta.start_ms,
        "producer_id": meta.producer_id,
        "producer_epoch": meta.producer_epoch,
        "topics": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
    }


KNOWN_STATES = {state.value for state in TxnState}


async def handle_list_transactions(request: Any, ctx: RequestContext) -> Body:
    state_filters = [str(s) for s in getattr(request, "state_filters", ())]
    unknown = [s for s in state_filters if s not in KNOWN_STATES]
    producers = {int(p) for p in getattr(request, "producer_id_filters", ())}
    duration_ms = int(getattr(request, "duration_filter", -1))
    pattern = getattr(request, "transactional_id_pattern", None)
    try:
        matcher = re.compile(pattern) if pattern else None
    except re.error:
        return {"throttle_time": 0, "error_code": ErrorCode.INVALID_REQUEST,
                "unknown_state_filters": [], "transaction_states": []}  # fmt: skip
    try:
        listed = await coordinator(ctx).list_coordinated()
    except MetadataUnavailable:
        listed, code = [], ErrorCode.COORDINATOR_NOT_AVAILABLE
    else:
        code = ErrorCode.NONE
    now = now_ms()
    states = [
        {
            "transactional_id": meta.transactional_id,
            "producer_id": meta.producer_id,
            "transaction_state": meta.state.value,
        }
        for meta in listed
        if (not state_filters or meta.state.value in state_filters)
        and (not producers or meta.producer_id in producers)
        and (duration_ms < 0 or (meta.start_ms >= 0 and now - meta.start_ms >= duration_ms))
        and (matcher is None or matcher.fullmatch(meta.transactional_id) is not None)
        and access.allowed(ctx, DESCRIBE, access.TRANSACTIONAL_ID, meta.transactional_id)
    ]
    return {
        "throttle_time": 0,
        "error_code": code,
        "unknown_state_filters": unknown,
        "transaction_states": states,
    }


# --- error bodies (a request that failed as a whole) ------------------------------------------
