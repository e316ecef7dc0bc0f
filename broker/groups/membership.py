"""A consumer group's state and the mechanics of a rebalance (the base of ``group.Group``).

Kafka's ``GroupMetadata`` plus the rebalance steps of its ``GroupCoordinator``: who the members
are (and the static ones by group.instance.id), which member ids are pending, who leads, how a
rebalance is prepared and completed (members that did not rejoin are dropped, a leader is
elected among those that did, the protocol is chosen by vote, the generation advances), and how
assignments or errors reach members waiting in SyncGroup. ``group.Group`` adds the protocol's
requests and timers on top. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping

from kafscale.broker.groups.model import (
    UNKNOWN_MEMBER_ID,
    Effect,
    EmptyStore,
    GroupConfig,
    GroupDescription,
    GroupRecord,
    GroupState,
    JoinedMember,
    JoinResult,
    Member,
    MemberDescription,
    MemberRecord,
    Protocols,
    Reply,
    Store,
    SyncResult,
)
from kafscale.broker.groups.session_resume import resumed_deadline_ms, resumed_join_deadline_ms
from kafscale.broker.protocol.errors import ErrorCode

_CAN_REBALANCE = (GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY)


class GroupCore:
    """One consumer group's membership and rebalance state."""

    def __init__(self, group_id: str, config: GroupConfig, now_ms: int) -> None:
        self.group_id = group_id
        self.config = config
        self.state = GroupState.EMPTY
        self.state_since_ms = now_ms
        self.generation = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}
        self.static_members: dict[str, str] = {}
        """group.instance.id → current member id."""
        self.pending_members: dict[str, tuple[int, int]] = {}
        """Member ids handed out with MEMBER_ID_REQUIRED → (when they expire, the session
        timeout they were asked with)."""
        self.pending_sync: set[str] = set()
        """Members of this generation that have not sent SyncGroup yet."""
        self._join_deadline_ms: int | None = None
        self._initial_delay: tuple[int, int] | None = None
        """(current delay, remaining budget) while in the initial rebalance delay."""
        self._new_member_added = False
        self._sync_deadline: tuple[int, int] | None = None
        """(deadline, generation) for the members' SyncGroup after a join completed."""
        self._next_ticket = 1
        self._effects: list[Effect] = []

    # --- records and queries ----------------------------------------------------------------------

    def record(self, assignment: Mapping[str, bytes] | None = None) -> GroupRecord:
        protocol = self.protocol_name or ""
        members = tuple(
            MemberRecord(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                rebalance_timeout_ms=m.rebalance_timeout_ms,
                session_timeout_ms=m.session_timeout_ms,
                subscription=m.metadata(protocol),
                assignment=m.assignment if assignment is None else assignment.get(m.member_id, b""),
            )
            for m in self.members.values()
        )
        return GroupRecord(
            self.protocol_type, self.generation, self.protocol_name, self.leader_id, members
        )

    def take_effects(self) -> list[Effect]:
        effects, self._effects = self._effects, []
        return effects

    # --- queries ------------------------------------------------------------------------------

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def has_all_members_joined(self) -> bool:
        waiting = sum(1 for m in self.members.values() if m.awaiting_join)
        return len(self.members) == waiting and not self.pending_members

    def is_static_member_fenced(self, group_instance_id: str | None, member_id: str) -> bool:
        if group_instance_id is None:
            return False
        current = self.static_members.get(group_instance_id)
        return current is not None and current != member_id

    def describe(self) -> GroupDescription:
        stable = self.state is GroupState.STABLE
        protocol = (self.protocol_name or "") if stable else ""
        members = tuple(
            MemberDescription(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                metadata=m.metadata(protocol) if stable else b"",
                assignment=m.assignment if stable else b"",
            )
            for m in self.members.values()
        )
        return GroupDescription(self.state, self.protocol_type or "", protocol, members)

    def next_deadline_ms(self) -> int | None:
        deadlines = [expiry_ms for expiry_ms, _ in self.pending_members.values()]
        deadlines.extend(
            m.heartbeat_deadline_ms
            for m in self.members.values()
            if m.heartbeat_deadline_ms is not None
        )
        if self._join_deadline_ms is not None and self.state is GroupState.PREPARING_REBALANCE:
            deadlines.append(self._join_deadline_ms)
        if self._sync_deadline is not None:
            deadlines.append(self._sync_deadline[0])
        return min(deadlines, default=None)

    # --- rebalance ----------------------------------------------------------------------------

    def _maybe_prepare_rebalance(self, now_ms: int) -> None:
        if self.state in _CAN_REBALANCE:
            self._prepare_rebalance(now_ms)

    def _prepare_rebalance(self, now_ms: int) -> None:
        if self.state is GroupState.COMPLETING_REBALANCE:
            self._reset_and_propagate_assignment_error(now_ms, ErrorCode.REBALANCE_IN_PROGRESS)
        self._sync_deadline = None
        if self.state is GroupState.EMPTY:
            delay_ms = self.config.initial_rebalance_delay_ms
            self._initial_delay = (delay_ms, max(self.rebalance_timeout_ms - delay_ms, 0))
            self._join_deadline_ms = now_ms + delay_ms
        else:
            self._initial_delay = None
            self._join_deadline_ms = now_ms + self.rebalance_timeout_ms
        self._transition(GroupState.PREPARING_REBALANCE, now_ms)
        self._try_complete_join(now_ms)

    def _try_complete_join(self, now_ms: int) -> None:
        """Complete the join early once everyone is in (never during the initial delay)."""
        if (
            self.state is GroupState.PREPARING_REBALANCE
            and self._initial_delay is None
            and self.has_all_members_joined()
        ):
            self._complete_join(now_ms)

    def _complete_join(self, now_ms: int) -> None:
        self._join_deadline_ms = None
        self._initial_delay = None
        for member in list(self.members.values()):
            if not member.awaiting_join and not member.is_static:
                self._answer_removed(member)
                self._remove(member.member_id)
        if self.state is GroupState.DEAD:
            return
        if not self._maybe_elect_new_joined_leader() and self.members:
            # Nobody rejoined (only static members remain): wait another rebalance timeout.
            self._join_deadline_ms = now_ms + self.rebalance_timeout_ms
            return
        self._init_next_generation(now_ms)
        if self.state is GroupState.EMPTY:
            self._effects.append(Store(EmptyStore(self.generation), self.record()))
            return
        members = self._member_list()
        for member in self.members.values():
            is_leader = member.member_id == self.leader_id
            result = JoinResult(
                error=ErrorCode.NONE,
                member_id=member.member_id,
                generation_id=self.generation,
                protocol_type=self.protocol_type,
                protocol_name=self.protocol_name,
                leader_id=self.leader_id or "",
                members=members if is_leader else (),
            )
            self._invoke_join(member, result)
            self._schedule_heartbeat(member, now_ms)
            member.is_new = False
            self.pending_sync.add(member.member_id)
        self._sync_deadline = (now_ms + self.rebalance_timeout_ms, self.generation)

    def _maybe_elect_new_joined_leader(self) -> bool:
        if self.leader_id is None:
            return False
        leader = self.members.get(self.leader_id)
        if leader is not None and leader.awaiting_join:
            return True
        for member in self.members.values():
            if member.awaiting_join:
                self.leader_id = member.member_id
                return True
        return False

    def _init_next_generation(self, now_ms: int) -> None:
        self.generation += 1
        if self.members:
            self.protocol_name = self._select_protocol()
            self._transition(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self._transition(GroupState.EMPTY, now_ms)
        self.pending_sync.clear()

    def _select_protocol(self) -> str:
        """The protocol all members support that most members prefer (ties: first voted)."""
        candidates = {
            name
            for name in self._all_protocol_names()
            if self._support_count(name) == len(self.members)
        }
        votes: dict[str, int] = {}
        for member in self.members.values():
            choice = member.vote(candidates)
            if choice is not None:
                votes[choice] = votes.get(choice, 0) + 1
        if not votes:
            first = next(iter(self.members.values()), None)
            return first.protocols[0][0] if first is not None and first.protocols else ""
        return max(votes, key=votes.__getitem__)

    def _supports_protocols(self, protocol_type: str, protocols: Protocols) -> bool:
        names = [name for name, _ in protocols]
        if self.state is GroupState.EMPTY:
            return bool(protocol_type) and bool(names)
        return self.protocol_type == protocol_type and any(
            self._support_count(name) == len(self.members) for name in names
        )

    def _support_count(self, protocol: str) -> int:
        return sum(1 for m in self.members.values() if protocol in m.protocol_names())

    def _all_protocol_names(self) -> list[str]:
        seen: dict[str, None] = {}
        for member in self.members.values():
            for name in member.protocol_names():
                seen.setdefault(name, None)
        return list(seen)

    def _member_list(self) -> tuple[JoinedMember, ...]:
        protocol = self.protocol_name or ""
        return tuple(
            JoinedMember(m.member_id, m.group_instance_id, m.metadata(protocol))
            for m in self.members.values()
        )

    def _reset_and_propagate_assignment_error(self, now_ms: int, error: ErrorCode) -> None:
        for member in self.members.values():
            member.assignment = b""
        self._propagate_assignment(now_ms, error)

    def _propagate_assignment(self, now_ms: int, error: ErrorCode) -> None:
        ok = error is ErrorCode.NONE
        protocol_type = self.protocol_type if ok else None
        protocol_name = self.protocol_name if ok else None
        for member in self.members.values():
            if member.sync_ticket is None:
                continue
            ticket, member.sync_ticket = member.sync_ticket, None
            self._reply(ticket, SyncResult(error, protocol_type, protocol_name, member.assignment))
            # A session that ran out while waiting for the assignment starts again now.
            self._schedule_heartbeat(member, now_ms)

    def _remove_pending_sync(self, member_id: str) -> None:
        self.pending_sync.discard(member_id)
        if not self.pending_sync:
            self._sync_deadline = None

    # --- membership ---------------------------------------------------------------------------

    def _add(self, member: Member, ticket: int) -> None:
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        member.join_ticket = ticket
        self.pending_members.pop(member.member_id, None)

    def _update_member(
        self,
        member: Member,
        protocols: Protocols,
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        ticket: int | None,
    ) -> None:
        member.protocols = protocols
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        if member.join_ticket is not None and ticket is not None:
            # A second join from the same member replaces the first; answer the first.
            self._reply(
                member.join_ticket,
                JoinResult(ErrorCode.REBALANCE_IN_PROGRESS, member.member_id),
            )
        member.join_ticket = ticket

    def _replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> Member:
        member = self.members.pop(old_id)
        # Whoever still waits under the old id is a duplicate instance: fence it now.
        if member.join_ticket is not None:
            self._reply(member.join_ticket, JoinResult(ErrorCode.FENCED_INSTANCE_ID, old_id))
            member.join_ticket = None
        if member.sync_ticket is not None:
            self._reply(member.sync_ticket, SyncResult(ErrorCode.FENCED_INSTANCE_ID))
            member.sync_ticket = None
        member.member_id = new_id
        self.members[new_id] = member
        if self.leader_id == old_id:
            self.leader_id = new_id
        if old_id in self.pending_sync:
            self.pending_sync.discard(old_id)
            self.pending_sync.add(new_id)
        self.static_members[instance_id] = new_id
        return member

    def _remove(self, member_id: str) -> None:
        member = self.members.pop(member_id, None)
        if member is not None and member.group_instance_id is not None:
            self.static_members.pop(member.group_instance_id, None)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        self.pending_members.pop(member_id, None)
        self.pending_sync.discard(member_id)

    def _answer_removed(self, member: Member) -> None:
        """A removed member's waiting requests learn that it is gone."""
        if member.join_ticket is not None:
            self._reply(
                member.join_ticket, JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, UNKNOWN_MEMBER_ID)
            )
            member.join_ticket = None
        if member.sync_ticket is not None:
            self._reply(member.sync_ticket, SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
            member.sync_ticket = None

    def _remove_member_and_update_group(self, now_ms: int, member: Member) -> None:
        self._answer_removed(member)
        self._remove(member.member_id)
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(now_ms)
        elif self.state is GroupState.PREPARING_REBALANCE:
            self._try_complete_join(now_ms)

    def _remove_pending_member(self, now_ms: int, member_id: str) -> None:
        self._remove(member_id)
        if self.state is GroupState.PREPARING_REBALANCE:
            self._try_complete_join(now_ms)

    # --- small helpers ------------------------------------------------------------------------

    def _invoke_join(self, member: Member, result: JoinResult) -> None:
        if member.join_ticket is not None:
            ticket, member.join_ticket = member.join_ticket, None
            self._reply(ticket, result)

    def _reply(self, ticket: int, result: JoinResult | SyncResult) -> None:
        self._effects.append(Reply(ticket, result))

    def resume_sessions(self, now_ms: int) -> None:
        """A whole session from ``now_ms`` for each member with a heartbeat timer, and a whole
        phase for a rebalance waiting on members to rejoin or sync: the coordinator resumed its
        etcd session after refusing them (``session_resume``). A member id handed out with
        MEMBER_ID_REQUIRED gets a whole session too: its JoinGroup with it was refused."""
        self.pending_members = {
            member_id: (resumed_deadline_ms(expiry_ms, now_ms, session_ms), session_ms)
            for member_id, (expiry_ms, session_ms) in self.pending_members.items()
        }
        for member in self.members.values():
            member.heartbeat_deadline_ms = resumed_deadline_ms(
                member.heartbeat_deadline_ms, now_ms, member.session_timeout_ms
            )
        if self.state is GroupState.PREPARING_REBALANCE:
            delay_ms = None if self._initial_delay is None else self._initial_delay[0]
            self._join_deadline_ms = resumed_join_deadline_ms(
                self._join_deadline_ms, now_ms, self.rebalance_timeout_ms, delay_ms
            )
        if self._sync_deadline is not None:
            deadline_ms, generation = self._sync_deadline
            deadline_ms = resumed_deadline_ms(deadline_ms, now_ms, self.rebalance_timeout_ms)
            self._sync_deadline = (deadline_ms, generation)

    def _schedule_heartbeat(
        self, member: Member, now_ms: int, timeout_ms: int | None = None
    ) -> None:
        timeout = member.session_timeout_ms if timeout_ms is None else timeout_ms
        member.heartbeat_deadline_ms = now_ms + timeout

    def _new_ticket(self) -> int:
        ticket = self._next_ticket
        self._next_ticket += 1
        return ticket

    def _transition(self, state: GroupState, now_ms: int) -> None:
        self.state = state
        self.state_since_ms = now_ms
