"""Group size limits as pure decisions: may this join take a seat in the group?

Kafka bounds a group's members with ``group.max.size`` for classic groups (KIP-389) and
``group.consumer.max.size`` for consumer-protocol groups (KIP-848), and share groups with
``group.share.max.size``; all default to unbounded but the share one. A join the group cannot
seat gets GROUP_MAX_SIZE_REACHED, which clients treat as fatal: the bound is what stops a
runaway deployment (or a loop of consumers with fresh ids) from growing one group's rebalances,
assignments and stored record without end.

Who counts follows Kafka's ``GroupMetadataManager`` (``acceptJoiningMember``,
``throwIfConsumerGroupIsFull``):

* A member the group already has is never new. A static member coming back under a new member
  id with a ``group.instance.id`` the group knows takes its own seat back (Kafka: KAFKA-20601 for
  consumer groups; done here for classic groups alike, where a restarted static member would
  otherwise be refused by its own group).
* Member ids handed out with MEMBER_ID_REQUIRED (a classic group's pending members) take no
  seat: the join that brings the id back is checked like any new one.
* A classic group that is rebalancing counts the members that rejoined so far, not all members:
  those that do not rejoin are dropped when the join phase completes, and a group over its limit
  (the limit lowered, the group loaded by a new coordinator) sheds the members that rejoin last.
* A consumer-protocol group counts every member, classic members inside it included (a mixed
  group during a rolling upgrade).
"""

from __future__ import annotations

UNBOUNDED = 2**31 - 1
"""Kafka's default for ``group.max.size`` and ``group.consumer.max.size`` (Integer.MAX_VALUE)."""


def admits_join(max_size: int, members: int, known: bool) -> bool:
    """A consumer-protocol or share group: may a join (epoch 0) take a seat? ``members``: the
    group's members now, classic ones inside a consumer group included; ``known``: the joining
    member is one of them (by member id, or a static member by its group.instance.id)."""
    return known or members < max_size


def admits_classic_join(
    max_size: int,
    *,
    rebalancing: bool,
    members: int,
    rejoined: int,
    known: bool,
    known_rejoined: bool,
) -> bool:
    """A classic group (not Dead): may this JoinGroup take a seat?

    ``rebalancing``: the group is PreparingRebalance; ``rejoined``: members whose JoinGroup is
    waiting in it; ``known``: the joining member is a member (by member id, or a static member
    by its group.instance.id; a pending member id is not), ``known_rejoined``: and it is one of
    those waiting. An Empty group has no members: it seats anyone."""
    if rebalancing:
        return known_rejoined or rejoined < max_size
    return known or members < max_size


def over_capacity(members: int, max_size: int) -> bool:
    """A group holding more members than its limit (the limit was lowered, or the group is
    converted between protocols whose limits differ)."""
    return members > max_size
