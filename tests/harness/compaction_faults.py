"""Checkers of the log cleaner's fault campaign (``tests/integration/test_compaction_faults.py``).

Pure functions over what the producers were told, what a consumer read and what the store
holds, so that each rule is tested on its own (``tests/unit/test_compaction_faults_checker.py``):

* ``check_log``: each key's last value read is its latest acknowledged one, at its acknowledged
  offset; no acknowledged record at or above the cleaned point is missing or moved; offsets
  strictly increase per partition (so none appears twice).
* ``check_store``: under a partition's prefixes, every object the state does not reference
  (other generations' cleaned objects, plain segments below ``upto``) is an orphan; every object
  it references is there, and the cleaned objects tile ``[log start, upto)``.
"""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.partition_state import PartitionState

Read = Mapping[int, Sequence[tuple[int, bytes | None, bytes | None]]]  # partition -> records


@dataclass(frozen=True, slots=True)
class Sent:
    """One record a producer sent: its outcome is filled in by the delivery report."""

    key: bytes
    value: bytes | None
    partition: int


@dataclass
class Ledger:
    """Per key (each key has one producer, so its send order is its log order), every record
    sent, in order, with what the producer was told: ``(offset or None, acked)``. librdkafka
    may acknowledge a record without its offset (-1001); only its value is checked then."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: dict[bytes, list[Sent]] = field(default_factory=lambda: defaultdict(list))
    outcome: dict[tuple[bytes, int], tuple[int | None, bool]] = field(default_factory=dict)

    def send(self, record: Sent) -> int:
        """Record a send; returns its index among its key's sends."""
        with self.lock:
            self.sent[record.key].append(record)
            return len(self.sent[record.key]) - 1

    def report(self, key: bytes, index: int, offset: int | None, acked: bool) -> None:
        with self.lock:
            self.outcome[(key, index)] = (
                offset if offset is not None and offset >= 0 else None,
                acked,
            )

    @property
    def acked(self) -> int:
        return sum(1 for _, ok in self.outcome.values() if ok)

    @property
    def failed(self) -> int:
        return sum(1 for _, ok in self.outcome.values() if not ok)


def latest_acked(ledger: Ledger) -> dict[bytes, bytes | None]:
    """Each key's latest acknowledged value (None: a tombstone)."""
    latest = {}
    for key, sends in ledger.sent.items():
        for index, record in enumerate(sends):
            if ledger.outcome.get((key, index), (None, False))[1]:
                latest[key] = record.value
    return latest


def check_log(ledger: Ledger, read: Read, cleaned_upto: Mapping[int, int]) -> dict[str, int]:
    """Counts of broken rules (all 0 when the log is right); see the module docstring.

    ``wrong_latest``: a key's last value read is neither its latest acknowledged value nor a
    value sent after it whose delivery failed (a failed send may still have been stored).
    ``moved_latest``: the latest acknowledged record is not at its acknowledged offset.
    ``missing``: an acknowledged record at or above its partition's cleaned point is not at its
    offset. ``not_increasing``: a partition's offsets did not strictly increase."""
    at: dict[tuple[int, int], tuple[bytes | None, bytes | None]] = {}
    last_read: dict[bytes, tuple[int, int, bytes | None]] = {}
    not_increasing = 0
    for partition, records in read.items():
        offsets = [offset for offset, _, _ in records]
        not_increasing += sum(1 for a, b in itertools.pairwise(offsets) if b <= a)
        for offset, key, value in records:
            at[(partition, offset)] = (key, value)
            if key is not None:
                last_read[key] = (partition, offset, value)
    wrong_latest = moved_latest = missing = 0
    for key, sends in ledger.sent.items():
        latest = None
        for index, record in enumerate(sends):
            told, acked = ledger.outcome.get((key, index), (None, False))
            if not acked:
                continue
            latest = index
            if told is not None and told >= cleaned_upto.get(record.partition, 0):
                missing += at.get((record.partition, told)) != (key, record.value)
        if latest is None:
            continue
        found = last_read.get(key)
        allowed = {sends[latest].value} | {
            sends[i].value
            for i in range(latest + 1, len(sends))
            if not ledger.outcome.get((key, i), (None, False))[1]
        }
        if found is None or found[2] not in allowed:
            wrong_latest += 1
            continue
        told = ledger.outcome[(key, latest)][0]
        if found[2] == sends[latest].value and told is not None:
            moved_latest += (found[0], found[1]) != (sends[latest].partition, told)
    return {
        "wrong_latest": wrong_latest,
        "moved_latest": moved_latest,
        "missing": missing,
        "not_increasing": not_increasing,
    }


@dataclass(frozen=True, slots=True)
class StoreCheck:
    orphans: list[str]  # objects the state does not reference that should have been deleted
    missing: list[str]  # what the state references and the store does not hold
    cleaned_keys: list[str]  # the state's cleaned objects, oldest first (to read and tile)


def check_store(
    state: PartitionState,
    listed: Sequence[str],
    where: tuple[str, str, str, int],
) -> StoreCheck:
    """Orphans and missing objects of one partition, from its state and a listing of the
    partition's plain and cleaned prefixes (``where``: cluster, topic, topic id, partition)."""
    cluster, topic, topic_id, partition = where
    plain_prefix = keys.partition_object_prefix(cluster, topic, topic_id, partition)
    root = keys.cleaned_root_prefix(cluster, topic, topic_id, partition)
    cleaned = state.cleaned
    upto = cleaned.upto if cleaned is not None else 0
    kept_prefix = (
        keys.cleaned_pass_prefix(cluster, topic, topic_id, partition, *_gen_epoch(state))
        if cleaned is not None
        else None
    )
    orphans, cleaned_keys = [], []
    for key in listed:
        if key.startswith(root):
            if kept_prefix is not None and key.startswith(kept_prefix):
                cleaned_keys.append(key)
            else:
                orphans.append(key)
        elif key.startswith(plain_prefix):
            parsed = keys.parse_object_name(key)
            if parsed is not None and parsed[0] < upto:
                orphans.append(key)
    present = set(listed)
    missing = [
        keys.segment_object_key(cluster, topic, topic_id, partition, ref.base, ref.epoch)
        for ref in state.segments
        if ref.base >= upto
    ]
    missing = [key for key in missing if key not in present]
    if cleaned is not None and not cleaned_keys:
        missing.append(f"{kept_prefix} (no cleaned object)")
    return StoreCheck(sorted(orphans), missing, sorted(cleaned_keys))


def _gen_epoch(state: PartitionState) -> tuple[int, int]:
    assert state.cleaned is not None
    return state.cleaned.generation, state.cleaned.epoch


def tiling_gaps(ranges: Sequence[tuple[int, int, int]], log_start: int, upto: int) -> list[str]:
    """What is wrong with cleaned objects given as (name's base, header base, footer last),
    oldest first, that should tile ``[log start, upto)``: each object's header base is its
    name's, each ends where the next begins, the first begins at or below the log start and
    the last ends at ``upto``."""
    problems = []
    if not ranges:
        return [f"no cleaned object below {upto}"]
    if ranges[0][0] > log_start:
        problems.append(f"first cleaned object begins at {ranges[0][0]} > log start {log_start}")
    for (name_base, header_base, last), following in itertools.zip_longest(ranges, ranges[1:]):
        if header_base != name_base:
            problems.append(f"object {name_base} says it begins at {header_base}")
        end = following[0] if following is not None else upto
        if last + 1 != end:
            problems.append(f"object {name_base} ends at {last + 1}, not at {end}")
    return problems
