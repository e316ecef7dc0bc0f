"""Incremental reconciliation of the consumer group protocol (KIP-848), as a pure function.

The coordinator never hands a partition to a member while another member may still consume it.
Each member moves from its current assignment towards its share of the target assignment in
steps, as Kafka's ``CurrentAssignmentBuilder`` does:

1. Partitions it holds that the target gives to someone else are *revoked* first: the member is
   told its assignment without them and keeps its epoch; the coordinator still counts them as
   the member's until a heartbeat reports owned partitions without them (or the member leaves,
   or is expired).
2. Once nothing is left to revoke, the member moves to the target's epoch and gets the target's
   partitions that nobody else holds (assigned or still revoking). Partitions another member
   has not released yet follow on a later heartbeat, once they are free.

Invariant (a property test checks it): at every step no partition is held by two members.
"""

from __future__ import annotations

from dataclasses import dataclass

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class MemberAssignment:
    """What the coordinator lets a member own now."""

    epoch: int
    assigned: frozenset[TopicPartition] = frozenset()
    revoking: frozenset[TopicPartition] = frozenset()
    """Taken away from the member, but it has not confirmed it stopped consuming them."""

    @property
    def held(self) -> frozenset[TopicPartition]:
        """Partitions nobody else may be given."""
        return self.assigned | self.revoking

    def state(self, target_epoch: int, target: frozenset[TopicPartition]) -> str:
        """Kafka's member states, for ConsumerGroupDescribe and the group's state."""
        if self.revoking:
            return "unrevoked_partitions"
        if self.epoch != target_epoch or self.assigned != target:
            return "unreleased_partitions"
        return "stable"


def reconcile(
    current: MemberAssignment,
    target: frozenset[TopicPartition],
    target_epoch: int,
    held_by_others: frozenset[TopicPartition],
    owned: frozenset[TopicPartition] | None,
) -> MemberAssignment:
    """The member's next assignment.

    ``owned`` is what the member's heartbeat says it owns (None: not sent, unchanged).
    ``held_by_others``: every other member's ``held`` partitions.
    """
    if current.revoking:
        if owned is None or owned & current.revoking:
            return current  # not confirmed yet
        current = MemberAssignment(current.epoch, current.assigned)
    to_revoke = current.assigned - target
    if to_revoke:
        return MemberAssignment(current.epoch, current.assigned & target, to_revoke)
    gained = target - current.assigned - held_by_others
    return MemberAssignment(target_epoch, current.assigned | gained)
