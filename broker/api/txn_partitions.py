"""The partition side of transactions: WriteTxnMarkers (27) and DescribeProducers (61).

WriteTxnMarkers is what a transaction coordinator sends each partition's owner when a
transaction ends. The owner appends the commit or abort control batch through the normal
append and fenced flush path and answers once it is committed in etcd (acks=all semantics):
the coordinator may then call the transaction complete. Markers of one request are appended in
request order. A broker that does not own the partition answers NOT_LEADER_OR_FOLLOWER, like
Produce (a partition nobody holds is claimed on demand, as Produce claims it).

A coordinator writes the markers of partitions it owns itself without a connection
(``write_markers_here``, as its partition checks are answered in place): the same append, with
no login to itself to need. A single broker whose listeners all need SASL (``kafscale local
--listeners SASL_SSL://...``) has no inter-broker credentials to log in with; its transactions
never completed.

DescribeProducers reports, from the owner's committed state, what the partition remembers of
each producer (``kafka-transactions.sh describe-producers``, finding hanging transactions).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.authz.model import Operation
from kafscale.broker.metadata.partition_state import PartitionState
from kafscale.broker.protocol.errors import ErrorCode, KafkaError, code_for
from kafscale.broker.storage.partition_log import Ack
from kafscale.broker.transactions.markers import Marker

if TYPE_CHECKING:
    from kafscale.broker.app import Broker

TopicPartition = tuple[str, int]
Outcome = asyncio.Future[Ack] | ErrorCode


async def handle_write_txn_markers(request: Any, ctx: RequestContext) -> Body:
    allowed = access.allowed_on_cluster(ctx, Operation.CLUSTER_ACTION)
    outcomes: list[list[tuple[str, list[tuple[int, Outcome]]]]] = []
    for marker in request.markers:
        topics = []
        for topic in marker.topics:
            partitions = []
            for index in topic.partition_indexes:
                tp = (topic.name, int(index))
                if not allowed:
                    outcome: Outcome = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
                else:
                    outcome = await _append_marker(tp, _marker(marker), ctx.broker)
                partitions.append((int(index), outcome))
            topics.append((topic.name, partitions))
        outcomes.append(topics)
    futures = [
        outcome
        for topics in outcomes
        for _, partitions in topics
        for _, outcome in partitions
        if isinstance(outcome, asyncio.Future)
    ]
    await asyncio.gather(*futures, return_exceptions=True)
    return {
        "markers": [
            {
                "producer_id": int(marker.producer_id),
                "topics": [
                    {
                        "name": name,
                        "partitions": [
                            {"partition_index": index, "error_code": _code(outcome)}
                            for index, outcome in partitions
                        ],
                    }
                    for name, partitions in topics
                ],
            }
            for marker, topics in zip(request.markers, outcomes, strict=True)
        ]
    }


async def write_markers_here(
    broker: Broker, marker: Marker, partitions: list[TopicPartition]
) -> dict[TopicPartition, ErrorCode]:
    """The coordinator's markers for partitions this broker owns: appended as
    WriteTxnMarkers appends them, each partition's code once durable (or refused)."""
    outcomes = [await _append_marker(tp, marker, broker) for tp in partitions]
    futures = [outcome for outcome in outcomes if isinstance(outcome, asyncio.Future)]
    await asyncio.gather(*futures, return_exceptions=True)
    return {tp: _code(outcome) for tp, outcome in zip(partitions, outcomes, strict=True)}


def _marker(entry: Any) -> Marker:
    """A WriteTxnMarkers entry as the coordinator's marker."""
    return Marker(
        producer_id=int(entry.producer_id),
        producer_epoch=int(entry.producer_epoch),
        commit=bool(entry.transaction_result),
        coordinator_epoch=int(entry.coordinator_epoch),
    )


async def _append_marker(tp: TopicPartition, marker: Marker, broker: Broker) -> Outcome:
    """The marker's future (done once durable), or the partition's error code; a partition
    where the producer has nothing open is done at once."""
    info = broker.view.topics.get(tp[0])
    if info is None or not 0 <= tp[1] < info.partitions:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    manager = broker.log_manager
    try:
        owned = await manager.owned_partition(tp)
        acked = owned.append_marker(
            marker.producer_id,
            marker.producer_epoch,
            marker.commit,
            marker.coordinator_epoch,
            int(time.time() * 1000),
        )
    except KafkaError as exc:
        return exc.code
    if acked is None:
        return ErrorCode.NONE
    manager.appended(owned)
    return acked


def _code(outcome: Outcome) -> ErrorCode:
    if isinstance(outcome, ErrorCode):
        return outcome
    error = outcome.exception()
    return ErrorCode.NONE if error is None else code_for(error)


# --- DescribeProducers -------------------------------------------------------------------------


async def handle_describe_producers(request: Any, ctx: RequestContext) -> Body:
    topics = []
    for topic in request.topics:
        denied = access.topic_denied(ctx, Operation.READ, topic.name)
        partitions = [
            await _describe_partition((topic.name, int(index)), denied, ctx)
            for index in topic.partition_indexes
        ]
        topics.append({"name": topic.name, "partitions": partitions})
    return {"throttle_time": 0, "topics": topics}


async def _describe_partition(
    tp: TopicPartition, denied: ErrorCode | None, ctx: RequestContext
) -> Body:
    body: Body = {"partition_index": tp[1], "error_code": ErrorCode.NONE, "active_producers": []}
    info = ctx.broker.view.topics.get(tp[0])
    if denied is None and (info is None or not 0 <= tp[1] < info.partitions):
        denied = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if denied is not None:
        return {**body, "error_code": denied}
    try:
        owned = await ctx.broker.log_manager.owned_partition(tp)
    except KafkaError as exc:
        return {**body, "error_code": exc.code, "error_message": str(exc)}
    return {**body, "active_producers": describe_producers(owned.state)}


def describe_producers(state: PartitionState) -> list[Body]:
    """Each producer the partition remembers: its latest batch (or marker) and open
    transaction. Timestamps are not kept per producer: ``last_timestamp`` is -1."""
    producers = []
    for producer_id, batches in sorted(state.producers.items()):
        latest = batches[-1]
        producers.append(
            {
                "producer_id": producer_id,
                "producer_epoch": latest.epoch,
                "last_sequence": latest.last_seq,
                "last_timestamp": -1,
                "coordinator_epoch": state.coordinator_epochs.get(producer_id, -1),
                "current_txn_start_offset": state.open_txns.get(producer_id, -1),
            }
        )
    return producers
