"""One share-partition (a share group's view of one topic partition, KIP-932) as pure state.

Kafka's ``SharePartition`` reduced to per-record bookkeeping over a bounded window:

* ``start_offset`` is the share-partition start offset (SPSO): every record below it is done
  (acknowledged or archived). ``next_offset`` is one past the last record ever acquired; the
  window ``[start_offset, next_offset)`` holds a state per record and is never longer than
  ``max_records_in_flight`` (Kafka's ``group.share.partition.max.record.locks``).
* A record is AVAILABLE, ACQUIRED (by one member, until its lock deadline), ACKNOWLEDGED or
  ARCHIVED. Acquiring counts a delivery. RELEASE, an expired lock or a member gone makes an
  acquired record AVAILABLE again, or ARCHIVED once its delivery count reached the limit.
  ACCEPT acknowledges it, REJECT (and GAP) archives it.
* The SPSO moves past acknowledged and archived records at the window's start.

``durable()`` is what survives the partition owner (Kafka's persister state): acquired records
are written as available with their delivery count, so a new owner delivers them again.
Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import enum
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass, field

from kafscale.broker.protocol.errors import ErrorCode


class RecordState(enum.IntEnum):
    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVED = 4


class AckType(enum.IntEnum):
    """Acknowledge types on the wire (ShareFetch/ShareAcknowledge ``AcknowledgeTypes``)."""

    GAP = 0
    ACCEPT = 1
    RELEASE = 2
    REJECT = 3
    RENEW = 4


@dataclass(slots=True)
class InFlight:
    state: RecordState = RecordState.AVAILABLE
    delivery_count: int = 0
    member_id: str | None = None
    deadline_ms: int = 0


@dataclass(frozen=True, slots=True)
class Acquired:
    """Offsets ``first``..``last`` handed to a member, each delivered ``delivery_count`` times."""

    first: int
    last: int
    delivery_count: int


@dataclass(frozen=True, slots=True)
class Limits:
    lock_ms: int = 30_000
    delivery_count_limit: int = 5
    max_records_in_flight: int = 2000


DurableBatch = tuple[int, int, int, int]
"""(first offset, last offset, delivery count, state) as persisted."""


@dataclass(slots=True)
class SharePartition:
    start_offset: int
    next_offset: int = -1
    records: dict[int, InFlight] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.next_offset < self.start_offset:
            self.next_offset = self.start_offset

    # --- queries ------------------------------------------------------------------------------

    def in_flight(self) -> int:
        return self.next_offset - self.start_offset

    def first_available(self, readable_end: int, limits: Limits) -> int | None:
        """The lowest offset a fetch could acquire now, or None."""
        for offset in range(self.start_offset, self.next_offset):
            if self.records[offset].state is RecordState.AVAILABLE:
                return offset
        if self.next_offset < readable_end and self.in_flight() < limits.max_records_in_flight:
            return self.next_offset
        return None

    def next_deadline_ms(self) -> int | None:
        deadlines = [
            r.deadline_ms for r in self.records.values() if r.state is RecordState.ACQUIRED
        ]
        return min(deadlines, default=None)

    # --- transitions --------------------------------------------------------------------------

    def acquire(
        self,
        member_id: str,
        first: int,
        last: int,
        max_records: int,
        now_ms: int,
        limits: Limits,
        skip: Sequence[tuple[int, int]] = (),
        batch_ends: frozenset[int] = frozenset(),
    ) -> list[Acquired]:
        """Acquire up to ``max_records`` available records in ``first..last`` (what a read of
        the log returned) for ``member_id``. Offsets in ``skip`` (control records, aborted
        transactions) are archived instead of delivered. Never grows the window past the limit.

        ``batch_ends``: the last offsets of the batches read. Given, ``max_records`` is soft as
        in Kafka's batch-optimized acquire mode: the batch holding the last record wanted is
        acquired whole."""
        taken: list[tuple[int, int]] = []
        offset = max(first, self.start_offset)
        while offset <= last:
            if len(taken) >= max_records and (not batch_ends or offset - 1 in batch_ends):
                break
            if offset >= self.next_offset:
                if offset > self.next_offset or self.in_flight() >= limits.max_records_in_flight:
                    break
                self.records[offset] = InFlight()
                self.next_offset += 1
            record = self.records[offset]
            if record.state is RecordState.AVAILABLE:
                if _inside(offset, skip):
                    record.state = RecordState.ARCHIVED
                else:
                    record.state = RecordState.ACQUIRED
                    record.delivery_count += 1
                    record.member_id = member_id
                    record.deadline_ms = now_ms + limits.lock_ms
                    taken.append((offset, record.delivery_count))
            offset += 1
        self._advance()
        return _ranges(taken)

    def acknowledge(
        self,
        member_id: str,
        first: int,
        last: int,
        types: Sequence[int],
        now_ms: int,
        limits: Limits,
    ) -> ErrorCode:
        """One acknowledgement batch: every offset must be acquired by ``member_id`` (else
        INVALID_RECORD_STATE and nothing changes); ``types`` holds one type for all or one per
        offset."""
        if last < first or not types or (len(types) != 1 and len(types) != last - first + 1):
            return ErrorCode.INVALID_REQUEST
        if any(t not in AckType._value2member_map_ for t in types):
            return ErrorCode.INVALID_REQUEST
        for offset in range(first, last + 1):
            record = self.records.get(offset)
            if record is None or record.state is not RecordState.ACQUIRED:
                return ErrorCode.INVALID_RECORD_STATE
            if record.member_id != member_id:
                return ErrorCode.INVALID_RECORD_STATE
        for offset in range(first, last + 1):
            kind = AckType(types[0] if len(types) == 1 else types[offset - first])
            self._settle(self.records[offset], kind, now_ms, limits)
        self._advance()
        return ErrorCode.NONE

    def release_member(self, member_id: str, limits: Limits) -> int:
        """Every record ``member_id`` holds goes back (its session ended): how many."""
        released = 0
        for record in self.records.values():
            if record.state is RecordState.ACQUIRED and record.member_id == member_id:
                self._release(record, limits)
                released += 1
        self._advance()
        return released

    def release_departed(self, members: Container[str], limits: Limits) -> int:
        """Every record held by a member not in ``members`` goes back (it left the group or
        its session expired at the coordinator): how many."""
        released = 0
        for record in self.records.values():
            if record.state is RecordState.ACQUIRED and record.member_id not in members:
                self._release(record, limits)
                released += 1
        self._advance()
        return released

    def expire(self, now_ms: int, limits: Limits) -> int:
        """Records whose acquisition lock ran out go back: how many."""
        expired = 0
        for record in self.records.values():
            if record.state is RecordState.ACQUIRED and record.deadline_ms <= now_ms:
                self._release(record, limits)
                expired += 1
        self._advance()
        return expired

    def move_start(self, offset: int) -> None:
        """The log start moved past ``offset`` (retention, DeleteRecords) or an admin reset
        the start: records below it are gone for the group."""
        for gone in range(self.start_offset, min(offset, self.next_offset)):
            self.records.pop(gone, None)
        self.start_offset = max(self.start_offset, offset)
        self.next_offset = max(self.next_offset, self.start_offset)

    # --- durability ---------------------------------------------------------------------------

    def durable(self) -> list[DurableBatch]:
        """The window as Kafka's persister keeps it: runs of (first, last, count, state);
        ACQUIRED is written as AVAILABLE."""
        batches: list[list[int]] = []
        for offset in range(self.start_offset, self.next_offset):
            record = self.records[offset]
            state = RecordState.AVAILABLE if record.state is RecordState.ACQUIRED else record.state
            last = batches[-1] if batches else None
            if last and last[1] == offset - 1 and last[2:] == [record.delivery_count, int(state)]:
                last[1] = offset
            else:
                batches.append([offset, offset, record.delivery_count, int(state)])
        return [(b[0], b[1], b[2], b[3]) for b in batches]

    @classmethod
    def restore(cls, start_offset: int, batches: Iterable[DurableBatch]) -> SharePartition:
        partition = cls(start_offset)
        for first, last, count, state in batches:
            for offset in range(max(first, start_offset), last + 1):
                partition.records[offset] = InFlight(RecordState(state), count)
                partition.next_offset = max(partition.next_offset, offset + 1)
        for offset in range(partition.start_offset, partition.next_offset):
            partition.records.setdefault(offset, InFlight())
        partition._advance()
        return partition

    # --- helpers ------------------------------------------------------------------------------

    def _settle(self, record: InFlight, kind: AckType, now_ms: int, limits: Limits) -> None:
        if kind is AckType.ACCEPT:
            record.state, record.member_id = RecordState.ACKNOWLEDGED, None
        elif kind is AckType.RELEASE:
            self._release(record, limits)
        elif kind is AckType.RENEW:
            record.deadline_ms = now_ms + limits.lock_ms
        else:  # REJECT, GAP
            record.state, record.member_id = RecordState.ARCHIVED, None

    @staticmethod
    def _release(record: InFlight, limits: Limits) -> None:
        if record.delivery_count >= limits.delivery_count_limit:
            record.state = RecordState.ARCHIVED
        else:
            record.state = RecordState.AVAILABLE
        record.member_id = None

    def _advance(self) -> None:
        while self.start_offset < self.next_offset:
            record = self.records[self.start_offset]
            if record.state not in (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED):
                break
            del self.records[self.start_offset]
            self.start_offset += 1


def ordered_batches(ranges: Sequence[tuple[int, int]]) -> bool:
    """Kafka's ``validateAcknowledgementBatches``: each batch's first offset is at most its
    last and past the previous batch's last; reversed or overlapping batches are
    INVALID_REQUEST for the partition, none of them applied (a batch applied twice could
    settle a record once more, e.g. RENEW then ACCEPT of one offset in one request)."""
    previous = -1
    for first, last in ranges:
        if first < 0 or last < first or first <= previous:
            return False
        previous = last
    return True


def _inside(offset: int, ranges: Sequence[tuple[int, int]]) -> bool:
    return any(first <= offset <= last for first, last in ranges)


def _ranges(taken: list[tuple[int, int]]) -> list[Acquired]:
    """Consecutive offsets with one delivery count, merged."""
    out: list[Acquired] = []
    for offset, count in taken:
        if out and out[-1].last == offset - 1 and out[-1].delivery_count == count:
            out[-1] = Acquired(out[-1].first, offset, count)
        else:
            out.append(Acquired(offset, offset, count))
    return out
