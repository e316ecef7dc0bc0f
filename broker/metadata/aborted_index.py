"""Aborted transactions beyond the partition state's bound: pure decisions on where they live.

A ``read_committed`` reader must be told every aborted transaction overlapping what it reads,
however far back; a partition that aborts many transactions within its retention has more of
them than the state document (rewritten by every flush) should carry. As Kafka keeps them in
per-segment ``.txnindex`` files, the owner's flush *spills* the oldest ones to an immutable
index object once the state holds more than ``limit``, and the state keeps a reference to it
(``TxnIndexRef``: its offset range, writer epoch and count) in the same etcd transaction that
commits the flush. Retention and DeleteRecords drop a reference once the log start passes its
last marker; the object is then deleted.

Spilled transactions are the oldest by marker offset, so every object lies below the state's own
entries: a fetch of recent data overlaps no object and costs no GET.

The references stay few, too: a spill absorbs the newest existing objects while they hold no
more transactions than it (a binary counter: object sizes double going back, so a partition
with N aborts within retention has about log2(N / spill size) references), up to
``MAX_TXNS_PER_OBJECT`` per object (about 1.5 MB), past which references grow by one per that
many aborts. The absorbed objects are read (cached), rewritten into the new one, and deleted
once the commit that drops their references succeeded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from kafscale.broker.metadata.partition_state import AbortedTxn, PartitionState, TxnIndexRef

MAX_TXNS_PER_OBJECT = 65536
"""Aborted transactions one index object may hold once merged (24 bytes each): a reader of old
offsets GETs at most this much per object."""


@dataclass(frozen=True, slots=True)
class AbortedSpill:
    """An index object to write before the commit that references it: ``ref``, holding the
    entries of the ``absorbed`` objects (oldest first) followed by ``entries``."""

    ref: TxnIndexRef
    entries: tuple[AbortedTxn, ...]
    absorbed: tuple[TxnIndexRef, ...] = ()


def spill_aborted(state: PartitionState, limit: int) -> tuple[PartitionState, AbortedSpill | None]:
    """``state`` with at most ``limit`` aborted transactions of its own: beyond that, all but the
    newest ``limit // 2`` go to one new index object (so a spill happens once per ``limit / 2``
    aborts, not on every abort, and each object holds at least that many)."""
    if len(state.aborted_txns) <= limit:
        return state, None
    keep = limit // 2
    cut = len(state.aborted_txns) - keep
    spilled, kept = state.aborted_txns[:cut], state.aborted_txns[cut:]
    refs, absorbed = absorb_newest(state.aborted_txn_index, len(spilled))
    ref = TxnIndexRef(
        first_offset=min([t.first_offset for t in spilled] + [r.first_offset for r in absorbed]),
        last_offset=max(t.last_offset for t in spilled),
        epoch=state.leader_epoch,
        txn_count=len(spilled) + sum(r.txn_count for r in absorbed),
    )
    new_state = replace(state, aborted_txns=kept, aborted_txn_index=(*refs, ref))
    return new_state, AbortedSpill(ref, spilled, absorbed)


def absorb_newest(
    refs: tuple[TxnIndexRef, ...], count: int
) -> tuple[tuple[TxnIndexRef, ...], tuple[TxnIndexRef, ...]]:
    """(the references that stay, the newest ones a spill of ``count`` absorbs): each while it
    holds no more than the spill so far, and the total stays within ``MAX_TXNS_PER_OBJECT``."""
    stay = list(refs)
    absorbed: list[TxnIndexRef] = []
    while (
        stay and stay[-1].txn_count <= count and stay[-1].txn_count + count <= MAX_TXNS_PER_OBJECT
    ):
        newest = stay.pop()
        absorbed.insert(0, newest)
        count += newest.txn_count
    return tuple(stay), tuple(absorbed)


def overlapping(txns: Iterable[AbortedTxn], start: int, end: int) -> list[AbortedTxn]:
    """The aborted transactions with records in [start, end) (Kafka's
    ``collectAbortedTransactions``: marker at or after the start, first offset before the end)."""
    return [t for t in txns if t.last_offset >= start and t.first_offset < end]


def refs_in_range(state: PartitionState, start: int, end: int) -> list[TxnIndexRef]:
    """The index objects that may hold aborted transactions overlapping [start, end): the only
    ones a reader of that range GETs (none for a range above every spilled marker)."""
    return [r for r in state.aborted_txn_index if r.last_offset >= start and r.first_offset < end]


def dropped_refs(before: PartitionState, after: PartitionState) -> list[TxnIndexRef]:
    """References ``before`` had and ``after`` no longer has (the log start passed them): their
    objects can go."""
    kept = set(after.aborted_txn_index)
    return [ref for ref in before.aborted_txn_index if ref not in kept]


def orphaned_indexes(
    state: PartitionState, listed: Iterable[tuple[int, int, int]], owner_epoch: int
) -> list[tuple[int, int, int]]:
    """The listed objects (first offset, last offset, epoch) that no state will ever reference:
    written by an owner of an older epoch (only the current owner adds references, to objects
    of its own epoch) and not referenced now. Left by an owner that died between its PUT and
    its commit, or whose commit outcome it never learnt."""
    referenced = {(r.first_offset, r.last_offset, r.epoch) for r in state.aborted_txn_index}
    return [obj for obj in listed if obj[2] < owner_epoch and obj not in referenced]


def kept_aborts_from(state: PartitionState, upto: int) -> int:
    """Where a compaction pass up to ``upto`` must start keeping abort markers: the first
    offset of the oldest index object it cannot drop (one holding a marker at or after
    ``upto``), else ``upto``. That object's entries stay after the pass, and an entry whose
    marker is gone makes the Java client and librdkafka skip the producer's later transactions
    (they stop skipping a producer at its abort marker)."""
    return min([r.first_offset for r in state.aborted_txn_index if r.last_offset >= upto] + [upto])


def without_cleaned_aborts(state: PartitionState, upto: int) -> PartitionState:
    """``state`` without the aborted transactions a committed compaction pass up to ``upto``
    made useless: those ending below it (their records were all dropped by the pass, so a
    read_committed reader has nothing to filter with them) and the index objects wholly below
    it. An abort marker without its entry is harmless (a reader ignores it); an entry without
    its marker is not, which is why the pass removes only markers whose entry goes here."""
    return replace(
        state,
        aborted_txns=tuple(t for t in state.aborted_txns if t.last_offset >= upto),
        aborted_txn_index=tuple(r for r in state.aborted_txn_index if r.last_offset >= upto),
    )
