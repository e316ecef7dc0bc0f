"""The desired owner of every partition: one pure, sticky, balanced decision (DESIGN §3.10).

``decide_assignment`` is the only place that chooses which broker should own which partition.
The operator calls it on scale events and pod terminations, ``kafscale local`` outside
Kubernetes; brokers only follow the result. It does no I/O and takes everything it needs as
arguments, so the properties below are tested directly (tests/unit/test_assignment.py):

* every partition is assigned exactly once, to one of the given (live, non-draining) brokers;
* balanced: per-broker counts differ by at most one;
* sticky with minimal moves: among all balanced assignments it keeps the most partitions on
  their previous owner, so unchanged brokers mean no moves, adding a broker moves only what the
  newcomer must take, and removing one moves only the partitions it held;
* deterministic: the same partitions, brokers and previous owners give the same result whatever
  their order;
* a partition without a live previous owner (a new one, or one whose owner left) goes to
  ``leaders.stable_pick``'s broker among the given ones when that broker has room: that is the
  broker Metadata names leader while the partition has neither a live lease holder nor a live
  assigned owner (``leaders.leader_for``), which claims it on demand at the first produce, so
  writing the assignment hands nothing off. A broker leaving costs each of its partitions one
  move, not two (to the claimer, then to a broker dealt round-robin).

The assignment is stored at ``keys.assignment_key(cluster)`` as UTF-8 JSON::

    {"version": 1, "generation": 7, "owners": {"orders/0": 1, "orders/1": 2, "audit/0": 1}}

``generation`` grows by one with every write, so a broker can tell a newer decision from an
older one. ``owners`` maps ``"<topic>/<partition>"`` to a broker id; Kafka topic names cannot
contain ``/``, so the last ``/`` separates the partition number. Keys are written in
(topic, partition) order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kafscale.broker.metadata.leaders import stable_pick

TopicPartition = tuple[str, int]

FORMAT_VERSION = 1


def decide_assignment(
    partitions: Sequence[TopicPartition],
    brokers: Sequence[int],
    previous: Mapping[TopicPartition, int],
) -> dict[TopicPartition, int]:
    """Map every partition to a broker: balanced, sticky, minimal moves, deterministic.

    Each broker gets a quota of ``n // m`` partitions, and ``n % m`` brokers get one more. The
    extra slots go to the brokers that already hold the most partitions (ties: lower id), which
    maximises how many partitions stay where they are. Every broker keeps its previous
    partitions up to its quota (lowest first). A partition without a live previous owner (new,
    or its owner departed) then goes to its stable pick (the leader Metadata names for it
    meanwhile) if that broker has room; the rest, with what brokers over their quota shed, are
    dealt round-robin to brokers with room, in sorted order.
    """
    live = sorted(set(brokers))
    wanted = sorted(set(partitions))
    if not live:
        return {}
    kept = _previous_by_broker(wanted, live, previous)
    quotas = _quotas(len(wanted), live, kept)
    result: dict[TopicPartition, int] = {}
    for broker in live:
        for tp in kept[broker][: quotas[broker]]:
            result[tp] = broker
    counts = _counts(result, live)
    for tp, broker in _picks_with_room(wanted, live, previous, quotas, counts).items():
        result[tp] = broker
    pool = [tp for tp in wanted if tp not in result]
    _deal(pool, live, quotas, counts, result)
    return result


def _picks_with_room(
    wanted: Sequence[TopicPartition],
    live: Sequence[int],
    previous: Mapping[TopicPartition, int],
    quotas: Mapping[int, int],
    counts: dict[int, int],
) -> dict[TopicPartition, int]:
    """Partitions without a live previous owner placed on their stable pick while it has room
    (``counts`` is updated). Those of a live owner over its quota are not: the owner still holds
    them, nobody has claimed them on demand, so any broker with room is as good."""
    placed: dict[TopicPartition, int] = {}
    for tp in wanted:
        if previous.get(tp) in quotas:  # a live owner: kept, or shed by it
            continue
        broker = stable_pick(tp, live)
        if counts[broker] < quotas[broker]:
            placed[tp] = broker
            counts[broker] += 1
    return placed


def _previous_by_broker(
    wanted: Sequence[TopicPartition], live: Sequence[int], previous: Mapping[TopicPartition, int]
) -> dict[int, list[TopicPartition]]:
    """Each live broker's previous partitions that still exist, sorted."""
    held: dict[int, list[TopicPartition]] = {broker: [] for broker in live}
    for tp in wanted:
        owner = previous.get(tp)
        if owner is not None and owner in held:
            held[owner].append(tp)
    return held


def _quotas(
    total: int, live: Sequence[int], kept: Mapping[int, list[TopicPartition]]
) -> dict[int, int]:
    """``total // m`` each, plus one for the ``total % m`` brokers holding the most already."""
    base, extra = divmod(total, len(live))
    by_holding = sorted(live, key=lambda broker: (-len(kept[broker]), broker))
    bonus = set(by_holding[:extra])
    return {broker: base + (1 if broker in bonus else 0) for broker in live}


def _counts(result: Mapping[TopicPartition, int], live: Iterable[int]) -> dict[int, int]:
    counts = dict.fromkeys(live, 0)
    for broker in result.values():
        counts[broker] += 1
    return counts


def _deal(
    pool: Sequence[TopicPartition],
    live: Sequence[int],
    quotas: Mapping[int, int],
    counts: dict[int, int],
    result: dict[TopicPartition, int],
) -> None:
    """Round-robin over brokers with room, so a topic's new partitions spread out."""
    turn = 0
    for tp in pool:
        while counts[live[turn % len(live)]] >= quotas[live[turn % len(live)]]:
            turn += 1
        broker = live[turn % len(live)]
        result[tp] = broker
        counts[broker] += 1
        turn += 1


def count_moves(before: Mapping[TopicPartition, int], after: Mapping[TopicPartition, int]) -> int:
    """Partitions present in both whose owner differs (new or dropped partitions are no move)."""
    return sum(1 for tp, owner in after.items() if tp in before and before[tp] != owner)


@dataclass(frozen=True)
class Assignment:
    """A stored decision: the owners and the generation that orders decisions."""

    generation: int
    owners: dict[TopicPartition, int] = field(default_factory=dict)

    def to_json(self) -> bytes:
        owners = {f"{topic}/{p}": self.owners[(topic, p)] for topic, p in sorted(self.owners)}
        document = {"version": FORMAT_VERSION, "generation": self.generation, "owners": owners}
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Assignment:
        """Parse the stored form; ValueError names what is wrong."""
        document = json.loads(data)
        if not isinstance(document, dict):
            raise ValueError("assignment: expected a JSON object")
        generation = document.get("generation")
        owners = document.get("owners")
        if not isinstance(generation, int) or isinstance(generation, bool):
            raise ValueError(f"assignment: generation must be an integer, not {generation!r}")
        if not isinstance(owners, dict):
            raise ValueError("assignment: owners must be an object")
        return cls(
            generation, {_parse_partition(name): _parse_broker(b) for name, b in owners.items()}
        )


def _parse_partition(name: str) -> TopicPartition:
    topic, sep, number = name.rpartition("/")
    if not sep or not topic or not number.isdigit():
        raise ValueError(f"assignment: bad partition name {name!r} (want 'topic/partition')")
    return topic, int(number)


def _parse_broker(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"assignment: broker id must be an integer, not {value!r}")
    return value
