"""The fault campaign's consumer group: what a group of real consumers sees while brokers crash.

``bench/chaos.py`` runs a :class:`Group` of confluent-kafka (librdkafka) consumers beside its
producers: classic group protocol, ``enable.auto.commit`` off, each member commits the offsets
of what it processed after every batch (at-least-once, the way an application that must not
lose records is written), and only for partitions it still owns (a member that commits a
partition it has just given up could move another member's commit back: that is the
application's bug, not the broker's). A :class:`CommitWatch` asks the group coordinator for the
committed offsets (OffsetFetch, through a consumer that never joins) every half second.

:func:`check_group` (pure) then counts, over the records the producers were told were acked:
**undelivered** (never given to any member: a gap the group skipped), **duplicates** (deliveries
of an offset beyond its first: allowed at-least-once, counted), committed offsets seen to **go
back** (in OffsetFetch's answers, and among successful commits, one that completed before
another was sent with a lower offset), and partitions whose final committed offset is not their
high watermark once the group has drained. It also reports the longest time a partition was
assigned to no member and the longest time one delivered nothing while producers wrote to it.
"""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

GROUP = "chaos-group"
QUIET = 0  # librdkafka log level: the faults make it log every reconnect
NO_OFFSET = -1001  # librdkafka's OFFSET_INVALID: nothing committed yet


@dataclass(frozen=True)
class Delivery:
    """A record a member was given: when (monotonic), by which member, where, what."""

    at: float
    member: int
    partition: int
    offset: int
    value: bytes


@dataclass(frozen=True)
class Commit:
    """One partition's offset in a commit request: sent and answered (monotonic), and whether
    the coordinator accepted it."""

    sent_at: float
    done_at: float
    member: int
    partition: int
    offset: int
    ok: bool


@dataclass
class Ownership:
    """When each partition was assigned to no member: gaps closed by an assignment, from each
    partition's first assignment on (the group's first join is reported apart)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    owners: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    unowned_since: dict[int, float] = field(default_factory=dict)
    gaps: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    gap_starts: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    first_assigned: dict[int, float] = field(default_factory=dict)
    events: list[tuple[float, int, str, list[int]]] = field(default_factory=list)
    closed: bool = False  # the members are being stopped: their leaving is not a gap

    def assign(self, member: int, partitions: Iterable[int], now: float) -> None:
        with self.lock:
            partitions = sorted(partitions)
            self.events.append((now, member, "assign", partitions))
            if self.closed:
                return
            for p in partitions:
                if not self.owners[p] and p in self.unowned_since:
                    since = self.unowned_since.pop(p)
                    self.gaps[p].append(now - since)
                    self.gap_starts[p].append(since)
                self.owners[p].add(member)
                self.first_assigned.setdefault(p, now)

    def revoke(self, member: int, partitions: Iterable[int], now: float) -> None:
        with self.lock:
            partitions = sorted(partitions)
            self.events.append((now, member, "revoke", partitions))
            if self.closed:
                return
            for p in partitions:
                self.owners[p].discard(member)
                if not self.owners[p]:
                    self.unowned_since[p] = now

    def close(self, now: float) -> None:
        """Close the gaps still open (the campaign ended with a partition unowned); later
        assignments and revocations (the members leaving) are not counted."""
        with self.lock:
            self.closed = True
            for p, since in self.unowned_since.items():
                self.gaps[p].append(now - since)
                self.gap_starts[p].append(since)
            self.unowned_since.clear()

    def longest_gap_s(self) -> float:
        return max((gap for gaps in self.gaps.values() for gap in gaps), default=0.0)

    def long_gaps(self, over_s: float, origin: float) -> list[tuple[int, float, float]]:
        """(partition, start from ``origin``, seconds) of each gap longer than ``over_s``."""
        return sorted(
            (p, round(start - origin, 1), round(gap, 1))
            for p in self.gaps
            for start, gap in zip(self.gap_starts[p], self.gaps[p], strict=True)
            if gap > over_s
        )


@dataclass
class Seen:
    """Everything the members did, appended from their threads (``list.append`` is atomic)."""

    deliveries: list[Delivery] = field(default_factory=list)
    commits: list[Commit] = field(default_factory=list)
    commit_errors: list[str] = field(default_factory=list)
    ownership: Ownership = field(default_factory=Ownership)


class GroupMember(threading.Thread):
    """One consumer of the group on its own thread: poll, process (record), commit."""

    def __init__(self, index: int, bootstrap: str, topic: str, seen: Seen, debug: str = "") -> None:
        super().__init__(name=f"chaos-member-{index}", daemon=True)
        self.index = index
        self.debug = debug  # librdkafka debug contexts (e.g. "cgrp,protocol"), logged to stderr
        self.bootstrap = bootstrap
        self.topic = topic
        self.seen = seen
        self.stopping = threading.Event()
        self.owned: set[int] = set()
        self.crashed: BaseException | None = None
        self.committing_since: float | None = None  # a synchronous commit under way since

    def config(self) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.bootstrap,
            "group.id": GROUP,
            "client.id": f"chaos-member-{self.index}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 1_000,
            # No logger callback: librdkafka then writes from its own threads, so a member
            # stuck in a synchronous commit still logs what its coordinator handle is doing.
            **({"debug": self.debug, "log_level": 7} if self.debug else {"log_level": QUIET}),
        }

    def run(self) -> None:
        try:
            consumer = Consumer(self.config())
            consumer.subscribe(
                [self.topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._lost
            )
            try:
                while not self.stopping.is_set():
                    self._process(consumer, consumer.consume(500, 0.5))
            finally:
                consumer.close()
                self.seen.ownership.revoke(self.index, self.owned, time.monotonic())
        except BaseException as exc:
            self.crashed = exc
            raise

    def _process(self, consumer: Consumer, messages: Sequence[Any]) -> None:
        """Record each message (the processing), then commit what is still ours."""
        now = time.monotonic()
        next_offsets: dict[int, int] = {}
        for message in messages:
            if message.error() is not None:
                continue
            partition, offset = message.partition(), message.offset()
            self.seen.deliveries.append(
                Delivery(now, self.index, partition, offset, message.value())
            )
            next_offsets[partition] = max(next_offsets.get(partition, 0), offset + 1)
        mine = {p: o for p, o in next_offsets.items() if p in self.owned}
        if mine:
            self._commit(consumer, mine)

    def _commit(self, consumer: Consumer, offsets: Mapping[int, int]) -> None:
        sent_at = time.monotonic()
        request = [TopicPartition(self.topic, p, o) for p, o in sorted(offsets.items())]
        self.committing_since = sent_at
        try:
            answer = consumer.commit(offsets=request, asynchronous=False) or []
        except KafkaException as exc:
            self.seen.commit_errors.append(str(exc.args[0]))
            answer = [TopicPartition(self.topic, p, o) for p, o in offsets.items()]
            failed = True
        else:
            failed = False
        done_at = time.monotonic()
        self.committing_since = None
        for tp in answer:
            ok = not failed and tp.error is None
            if tp.error is not None:
                self.seen.commit_errors.append(str(tp.error))
            self.seen.commits.append(
                Commit(sent_at, done_at, self.index, tp.partition, offsets[tp.partition], ok)
            )

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.owned |= {tp.partition for tp in partitions}
        self.seen.ownership.assign(self.index, self.owned, time.monotonic())

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        gone = {tp.partition for tp in partitions}
        self.owned -= gone
        self.seen.ownership.revoke(self.index, gone, time.monotonic())

    def _lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._revoked(consumer, partitions)


class CommitWatch(threading.Thread):
    """Polls the group's committed offsets (OffsetFetch) through a consumer that never joins."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, interval_s: float = 0.5):
        super().__init__(name="chaos-commit-watch", daemon=True)
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.interval_s = interval_s
        self.stopping = threading.Event()
        self.polls: list[tuple[float, dict[int, int]]] = []
        self.failed_polls = 0

    def run(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": GROUP,
                "enable.auto.commit": False,
                "log_level": QUIET,
            }
        )
        wanted = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        try:
            while not self.stopping.wait(self.interval_s):
                try:
                    answer = consumer.committed(wanted, timeout=10)
                except KafkaException:
                    self.failed_polls += 1
                    continue
                self.polls.append(
                    (time.monotonic(), {tp.partition: tp.offset for tp in answer if not tp.error})
                )
        finally:
            consumer.close()

    def latest(self) -> dict[int, int]:
        return dict(self.polls[-1][1]) if self.polls else {}


@dataclass
class Group:
    """The campaign's consumer group: ``members`` consumers and the commit watch."""

    bootstrap: str
    topic: str
    partitions: int
    members: int = 3
    debug: str = ""
    seen: Seen = field(default_factory=Seen)
    started_at: float = 0.0
    drained_s: float | None = None

    def __post_init__(self) -> None:
        self.threads = [
            GroupMember(i, self.bootstrap, self.topic, self.seen, self.debug)
            for i in range(self.members)
        ]
        self.watch = CommitWatch(self.bootstrap, self.topic, self.partitions)

    def start(self) -> None:
        self.started_at = time.monotonic()
        for thread in [*self.threads, self.watch]:
            thread.start()

    def drain(self, ends: Mapping[int, int], timeout_s: float) -> bool:
        """Wait until the committed offsets reach the high watermarks ``ends`` (producers have
        stopped); False if they did not within ``timeout_s``."""
        began = time.monotonic()
        deadline = began + timeout_s
        while time.monotonic() < deadline:
            latest = self.watch.latest()
            if all(latest.get(p, NO_OFFSET) == end for p, end in ends.items() if end > 0):
                self.drained_s = time.monotonic() - began
                return True
            time.sleep(0.5)
        return False

    def states(self) -> list[str]:
        """Each member's state now, for a group that did not drain: what it owns, whether its
        thread is stuck in a commit, when it last got a record."""
        now = time.monotonic()
        last: dict[int, float] = {}
        for d in self.seen.deliveries:
            last[d.member] = d.at
        lines = []
        for t in self.threads:
            since = t.committing_since
            lines.append(
                f"member {t.index}: owns {sorted(t.owned)}, "
                + (f"in a commit for {now - since:.0f} s, " if since is not None else "")
                + (
                    f"last record {now - last[t.index]:.0f} s ago"
                    if t.index in last
                    else "no record"
                )
            )
        return lines

    def stop(self) -> None:
        """Stop the members, then one last OffsetFetch (the final committed offsets)."""
        self.seen.ownership.close(time.monotonic())
        for thread in self.threads:
            thread.stopping.set()
        for thread in self.threads:
            thread.join(120)
        time.sleep(self.watch.interval_s * 2)  # at least one poll after the last commit
        self.watch.stopping.set()
        self.watch.join(60)

    def figures(
        self,
        acked: Mapping[bytes, tuple[int, int | None]],
        ends: Mapping[int, int],
        producing: tuple[float, float],
        origin: float | None = None,
    ) -> dict[str, Any]:
        """The group's figures; times of long gaps from ``origin`` (the campaign's start)."""
        counts = check_group(acked, self.seen.deliveries, self.seen.commits, self.watch.polls, ends)
        first_join = [t - self.started_at for t in self.seen.ownership.first_assigned.values()]
        return {
            "group_members": self.members,
            "group_delivered": len(self.seen.deliveries),
            "group_commits_ok": sum(c.ok for c in self.seen.commits),
            "group_commits_failed": sum(not c.ok for c in self.seen.commits),
            "group_offset_fetches": len(self.watch.polls),
            "group_first_join_s": round(max(first_join, default=-1.0), 1),
            "group_longest_unassigned_s": round(self.seen.ownership.longest_gap_s(), 1),
            "group_unassigned_over_10s": self.seen.ownership.long_gaps(
                10.0, self.started_at if origin is None else origin
            ),
            "group_longest_silence_s": round(
                longest_silence_s(self.seen.deliveries, *producing), 1
            ),
            "group_longest_silence_by_partition_s": {
                p: round(s, 1)
                for p, s in longest_silences_s(self.seen.deliveries, *producing).items()
            },
            "group_drain_s": None if self.drained_s is None else round(self.drained_s, 1),
            "group_crashed_members": sum(t.crashed is not None for t in self.threads),
            **counts,
        }


def backwards_in_polls(polls: Sequence[tuple[float, Mapping[int, int]]]) -> int:
    """How many times an OffsetFetch answer had a partition's committed offset below one an
    earlier answer gave (nothing committed yet, ``NO_OFFSET``, is not an offset)."""
    highest: dict[int, int] = {}
    back = 0
    for _, offsets in polls:
        for p, offset in offsets.items():
            if offset < 0:
                continue
            if offset < highest.get(p, -1):
                back += 1
            highest[p] = max(highest.get(p, -1), offset)
    return back


def backwards_in_commits(commits: Sequence[Commit]) -> int:
    """Successful commits of an offset lower than one an earlier successful commit of the same
    partition had, counted only when that one was answered before this one was sent (two
    commits in flight at once are not ordered)."""
    by_partition: dict[int, list[Commit]] = defaultdict(list)
    for commit in commits:
        if commit.ok:
            by_partition[commit.partition].append(commit)
    back = 0
    for done in by_partition.values():
        done.sort(key=lambda c: c.done_at)
        times = [c.done_at for c in done]
        highest = list(_running_max(c.offset for c in done))
        for commit in done:
            before = bisect.bisect_left(times, commit.sent_at)
            back += before > 0 and highest[before - 1] > commit.offset
    return back


def _running_max(values: Iterable[int]) -> Iterable[int]:
    best = -1
    for value in values:
        best = max(best, value)
        yield best


def longest_silence_s(deliveries: Sequence[Delivery], start: float, end: float) -> float:
    """The longest time, between ``start`` and ``end`` (while producers wrote to every
    partition), that some partition delivered no record to the group."""
    return max(longest_silences_s(deliveries, start, end).values(), default=0.0)


def longest_silences_s(
    deliveries: Sequence[Delivery], start: float, end: float
) -> dict[int, float]:
    """Per partition that delivered anything, the longest time between ``start`` and ``end``
    it delivered nothing."""
    times: dict[int, list[float]] = defaultdict(list)
    for d in deliveries:
        if start <= d.at <= end:
            times[d.partition].append(d.at)
    longest = {}
    for p, at in sorted(times.items()):
        edges = [start, *sorted(at), end]
        longest[p] = max(b - a for a, b in itertools.pairwise(edges))
    return longest


def long_silences(
    deliveries: Sequence[Delivery], start: float, end: float, over_s: float, origin: float
) -> list[tuple[int, float, float, int | None, int | None]]:
    """Each silence longer than ``over_s`` between ``start`` and ``end`` (as
    :func:`longest_silence_s` measures them): (partition, its start from ``origin``, seconds,
    the offset delivered just before it, the offset delivered just after it), to tell from the
    logs what the partition's member waited on."""
    by_partition: dict[int, list[Delivery]] = defaultdict(list)
    for d in deliveries:
        if start <= d.at <= end:
            by_partition[d.partition].append(d)
    found = []
    for p, ds in by_partition.items():
        ds.sort(key=lambda d: d.at)
        edges: list[tuple[float, int | None]] = [
            (start, None),
            *((d.at, d.offset) for d in ds),
            (end, None),
        ]
        for (a, before), (b, after) in itertools.pairwise(edges):
            if b - a > over_s:
                found.append((p, round(a - origin, 1), round(b - a, 1), before, after))
    return sorted(found)


def check_group(
    acked: Mapping[bytes, tuple[int, int | None]],
    deliveries: Sequence[Delivery],
    commits: Sequence[Commit],
    polls: Sequence[tuple[float, Mapping[int, int]]],
    ends: Mapping[int, int],
) -> dict[str, int]:
    """The group's counts (pure): acked records never delivered, deliveries beyond the first of
    an offset, committed offsets going back (OffsetFetch, commits) and partitions whose last
    committed offset is not their high watermark."""
    delivered_values = {d.value for d in deliveries}
    offsets_seen = {(d.partition, d.offset) for d in deliveries}
    final = dict(polls[-1][1]) if polls else {}
    unfinished = sum(1 for p, end in ends.items() if end > 0 and final.get(p, NO_OFFSET) != end)
    return {
        "group_undelivered": sum(1 for value in acked if value not in delivered_values),
        "group_duplicates": len(deliveries) - len(offsets_seen),
        "group_backwards_fetched": backwards_in_polls(polls),
        "group_backwards_committed": backwards_in_commits(commits),
        "group_unfinished_partitions": unfinished,
    }
