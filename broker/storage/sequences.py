"""Idempotent-producer sequence checks: a retried batch is acked once and stored once.

Pure decision: given what the partition remembers about a producer and the incoming batch's
(producer epoch, first and last sequence), decide to append it, to answer it as a duplicate
with the offset it got the first time, or to reject it with Kafka's error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kafscale.broker.metadata.partition_state import ProducerState
from kafscale.broker.protocol.errors import ErrorCode

RECENT_BATCHES = 5  # Kafka keeps the last five batches per producer (max.in.flight <= 5)
_SEQUENCE_LIMIT = 2**31


@dataclass(frozen=True, slots=True)
class Append:
    pass


@dataclass(frozen=True, slots=True)
class Duplicate:
    offset: int
    append_time: int = -1  # the first attempt's log append time (LogAppendTime topics)


@dataclass(frozen=True, slots=True)
class Reject:
    code: ErrorCode


SequenceDecision = Append | Duplicate | Reject


def check_sequence(
    recent: Sequence[ProducerState], epoch: int, first_seq: int, last_seq: int
) -> SequenceDecision:
    """``recent``: this producer's last batches on the partition, oldest first (may be empty)."""
    if not recent:
        return Append()  # unknown producer here: accept (as Kafka does after state expiry)
    latest = recent[-1]
    if epoch < latest.epoch:
        return Reject(ErrorCode.INVALID_PRODUCER_EPOCH)
    if epoch > latest.epoch:
        return Append() if first_seq == 0 else Reject(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
    for batch in recent:
        if batch.first_seq == first_seq and batch.last_seq == last_seq:
            return Duplicate(batch.offset, batch.append_time)
    if first_seq == (latest.last_seq + 1) % _SEQUENCE_LIMIT:
        return Append()
    return Reject(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
