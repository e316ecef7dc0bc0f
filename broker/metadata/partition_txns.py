"""Transactions as one partition sees them: open transactions, markers, the last stable offset.

Pure decisions on ``PartitionState``. A transactional producer's first batch on a partition opens
its transaction there (at that batch's base offset); the coordinator's commit or abort marker
(a control batch) closes it. The *last stable offset* (LSO) is the smallest first offset of an
open transaction, or the high watermark when none is open: ``read_committed`` consumers read
only below it. An abort leaves an ``AbortedTxn`` (first offset, marker offset) that Fetch lists
so that clients drop those records themselves, as Kafka's clients do.

The events that change this bookkeeping ride with the batches that cause them (``TxnBegin`` with
a transaction's first batch, ``TxnEnd`` with its marker) and are applied when the flush commits
those batches, in the same etcd transaction: the committed state never says more or less than
the committed log. The owner keeps the same bookkeeping for what it has appended but not yet
committed, to decide the next batch or marker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from kafscale.broker.metadata.partition_state import (
    MAX_PRODUCERS,
    AbortedTxn,
    PartitionState,
    ProducerState,
)
from kafscale.broker.protocol.errors import ErrorCode

MAX_ABORTED_TXNS = 512
"""The default of ``log.aborted_txns_in_state``: aborted transactions kept in the state document
(about 20 bytes each, rewritten by every flush); beyond it the flush spills the oldest ones to an
index object (``aborted_index``), so none is lost while its records are readable."""


@dataclass(frozen=True, slots=True)
class TxnBegin:
    """A transactional producer's first batch on the partition since its last marker."""

    producer_id: int
    first_offset: int


@dataclass(frozen=True, slots=True)
class TxnEnd:
    """A commit or abort marker written at ``offset``."""

    producer_id: int
    commit: bool
    offset: int
    coordinator_epoch: int


TxnEvent = TxnBegin | TxnEnd


def last_stable_offset(state: PartitionState) -> int:
    """Below it every transaction is decided: what read_committed consumers may read."""
    return min([*state.open_txns.values(), state.high_watermark])


def apply_txn_events(state: PartitionState, events: Iterable[TxnEvent]) -> PartitionState:
    """The state once the batches carrying ``events`` (in offset order) are committed."""
    open_txns = dict(state.open_txns)
    aborted = list(state.aborted_txns)
    coordinator_epochs = dict(state.coordinator_epochs)
    changed = False
    for event in events:
        changed = True
        if isinstance(event, TxnBegin):
            open_txns.setdefault(event.producer_id, event.first_offset)
            continue
        first = open_txns.pop(event.producer_id, None)
        coordinator_epochs[event.producer_id] = event.coordinator_epoch
        if not event.commit and first is not None:
            aborted.append(AbortedTxn(event.producer_id, first, event.offset))
    if not changed:
        return state
    kept = tuple(t for t in aborted if t.last_offset >= state.log_start_offset)
    return replace(
        state,
        open_txns=open_txns,
        aborted_txns=kept,  # bounded by the flush's spill (``aborted_index.spill_aborted``)
        coordinator_epochs=_bounded_epochs(coordinator_epochs, open_txns, state.producers),
    )


def _bounded_epochs(
    epochs: dict[int, int],
    open_txns: Mapping[int, int],
    producers: Mapping[int, Sequence[ProducerState]],
) -> dict[int, int]:
    """At most ``MAX_PRODUCERS`` entries: producers the partition forgot go first."""
    if len(epochs) <= MAX_PRODUCERS:
        return epochs
    known = {pid: e for pid, e in epochs.items() if pid in producers or pid in open_txns}
    return dict(list(known.items())[-MAX_PRODUCERS:])


def aborted_in_range(state: PartitionState, start: int, end: int) -> list[AbortedTxn]:
    """The aborted transactions with records in [start, end): a fetch returning that range
    lists them (Kafka's ``collectAbortedTransactions``: last offset at or after the start,
    first offset before the end). Only the state's own entries: readers use
    ``storage.aborted_index.aborted_in_range``, which adds those spilled to index objects."""
    return [t for t in state.aborted_txns if t.last_offset >= start and t.first_offset < end]


@dataclass(frozen=True, slots=True)
class WriteMarker:
    """Append the marker; ``epoch_bump``: the marker's producer epoch is newer than any batch
    of the producer here (or the producer is unknown here), so the partition remembers it
    (older-epoch batches are fenced)."""

    epoch_bump: bool


@dataclass(frozen=True, slots=True)
class MarkerDone:
    """Nothing to write: the producer has no open transaction here and the marker's epoch is
    already known here (a retried marker, or a protocol v1 transaction that wrote nothing to
    this partition)."""


@dataclass(frozen=True, slots=True)
class MarkerRejected:
    code: ErrorCode


MarkerDecision = WriteMarker | MarkerDone | MarkerRejected


def decide_marker(
    *,
    has_open_txn: bool,
    latest_epoch: int | None,
    known_coordinator_epoch: int | None,
    producer_epoch: int,
    coordinator_epoch: int,
) -> MarkerDecision:
    """Kafka's checks on a WriteTxnMarkers entry for one partition (``appendEndTxnMarker``):
    a marker from an older coordinator is fenced, one with a producer epoch older than the
    producer's batches here is refused; a producer with nothing open gets no second marker.

    A marker with a newer producer epoch (transaction protocol v2 bumps it at every EndTxn, a
    timeout abort bumps it too) is written even when nothing is open here: the partition was
    added to the transaction but its batch has not landed yet. Written, the marker records the
    new epoch (durably, with the flush), so that batch is fenced when it lands
    (INVALID_PRODUCER_EPOCH), by this owner or the next; and the write goes through the fenced
    flush, so an owner that lost the partition cannot answer it done. Answered done without a
    write, the late batch opened a transaction no marker would ever end (a stuck last stable
    offset), and every later transaction of the producer continued it.

    ``latest_epoch``: the producer epoch of its latest batch or marker here (None: unknown);
    ``known_coordinator_epoch``: of the last marker written for it here (None: none yet)."""
    if known_coordinator_epoch is not None and coordinator_epoch < known_coordinator_epoch:
        return MarkerRejected(ErrorCode.TRANSACTION_COORDINATOR_FENCED)
    if latest_epoch is not None and producer_epoch < latest_epoch:
        return MarkerRejected(ErrorCode.INVALID_PRODUCER_EPOCH)
    newer = latest_epoch is None or producer_epoch > latest_epoch
    if not has_open_txn and not newer:
        return MarkerDone()
    return WriteMarker(epoch_bump=newer)
