"""Online migration between the classic and the consumer protocol (KIP-848), as pure functions.

A rolling upgrade switches a group's consumers to ``group.protocol=consumer`` one instance at a
time, so for a while classic and consumer-protocol members share one group. Kafka 4 (its
default ``group.consumer.migration.policy=bidirectional``) handles this as done here:

* The first consumer-protocol heartbeat to a classic group with members converts it into a
  consumer group (``consumer_group_from_classic``): each classic member becomes a member that
  holds what its classic assignment gave it, under its member id, at the group's generation.
* Classic members inside a consumer group keep speaking JoinGroup, SyncGroup, Heartbeat and
  LeaveGroup (``join``, ``sync``, ``heartbeat``, ``leave``). Their target comes from the
  server-side assignor like everyone's; a heartbeat answers REBALANCE_IN_PROGRESS when the
  member must catch up (a new group epoch, partitions to revoke, freed partitions to take), the
  member rejoins, and its JoinGroup is answered at once (as a follower: no members, no leader
  work) with the member epoch as generation; SyncGroup hands it its partitions. What a classic
  member reports owning in its subscription is how it confirms a revocation; a partition
  still moves only after its old owner released it.
* When the last consumer-protocol member leaves and only classic members remain, the group
  becomes a classic group again (``classic_group_from_consumer``) and rebalances.

Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kafscale.broker.groups import size_limits
from kafscale.broker.groups.consumer import (
    ClassicMember,
    ConsumerConfig,
    ConsumerGroup,
    ConsumerMember,
)
from kafscale.broker.groups.group import Group
from kafscale.broker.groups.model import (
    UNKNOWN_MEMBER_ID,
    GroupConfig,
    GroupRecord,
    JoinRequest,
    JoinResult,
    Member,
    MemberRecord,
    SyncRequest,
    SyncResult,
)
from kafscale.broker.groups.reconcile import MemberAssignment, TopicPartition, reconcile
from kafscale.broker.groups.subscriptions import CONSUMER_PROTOCOL_TYPE
from kafscale.broker.protocol.codec import (
    decode_consumer_assignment,
    decode_consumer_subscription,
    encode_consumer_assignment,
)
from kafscale.broker.protocol.errors import ErrorCode

# --- classic -> consumer ----------------------------------------------------------------------


def _member_metadata(group: Group, member: Member) -> bytes:
    """The member's metadata for the group's protocol (its preferred one before a vote)."""
    if group.protocol_name:
        return member.metadata(group.protocol_name)
    return member.protocols[0][1] if member.protocols else b""


def upgrade_refusal(group: Group, config: ConsumerConfig) -> str | None:
    """Why this classic group with members cannot become a consumer group (None: it can).

    Kafka refuses groups that do not use the consumer protocol's embedded format (protocol
    type "consumer" and readable ConsumerProtocolSubscriptions), and groups too large."""
    if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
        return f"group {group.group_id} uses protocol type {group.protocol_type!r}, not consumer"
    if size_limits.over_capacity(len(group.members), config.max_size):
        return (
            f"group {group.group_id} has more members than a consumer group may "
            f"(group.consumer.max.size {config.max_size})"
        )
    for member in group.members.values():
        if decode_consumer_subscription(_member_metadata(group, member)) is None:
            return f"member {member.member_id} has no readable consumer subscription"
        if member.assignment and decode_consumer_assignment(member.assignment) is None:
            return f"member {member.member_id} has no readable consumer assignment"
    return None


def consumer_group_from_classic(group: Group, config: ConsumerConfig, now_ms: int) -> ConsumerGroup:
    """The consumer group a classic group becomes (check ``upgrade_refusal`` first).

    Each member holds what its last classic assignment gave it, at the generation as its epoch;
    the target is that assignment until the next heartbeat recomputes it."""
    consumer = ConsumerGroup(group.group_id, config, group.generation)
    for member in group.members.values():
        subscription = decode_consumer_subscription(_member_metadata(group, member))
        assert subscription is not None
        held = decode_consumer_assignment(member.assignment) or frozenset()
        converted = ConsumerMember(
            member_id=member.member_id,
            instance_id=member.group_instance_id,
            rack_id=subscription.rack_id,
            client_id=member.client_id,
            client_host=member.client_host,
            rebalance_timeout_ms=member.rebalance_timeout_ms,
            topic_names=tuple(sorted(subscription.topics)),
            current=MemberAssignment(group.generation, held),
            session_deadline_ms=now_ms + member.session_timeout_ms,
            classic=ClassicMember(member.session_timeout_ms, member.protocols),
        )
        consumer.members[member.member_id] = converted
        if member.group_instance_id is not None:
            consumer.static_members[member.group_instance_id] = member.member_id
        consumer.target[member.member_id] = held
    return consumer


# --- consumer -> classic ----------------------------------------------------------------------


def should_downgrade(consumer: ConsumerGroup, classic_max_size: int) -> bool:
    """Only classic members remain: the group goes back to the classic protocol, unless they
    are more than a classic group may have (``group.max.size``): then, as in Kafka, it stays
    a consumer group of classic members."""
    if not consumer.members or consumer.has_consumer_members():
        return False
    return not size_limits.over_capacity(len(consumer.members), classic_max_size)


def _common_protocol(members: Sequence[ConsumerMember]) -> str:
    """The first member's most preferred protocol that every member supports."""
    names = [[name for name, _ in m.classic.protocols] for m in members if m.classic is not None]
    for name in names[0] if names else ():
        if all(name in theirs for theirs in names):
            return name
    return names[0][0] if names and names[0] else ""


def classic_group_from_consumer(consumer: ConsumerGroup, config: GroupConfig, now_ms: int) -> Group:
    """The classic group a consumer group of classic members becomes, rebalancing at once:
    every member keeps its partitions until it rejoins (an eager member revokes them first)."""
    members = [m for m in consumer.members.values() if m.classic is not None]
    protocol = _common_protocol(members)
    records = tuple(
        MemberRecord(
            member_id=m.member_id,
            group_instance_id=m.instance_id,
            client_id=m.client_id,
            client_host=m.client_host,
            rebalance_timeout_ms=m.rebalance_timeout_ms,
            session_timeout_ms=m.classic.session_timeout_ms,
            subscription=dict(m.classic.protocols).get(protocol, b""),
            assignment=encode_consumer_assignment(m.current.held),
        )
        for m in members
        if m.classic is not None
    )
    leader = records[0].member_id if records else None
    record = GroupRecord(CONSUMER_PROTOCOL_TYPE, consumer.group_epoch, protocol, leader, records)
    group = Group.from_record(consumer.group_id, config, record, now_ms)
    group.rebalance(now_ms)
    return group


# --- classic members inside a consumer group --------------------------------------------------


def join(
    consumer: ConsumerGroup, now_ms: int, request: JoinRequest, topics: Mapping[str, int]
) -> JoinResult:
    """JoinGroup from a classic member of a consumer group: answered at once."""
    subscription = (
        decode_consumer_subscription(request.protocols[0][1]) if request.protocols else None
    )
    if request.protocol_type != CONSUMER_PROTOCOL_TYPE or subscription is None:
        return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, request.member_id)
    member_id = request.member_id
    if member_id == UNKNOWN_MEMBER_ID:
        prefix = request.group_instance_id or request.client_id
        member_id = f"{prefix}-{request.fresh_id}"
    known = consumer.knows(member_id, request.group_instance_id)
    if not size_limits.admits_join(consumer.config.max_size, len(consumer.members), known):
        # Asked before handing out a member id, as Kafka does: a full group gives none.
        return JoinResult(ErrorCode.GROUP_MAX_SIZE_REACHED, UNKNOWN_MEMBER_ID)
    new_dynamic = request.member_id == UNKNOWN_MEMBER_ID and request.group_instance_id is None
    if new_dynamic and request.require_known_member_id:
        return JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id)
    found = consumer.members.get(member_id)
    if found is not None and found.classic is None:
        return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, request.member_id)
    member = found if found is not None else _add(consumer, member_id, request)
    _update(consumer, member, request, subscription.topics, subscription.rack_id)
    consumer.refresh_target(topics)
    _reconcile(consumer, now_ms, member, subscription.owned)
    assert member.classic is not None
    return JoinResult(
        ErrorCode.NONE,
        member_id,
        generation_id=member.current.epoch,
        protocol_type=CONSUMER_PROTOCOL_TYPE,
        protocol_name=member.classic.protocol_name,
    )


def _add(consumer: ConsumerGroup, member_id: str, request: JoinRequest) -> ConsumerMember:
    instance_id = request.group_instance_id
    if instance_id is not None and (old := consumer.static_members.get(instance_id)):
        # A static member restarted under a new member id: the old one is gone.
        consumer.remove(old)
    member = ConsumerMember(
        member_id=member_id,
        instance_id=instance_id,
        rack_id=None,
        client_id=request.client_id,
        client_host=request.client_host,
        rebalance_timeout_ms=request.rebalance_timeout_ms,
    )
    consumer.members[member_id] = member
    if instance_id is not None:
        consumer.static_members[instance_id] = member_id
    consumer.bump()
    return member


def _update(
    consumer: ConsumerGroup,
    member: ConsumerMember,
    request: JoinRequest,
    topics: Sequence[str],
    rack_id: str | None,
) -> None:
    member.classic = ClassicMember(request.session_timeout_ms, request.protocols)
    member.rebalance_timeout_ms = request.rebalance_timeout_ms
    member.rack_id = rack_id
    names = tuple(sorted(topics))
    if names != member.topic_names:
        member.topic_names = names
        consumer.bump()


def _reconcile(
    consumer: ConsumerGroup,
    now_ms: int,
    member: ConsumerMember,
    owned: frozenset[TopicPartition],
) -> None:
    """One reconciliation step with what the member reports owning. A member that already let
    go of what it must revoke (an eager member revokes everything before it rejoins) takes the
    next step in the same join instead of one heartbeat later."""
    before = member.current
    target = consumer.target_of(member)
    others = consumer.held_by_others(member.member_id)
    after = reconcile(before, target, consumer.assignment_epoch, others, owned)
    if after.revoking and not owned & after.revoking:
        after = reconcile(after, target, consumer.assignment_epoch, others, owned)
    if after.epoch != before.epoch:
        member.previous_epoch = before.epoch
    member.current = after
    assert member.classic is not None
    member.session_deadline_ms = now_ms + member.classic.session_timeout_ms
    if after.revoking and not before.revoking:
        member.revocation_deadline_ms = now_ms + max(member.rebalance_timeout_ms, 0)
    elif not after.revoking:
        member.revocation_deadline_ms = None  # rejoined: no join timeout either


def _classic_member(
    consumer: ConsumerGroup, member_id: str, instance_id: str | None
) -> ConsumerMember | ErrorCode:
    member = consumer.members.get(member_id)
    if member is None or member.classic is None:
        return ErrorCode.UNKNOWN_MEMBER_ID
    if instance_id is not None and member.instance_id != instance_id:
        return ErrorCode.FENCED_INSTANCE_ID
    return member


def sync(consumer: ConsumerGroup, now_ms: int, request: SyncRequest) -> SyncResult:
    """SyncGroup from a classic member: its assignment as a ConsumerProtocolAssignment."""
    member = _classic_member(consumer, request.member_id, request.group_instance_id)
    if isinstance(member, ErrorCode):
        return SyncResult(member)
    assert member.classic is not None
    if request.generation_id != member.current.epoch:
        return SyncResult(ErrorCode.ILLEGAL_GENERATION)
    if request.protocol_type not in (None, CONSUMER_PROTOCOL_TYPE) or request.protocol_name not in (
        None,
        member.classic.protocol_name,
    ):
        return SyncResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
    member.session_deadline_ms = now_ms + member.classic.session_timeout_ms
    member.sent = member.current.assigned
    assignment = encode_consumer_assignment(member.current.assigned)
    return SyncResult(
        ErrorCode.NONE, CONSUMER_PROTOCOL_TYPE, member.classic.protocol_name, assignment
    )


def heartbeat(
    consumer: ConsumerGroup, now_ms: int, member_id: str, instance_id: str | None, generation: int
) -> ErrorCode:
    """Heartbeat from a classic member: REBALANCE_IN_PROGRESS when it must rejoin to catch up."""
    member = _classic_member(consumer, member_id, instance_id)
    if isinstance(member, ErrorCode):
        return member
    assert member.classic is not None
    if generation != member.current.epoch:
        return ErrorCode.ILLEGAL_GENERATION
    member.session_deadline_ms = now_ms + member.classic.session_timeout_ms
    if not must_rejoin(consumer, member):
        return ErrorCode.NONE
    if member.revocation_deadline_ms is None:
        # Kafka's join timeout: a member told to rejoin that does not within its rebalance
        # timeout is removed (and its partitions go back to the group), heartbeats or not.
        member.revocation_deadline_ms = now_ms + max(member.rebalance_timeout_ms, 0)
    return ErrorCode.REBALANCE_IN_PROGRESS


def must_rejoin(consumer: ConsumerGroup, member: ConsumerMember) -> bool:
    """Kafka's three reasons: the group epoch moved on, the member has partitions to revoke,
    or partitions it waits for have been released."""
    current = member.current
    if current.epoch < consumer.group_epoch or current.revoking:
        return True
    missing = consumer.target_of(member) - current.assigned
    return bool(missing - consumer.held_by_others(member.member_id))


def leave(consumer: ConsumerGroup, leaving: Sequence[tuple[str, str | None]]) -> list[ErrorCode]:
    """LeaveGroup of classic members (by member id, or by instance id alone)."""
    errors = []
    for member_id, instance_id in leaving:
        if member_id == UNKNOWN_MEMBER_ID and instance_id is not None:
            member_id = consumer.static_members.get(instance_id, UNKNOWN_MEMBER_ID)
            instance_id = None
        found = _classic_member(consumer, member_id, instance_id)
        if isinstance(found, ErrorCode):
            errors.append(found)
            continue
        consumer.remove(member_id)
        errors.append(ErrorCode.NONE)
    return errors
