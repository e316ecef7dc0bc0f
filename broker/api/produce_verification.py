"""Produce's transaction check (KIP-890), before any batch of the request is appended.

A partition whose first batch is transactional, from a producer with no transaction open on the
partition, would open one: the owner first asks the coordinator
(:mod:`kafscale.broker.transactions.verification`) whether the partition is in the producer's
ongoing transaction (part 1), or, for Produce v12+ (transaction protocol v2, whose producers
send no AddPartitionsToTxn), has the coordinator add it (part 2). One question per request
(every such partition at once); a producer whose transaction is already open on the partition
(all its later batches) asks nothing.

The answer holds only if no marker for the producer reached the partition while the question
was out: the partition keeps a guard per producer that markers remove
(``OwnedPartition.begin_verification``), checked again right before the append. Likewise a
partition that needed no question because the producer's transaction was open on it: a marker
that ends that transaction before the append (a coordinator's timeout abort while the batch was
on its way) makes the batch late, and it is refused, as Kafka refuses a transactional batch
that is neither in an ongoing transaction nor verified; appended, it would open a transaction
no marker ends.

Two more ways a batch once reached the log unverified, each leaving a transaction open for
good (``bench/chaos_txn.py --via-proxy``): a partition not owned here when the request was
checked, taken over before the append (its check's code now stands), and a batch of a newer
producer epoch than the transaction open on the partition, taken as continuing it (see
``continuing``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import RequestContext
from kafscale.broker.authz.model import Operation
from kafscale.broker.protocol.errors import ErrorCode, KafkaError
from kafscale.broker.protocol.record_batch import BatchHeader, InvalidBatch, read_header
from kafscale.broker.storage.partition_log import OwnedPartition
from kafscale.broker.transactions.verification import produce_error

TopicPartition = tuple[str, int]
FIRST_RECORD_BATCH_VERSION = 3  # older Produce versions carry no transactional batches
TRANSACTION_V2_PRODUCE = 12  # the partition is added to the transaction by its owner


@dataclass(frozen=True, slots=True)
class Verified:
    """The coordinator said yes; ``guard`` says whether that still holds at the append."""

    owned: OwnedPartition
    producer_id: int
    guard: object


@dataclass(frozen=True, slots=True)
class Ongoing:
    """No question asked: the producer's transaction was open on the partition."""

    producer_id: int


Verification = Verified | Ongoing | ErrorCode


async def verify_transactional(
    request: Any, ctx: RequestContext
) -> dict[TopicPartition, Verification]:
    """Per partition whose batches would open a transaction: verified, or the code to answer.
    Partitions not listed need no check."""
    if ctx.api_version < FIRST_RECORD_BATCH_VERSION:
        return {}  # message sets (v0-v2) have no transactional id nor transactional batches
    txn = ctx.broker.transactions
    transactional_id = request.transactional_id
    add = ctx.api_version >= TRANSACTION_V2_PRODUCE
    if not transactional_id or txn is None or not (add or txn.settings.partition_verification):
        return {}
    checks: dict[TopicPartition, Verification] = {}
    opening = await _opening(request, ctx, checks)
    for (producer_id, epoch), pending in _by_producer(opening).items():
        codes = await txn.verifier.verify(
            transactional_id, producer_id, epoch, list(pending), add=add
        )
        for tp, verified in pending.items():
            code = codes.get(tp, ErrorCode.NOT_ENOUGH_REPLICAS)
            if code is ErrorCode.NONE:
                checks[tp] = verified
            else:
                verified.owned.end_verification(producer_id, verified.guard)
                checks[tp] = code
    return checks


async def _opening(
    request: Any, ctx: RequestContext, ongoing: dict[TopicPartition, Verification]
) -> dict[TopicPartition, tuple[BatchHeader, Verified]]:
    """The partitions whose first batch would open a transaction, each with a guard taken;
    those whose batches continue an open transaction go to ``ongoing``."""
    manager = ctx.broker.log_manager
    opening: dict[TopicPartition, tuple[BatchHeader, Verified]] = {}
    for topic in request.topic_data:
        if access.topic_denied(ctx, Operation.WRITE, topic.name) is not None:
            continue  # refused by the append
        for partition in topic.partition_data:
            header = _first_header(partition.records)
            if header is None or not header.is_transactional or header.producer_id < 0:
                continue
            tp = (str(topic.name), int(partition.index))
            try:
                owned = await manager.owned_partition(tp)
            except KafkaError as exc:
                # Not the owner (or unknown) now: refused with that code, even if the partition
                # becomes ours before the append (claimed while other partitions of the request
                # were verified). Appended unverified, the batch opened a transaction the
                # coordinator never heard of: no marker would ever end it.
                ongoing[tp] = exc.code
                continue
            if header.producer_id in owned.open_txns:
                ongoing[tp] = continuing(owned, header, ctx.api_version >= TRANSACTION_V2_PRODUCE)
                continue
            guard = owned.begin_verification(header.producer_id)
            opening[tp] = (header, Verified(owned, header.producer_id, guard))
    return opening


def continuing(owned: OwnedPartition, header: BatchHeader, transaction_v2: bool) -> Verification:
    """A batch of a producer whose transaction is open on the partition: it continues that
    transaction only at the same producer epoch. A newer epoch (transaction protocol v2 bumps
    it at every EndTxn) is the producer's next transaction while the open one's marker has not
    reached the partition yet: retriable (CONCURRENT_TRANSACTIONS for v2 clients, as a commit
    still being completed), never appended to the older transaction, whose marker would then
    end it with the older outcome, and which the newer one would never be added to, nor give
    a marker. An older epoch is refused by the append's sequence check."""
    recent = owned.recent.get(header.producer_id)
    if recent and header.producer_epoch > recent[-1].epoch:
        return produce_error(ErrorCode.CONCURRENT_TRANSACTIONS, transaction_v2)
    return Ongoing(header.producer_id)


def _by_producer(
    opening: dict[TopicPartition, tuple[BatchHeader, Verified]],
) -> dict[tuple[int, int], dict[TopicPartition, Verified]]:
    grouped: dict[tuple[int, int], dict[TopicPartition, Verified]] = {}
    for tp, (header, verified) in opening.items():
        key = (header.producer_id, header.producer_epoch)
        grouped.setdefault(key, {})[tp] = verified
    return grouped


def _first_header(records: bytes | None) -> BatchHeader | None:
    if not records:
        return None
    try:
        return read_header(records)
    except InvalidBatch:
        return None  # refused as CORRUPT_MESSAGE by the append


def confirm(check: Verification | None, owned: OwnedPartition) -> None:
    """Right before the append: raise the partition's code unless its check (if it needed
    one) still holds on the partition about to be written."""
    if check is None:
        return
    if isinstance(check, ErrorCode):
        raise KafkaError(_message(check), check)
    if isinstance(check, Ongoing):
        if check.producer_id not in owned.open_txns:
            raise KafkaError(
                "the transaction ended before the batch was appended", ErrorCode.INVALID_TXN_STATE
            )
        return
    if check.owned is not owned:
        raise KafkaError(
            "the partition changed hands while its transaction was verified",
            ErrorCode.NOT_ENOUGH_REPLICAS,
        )
    if not owned.end_verification(check.producer_id, check.guard):
        raise KafkaError(
            "the transaction ended while the partition was verified", ErrorCode.INVALID_TXN_STATE
        )


def forget(check: Verification | None) -> None:
    """Drop the guard of a check whose batch is refused before ``confirm`` (a bad batch):
    guards live until a marker for the producer, so one per refused request would pile up."""
    if isinstance(check, Verified):
        check.owned.end_verification(check.producer_id, check.guard)


def _message(code: ErrorCode) -> str:
    if code is ErrorCode.INVALID_TXN_STATE:
        return "Partition was not added to the transaction"
    if code is ErrorCode.CONCURRENT_TRANSACTIONS:
        return "the producer's previous transaction is still being completed on the partition"
    return f"Unable to verify the partition has been added to the transaction: {code.name}"
