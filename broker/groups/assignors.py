"""Server-side assignors of the consumer group protocol (KIP-848): ``uniform`` and ``range``.

A consumer-protocol group's target assignment is computed here, on the coordinator, from the
members' subscriptions and the subscribed topics' partition counts. Both are pure functions.

* ``uniform`` (the default, as in Kafka): balanced and sticky. A member keeps what it holds while
  it stays subscribed and under its fair share, so an added member takes partitions from others
  without reshuffling the rest (only moved partitions go through revocation). With identical
  subscriptions the members' counts differ by at most one.
* ``range``: Kafka's range assignment, topic by topic: the members subscribed to a topic, sorted
  by member id, each get a contiguous range, the first ``partitions % members`` one more.

The group uses the assignor most of its members ask for (ties: the name first in
``ASSIGNORS``), as Kafka's coordinator does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

TopicPartition = tuple[str, int]
Assignment = dict[str, frozenset[TopicPartition]]

UNIFORM = "uniform"
RANGE = "range"
ASSIGNORS = (UNIFORM, RANGE)


def choose_assignor(requested: Iterable[str | None], default: str = UNIFORM) -> str:
    """The group's assignor: the one most members name (None: no preference)."""
    counts = Counter(name for name in requested if name is not None)
    if not counts:
        return default
    best = max(counts.values())
    return next(name for name in ASSIGNORS if counts.get(name) == best)


def assign(
    assignor: str,
    subscriptions: Mapping[str, frozenset[str]],
    partitions: Mapping[str, int],
    current: Mapping[str, frozenset[TopicPartition]],
) -> Assignment:
    """The target assignment: member id -> partitions, every subscribed partition once."""
    if assignor == RANGE:
        return assign_range(subscriptions, partitions)
    return assign_uniform(subscriptions, partitions, current)


def _subscribed_partitions(
    subscriptions: Mapping[str, frozenset[str]], partitions: Mapping[str, int]
) -> list[TopicPartition]:
    topics = sorted({t for topics in subscriptions.values() for t in topics if t in partitions})
    return [(t, p) for t in topics for p in range(partitions[t])]


def assign_range(
    subscriptions: Mapping[str, frozenset[str]], partitions: Mapping[str, int]
) -> Assignment:
    result: dict[str, set[TopicPartition]] = {m: set() for m in subscriptions}
    topics = sorted({t for topics in subscriptions.values() for t in topics if t in partitions})
    for topic in topics:
        members = sorted(m for m, subscribed in subscriptions.items() if topic in subscribed)
        count = partitions[topic]
        share, extra = divmod(count, len(members))
        start = 0
        for index, member in enumerate(members):
            size = share + (1 if index < extra else 0)
            result[member].update((topic, p) for p in range(start, start + size))
            start += size
    return {m: frozenset(tps) for m, tps in result.items()}


def assign_uniform(
    subscriptions: Mapping[str, frozenset[str]],
    partitions: Mapping[str, int],
    current: Mapping[str, frozenset[TopicPartition]],
) -> Assignment:
    """Sticky and balanced: keep what fits under the fair share, give the rest to the least
    loaded subscribed member."""
    members = sorted(subscriptions)
    if not members:
        return {}
    wanted = _subscribed_partitions(subscriptions, partitions)
    quota = -(-len(wanted) // len(members))  # ceiling: nobody keeps more than this
    result: dict[str, set[TopicPartition]] = {m: set() for m in members}
    taken: set[TopicPartition] = set()
    for member in members:
        kept = sorted(
            tp
            for tp in current.get(member, frozenset())
            if tp[0] in subscriptions[member] and tp[0] in partitions and tp[1] < partitions[tp[0]]
        )
        for tp in kept[:quota]:
            if tp not in taken:
                result[member].add(tp)
                taken.add(tp)
    for tp in wanted:
        if tp in taken:
            continue
        eligible = [m for m in members if tp[0] in subscriptions[m]]
        chosen = min(eligible, key=lambda m: (len(result[m]), m))
        result[chosen].add(tp)
        taken.add(tp)
    _rebalance(result, subscriptions)
    return {m: frozenset(tps) for m, tps in result.items()}


def _rebalance(
    result: dict[str, set[TopicPartition]], subscriptions: Mapping[str, frozenset[str]]
) -> None:
    """Move partitions from the most to the least loaded member while that narrows the gap
    (kept partitions under a quota can still leave some members short)."""
    while True:
        moved = False
        for low in sorted(result, key=lambda m: (len(result[m]), m)):
            donors = sorted(result, key=lambda m: (-len(result[m]), m))
            for high in donors:
                if len(result[high]) - len(result[low]) <= 1:
                    break
                movable = sorted(tp for tp in result[high] if tp[0] in subscriptions[low])
                if movable:
                    tp = movable[-1]
                    result[high].discard(tp)
                    result[low].add(tp)
                    moved = True
                    break
            if moved:
                break
        if not moved:
            return
