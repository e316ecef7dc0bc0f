"""The transaction state machine: one transactional id's states, allowed moves and errors.

Pure: no I/O, clocks and fresh producer ids come in as arguments. The coordinator
(``transactions.coordinator``) loads a :class:`TxnMetadata` from etcd, asks a function here what
to do, and writes the answer back under its lease. Kafka's own states and error codes::

    EMPTY ──add partitions/offsets──▶ ONGOING ──EndTxn──▶ PREPARE_COMMIT ─markers─▶ COMPLETE_COMMIT
      ▲                                  │    └─EndTxn/timeout/InitProducerId─▶ PREPARE_ABORT
      └──────────── COMPLETE_* ◀─────────┘                       └─markers─▶ COMPLETE_ABORT

A PREPARE_* state is durable before any marker is written, so a coordinator that takes the
lease over finishes the transaction the same way (see ``recovery_action``).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from dataclasses import dataclass

from kafscale.broker.protocol.errors import ErrorCode

TopicPartition = tuple[str, int]

MAX_PRODUCER_EPOCH = 2**15 - 1
"""Epochs are i16 on the wire; at the last one a transactional id gets a new producer id."""
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1


class TxnState(enum.Enum):
    """Kafka's names: DescribeTransactions and ListTransactions report them as they are."""

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"

    @property
    def preparing(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @property
    def complete(self) -> bool:
        return self in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    """What etcd keeps per transactional id (``transactions/<id>``)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: frozenset[TopicPartition] = frozenset()
    groups: frozenset[str] = frozenset()
    start_ms: int = -1
    """When the ongoing transaction began (its first partition or group), -1 when none."""
    updated_ms: int = -1
    previous_producer_id: int = NO_PRODUCER_ID
    previous_epoch: int = NO_PRODUCER_EPOCH
    """Transaction protocol v2: the producer id and epoch the last EndTxn ended (its epoch was
    bumped), so that a retry of that EndTxn is recognised."""
    next_producer_id: int = NO_PRODUCER_ID
    """Transaction protocol v2: the producer id the transactional id moves to once this
    transaction completes, when the bump used the last epoch."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """A decision: an error for the client, or the metadata to write (None: nothing to write)."""

    error: ErrorCode = ErrorCode.NONE
    metadata: TxnMetadata | None = None


class InitAction(enum.Enum):
    NEW_PRODUCER_ID = "new producer id"
    BUMP_EPOCH = "bump epoch"
    ABORT_FIRST = "abort the ongoing transaction first"
    RETRY = "a commit or abort is being completed"
    REFUSE = "refuse"


@dataclass(frozen=True, slots=True)
class InitDecision:
    action: InitAction
    error: ErrorCode = ErrorCode.NONE


def decide_init(
    current: TxnMetadata | None, expected_producer_id: int, expected_epoch: int
) -> InitDecision:
    """InitProducerId with a transactional id. ``expected_*`` are KIP-360's (a producer that
    re-initialises itself names the id and epoch it had; -1 when it starts afresh)."""
    if current is None:
        return InitDecision(InitAction.NEW_PRODUCER_ID)
    if expected_producer_id != NO_PRODUCER_ID:
        same = (current.producer_id, current.producer_epoch) == (
            expected_producer_id,
            expected_epoch,
        )
        if not same:
            return InitDecision(InitAction.REFUSE, ErrorCode.PRODUCER_FENCED)
    if current.state.preparing:
        return InitDecision(InitAction.RETRY, ErrorCode.CONCURRENT_TRANSACTIONS)
    if current.state is TxnState.ONGOING:
        return InitDecision(InitAction.ABORT_FIRST)
    if current.producer_epoch >= MAX_PRODUCER_EPOCH - 1:
        return InitDecision(InitAction.NEW_PRODUCER_ID)
    return InitDecision(InitAction.BUMP_EPOCH)


def initialised(
    current: TxnMetadata | None,
    transactional_id: str,
    timeout_ms: int,
    now_ms: int,
    new_producer_id: int | None = None,
) -> TxnMetadata:
    """The metadata after InitProducerId: a fresh id at epoch 0, or the next epoch."""
    if new_producer_id is not None or current is None:
        assert new_producer_id is not None, "a new transactional id needs a producer id"
        producer_id, epoch = new_producer_id, 0
    else:
        producer_id, epoch = current.producer_id, current.producer_epoch + 1
    return TxnMetadata(
        transactional_id=transactional_id,
        producer_id=producer_id,
        producer_epoch=epoch,
        timeout_ms=timeout_ms,
        state=TxnState.EMPTY,
        updated_ms=now_ms,
    )


def check_producer(current: TxnMetadata | None, producer_id: int, epoch: int) -> ErrorCode:
    """Whether a request's producer id and epoch are the transactional id's current ones."""
    if current is None or current.producer_id != producer_id:
        return ErrorCode.INVALID_PRODUCER_ID_MAPPING
    if current.producer_epoch != epoch:
        return ErrorCode.PRODUCER_FENCED
    return ErrorCode.NONE


def verification_codes(
    current: TxnMetadata | None, producer_id: int, epoch: int, asked: Iterable[TopicPartition]
) -> dict[TopicPartition, ErrorCode]:
    """KIP-890's check for a partition owner about to open a transaction on a partition: the
    producer is the current one, its transaction is ongoing and the partition was added to it
    (INVALID_TXN_STATE otherwise: the batch would open a transaction nobody will end)."""
    error = check_producer(current, producer_id, epoch)
    if error is not ErrorCode.NONE:
        return dict.fromkeys(asked, error)
    assert current is not None
    ongoing = current.state is TxnState.ONGOING
    return {
        tp: ErrorCode.NONE if ongoing and tp in current.partitions else ErrorCode.INVALID_TXN_STATE
        for tp in asked
    }


def add_to_transaction(
    current: TxnMetadata | None,
    producer_id: int,
    epoch: int,
    now_ms: int,
    partitions: frozenset[TopicPartition] = frozenset(),
    groups: frozenset[str] = frozenset(),
) -> Outcome:
    """AddPartitionsToTxn / AddOffsetsToTxn: the transaction (begun if none) with them."""
    error = check_producer(current, producer_id, epoch)
    if error is not ErrorCode.NONE:
        return Outcome(error)
    assert current is not None
    if current.state.preparing:
        return Outcome(ErrorCode.CONCURRENT_TRANSACTIONS)
    if current.state is TxnState.ONGOING:
        if partitions <= current.partitions and groups <= current.groups:
            return Outcome()  # already in: nothing to write
        return Outcome(
            metadata=dataclasses.replace(
                current,
                partitions=current.partitions | partitions,
                groups=current.groups | groups,
                updated_ms=now_ms,
            )
        )
    return Outcome(
        metadata=dataclasses.replace(
            current,
            state=TxnState.ONGOING,
            partitions=partitions,
            groups=groups,
            start_ms=now_ms,
            updated_ms=now_ms,
        )
    )


def end_transaction(
    current: TxnMetadata | None,
    producer_id: int,
    epoch: int,
    commit: bool,
    now_ms: int,
    bump: bool = False,
    new_producer_id: int | None = None,
) -> Outcome:
    """EndTxn: ONGOING moves to PREPARE_COMMIT or PREPARE_ABORT. A retry of an EndTxn that
    already went through is answered as it was (NONE once complete, CONCURRENT_TRANSACTIONS
    while its markers are being written); the opposite decision is INVALID_TXN_STATE.

    ``bump`` (EndTxn v5, transaction protocol v2): the producer epoch goes up with the decision,
    so the markers fence every batch of the ended transaction (KIP-890); ``new_producer_id``
    when the bump takes the last epoch (see ``needs_new_producer_id``). With v2 an abort of a
    transaction that never began is allowed (it still bumps the epoch)."""
    if bump and current is not None and is_retry_of_bumped_end(current, producer_id, epoch):
        return _answer_retried_end(current, commit)
    error = check_producer(current, producer_id, epoch)
    if error is not ErrorCode.NONE:
        return Outcome(error)
    assert current is not None
    state = current.state
    wanted_prepare = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
    if state is TxnState.ONGOING or (bump and state.complete and not commit):
        prepared = dataclasses.replace(current, state=wanted_prepare, updated_ms=now_ms)
        return Outcome(metadata=_bumped(prepared, new_producer_id) if bump else prepared)
    if bump:
        return Outcome(ErrorCode.INVALID_TXN_STATE)  # v2 retries carry the previous epoch
    return _answer_retried_end(current, commit)


def _answer_retried_end(current: TxnMetadata, commit: bool) -> Outcome:
    wanted_prepare = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
    wanted_complete = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
    if current.state is wanted_prepare:
        return Outcome(ErrorCode.CONCURRENT_TRANSACTIONS)
    if current.state is wanted_complete:
        return Outcome()
    return Outcome(ErrorCode.INVALID_TXN_STATE)


def is_retry_of_bumped_end(current: TxnMetadata, producer_id: int, epoch: int) -> bool:
    """A v2 EndTxn sent again with the epoch it had before its bump (the answer was lost)."""
    return (
        current.previous_epoch != NO_PRODUCER_EPOCH
        and (current.previous_producer_id, current.previous_epoch) == (producer_id, epoch)
        and (current.state.preparing or current.state.complete)
    )


def needs_new_producer_id(current: TxnMetadata | None) -> bool:
    """Whether a v2 EndTxn's bump takes the last epoch: the id moves on after it."""
    return current is not None and current.producer_epoch + 1 >= MAX_PRODUCER_EPOCH


def _bumped(prepared: TxnMetadata, new_producer_id: int | None) -> TxnMetadata:
    """The prepared decision with the epoch bumped: its markers carry the new epoch."""
    return dataclasses.replace(
        prepared,
        producer_epoch=prepared.producer_epoch + 1,
        previous_producer_id=prepared.producer_id,
        previous_epoch=prepared.producer_epoch,
        next_producer_id=NO_PRODUCER_ID if new_producer_id is None else new_producer_id,
    )


def end_answer(meta: TxnMetadata) -> tuple[int, int]:
    """The producer id and epoch EndTxn v5 returns: what the producer uses next."""
    if meta.next_producer_id != NO_PRODUCER_ID:
        return meta.next_producer_id, 0
    return meta.producer_id, meta.producer_epoch


def fenced_abort(current: TxnMetadata, now_ms: int) -> TxnMetadata:
    """Abort an ongoing transaction on the coordinator's own initiative (a timeout, or a new
    producer of the same transactional id): the epoch is bumped first, so the old producer is
    fenced on every partition the abort markers reach."""
    return dataclasses.replace(
        current,
        state=TxnState.PREPARE_ABORT,
        producer_epoch=current.producer_epoch + 1,
        previous_producer_id=NO_PRODUCER_ID,  # not the producer's EndTxn: nothing to retry
        previous_epoch=NO_PRODUCER_EPOCH,
        updated_ms=now_ms,
    )


def completed(current: TxnMetadata, now_ms: int) -> TxnMetadata:
    """After every marker is written (and offsets materialised): COMPLETE_*, nothing open."""
    assert current.state.preparing, current.state
    done = (
        TxnState.COMPLETE_COMMIT
        if current.state is TxnState.PREPARE_COMMIT
        else TxnState.COMPLETE_ABORT
    )
    producer_id, epoch = current.producer_id, current.producer_epoch
    if current.next_producer_id != NO_PRODUCER_ID:  # the bump took the last epoch
        producer_id, epoch = current.next_producer_id, 0
    return dataclasses.replace(
        current,
        state=done,
        producer_id=producer_id,
        producer_epoch=epoch,
        next_producer_id=NO_PRODUCER_ID,
        partitions=frozenset(),
        groups=frozenset(),
        start_ms=-1,
        updated_ms=now_ms,
    )


def timed_out(current: TxnMetadata, now_ms: int) -> bool:
    """An ongoing transaction older than its transaction.timeout.ms: the coordinator aborts it."""
    return current.state is TxnState.ONGOING and now_ms - current.start_ms > current.timeout_ms


def expired(current: TxnMetadata, now_ms: int, expiration_ms: int) -> bool:
    """A transactional id unused for ``expiration_ms`` (Kafka's transactional.id.expiration.ms)
    with nothing in flight: its record may go. Its producer's next InitProducerId then gets a
    new producer id, as from Kafka."""
    settled = current.state in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
    return settled and current.updated_ms >= 0 and now_ms - current.updated_ms >= expiration_ms


class Recovery(enum.Enum):
    NOTHING = "nothing"
    COMPLETE = "write the markers of the prepared decision"
    ABORT = "abort: timed out"


def recovery_action(current: TxnMetadata, now_ms: int) -> Recovery:
    """What a coordinator owes a transaction it finds in etcd (after taking the lease over, or
    on its periodic check)."""
    if current.state.preparing:
        return Recovery.COMPLETE
    if timed_out(current, now_ms):
        return Recovery.ABORT
    return Recovery.NOTHING


def valid_timeout(timeout_ms: int, max_timeout_ms: int) -> bool:
    """transaction.timeout.ms must be positive and at most transaction.max.timeout.ms."""
    return 0 < timeout_ms <= max_timeout_ms


FENCED_BEFORE = {22: 4, 24: 2, 25: 2, 26: 2, 28: 2}
"""Per API, the first version whose clients know PRODUCER_FENCED (KIP-588); older versions get
INVALID_PRODUCER_EPOCH for the same condition, as Kafka answers them."""


def wire_error(code: ErrorCode, api_key: int, api_version: int) -> ErrorCode:
    if code is ErrorCode.PRODUCER_FENCED and api_version < FENCED_BEFORE.get(api_key, 0):
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return code
