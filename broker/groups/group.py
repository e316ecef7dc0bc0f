"""The classic consumer group protocol as a pure state machine.

This follows Kafka's own ``GroupCoordinator`` and ``GroupMetadata`` (the pre-KIP-848 protocol)
decision by decision: the member-id handshake (MEMBER_ID_REQUIRED from JoinGroup v4), the initial
rebalance delay that grows while new members keep arriving, protocol selection by vote, leader
election among the members that rejoined, static membership (rejoin without a rebalance, fencing
of a duplicate instance), session expiry, the rebalance and pending-sync timeouts, and LeaveGroup
by member or by instance id.

Nothing here does I/O or reads a clock. Each call takes ``now_ms``; deadlines are stored in the
group and fired by ``tick(now_ms)`` (the shell sleeps until ``next_deadline_ms()``). Answers that
cannot be given at once are ``Pending(ticket)``; they arrive later as ``Reply`` effects, and writes
to etcd are ``Store`` effects whose outcome comes back through ``stored()``. Take the effects
after every call with ``take_effects()``.
"""

from __future__ import annotations

from collections.abc import Sequence

from kafscale.broker.groups import size_limits
from kafscale.broker.groups.membership import GroupCore
from kafscale.broker.groups.model import (
    UNKNOWN_MEMBER_ID,
    AssignmentStore,
    GroupConfig,
    GroupRecord,
    GroupState,
    JoinRequest,
    JoinResult,
    Member,
    Pending,
    Protocols,
    StaticRejoinStore,
    Store,
    StoreToken,
    SyncRequest,
    SyncResult,
)
from kafscale.broker.protocol.errors import ErrorCode


class Group(GroupCore):
    """The classic protocol's requests and timers on a group's state."""

    # --- persistence --------------------------------------------------------------------------

    @classmethod
    def from_record(
        cls,
        group_id: str,
        config: GroupConfig,
        record: GroupRecord,
        now_ms: int,
        sessions_since_ms: int | None = None,
    ) -> Group:
        """A group loaded by a new coordinator: Stable with its members, or Empty.

        Every member gets a whole session, so live members keep heartbeating at the same
        generation and nobody rebalances; dead ones expire. The session runs from
        ``sessions_since_ms`` when given (when the last coordinator's lease went: Kafka's new
        coordinator loads its groups at the failover and runs their sessions from then), else
        from now. Groups are taken on at their first request, and after a coordinator froze
        that is a member that gave its member id up at its own session timeout and joins anew:
        a session from now held that rebalance a whole session more for the ghost of that very
        member (``bench/chaos.py``: ~5 s more per coordinator move with a 4-s etcd TTL and
        10-s sessions). A live member heard of no coordinator since the lease went, so a
        session from then is all the time a client gives it too.
        """
        group = cls(group_id, config, now_ms)
        group.generation = record.generation
        group.protocol_type = record.protocol_type
        group.protocol_name = record.protocol_name
        for entry in record.members:
            protocols: Protocols = ((record.protocol_name or "", entry.subscription),)
            member = Member(
                member_id=entry.member_id,
                group_instance_id=entry.group_instance_id,
                client_id=entry.client_id,
                client_host=entry.client_host,
                rebalance_timeout_ms=entry.rebalance_timeout_ms,
                session_timeout_ms=entry.session_timeout_ms,
                protocol_type=record.protocol_type or "",
                protocols=protocols,
                assignment=entry.assignment,
            )
            group.members[member.member_id] = member
            if member.group_instance_id is not None:
                group.static_members[member.group_instance_id] = member.member_id
            since_ms = now_ms if sessions_since_ms is None else min(now_ms, sessions_since_ms)
            group._schedule_heartbeat(member, since_ms)
        if group.members:
            leader = record.leader
            group.leader_id = leader if leader in group.members else next(iter(group.members))
            group.state = GroupState.STABLE
            if size_limits.over_capacity(len(group.members), config.max_size):
                # group.max.size was lowered: the members rejoin (committing first, as clients
                # do before a rebalance) and those past the limit are turned away.
                group._prepare_rebalance(now_ms)
        return group

    def rebalance(self, now_ms: int) -> None:
        """Start a rebalance now (a group converted back from the consumer protocol: its
        members rejoin and the leader assigns again)."""
        self._maybe_prepare_rebalance(now_ms)

    # --- JoinGroup ----------------------------------------------------------------------------

    def join(self, now_ms: int, request: JoinRequest) -> JoinResult | Pending:
        if not self.config.session_timeout_ok(request.session_timeout_ms):
            return JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT, request.member_id)
        holder = self._seat_holder(request)
        if self.state is not GroupState.DEAD and not self._admits(holder):
            result: JoinResult | Pending = self._refuse_full(now_ms, request, holder)
        elif request.member_id == UNKNOWN_MEMBER_ID:
            result = self._join_new_member(now_ms, request)
        else:
            result = self._join_current_member(now_ms, request)
        if self.state is GroupState.PREPARING_REBALANCE:
            self._try_complete_join(now_ms)
        return result

    def _seat_holder(self, request: JoinRequest) -> Member | None:
        """The member this join comes from, if the group has it: by member id, or a static
        member restarted (no member id) with its group.instance.id. A member id handed out
        with MEMBER_ID_REQUIRED (pending) holds no seat."""
        member = self.members.get(request.member_id)
        if request.member_id == UNKNOWN_MEMBER_ID and request.group_instance_id is not None:
            current = self.static_members.get(request.group_instance_id)
            member = self.members.get(current) if current is not None else None
        return member

    def _admits(self, holder: Member | None) -> bool:
        """group.max.size (``size_limits.admits_classic_join``)."""
        return size_limits.admits_classic_join(
            self.config.max_size,
            rebalancing=self.state is GroupState.PREPARING_REBALANCE,
            members=len(self.members),
            rejoined=sum(1 for m in self.members.values() if m.awaiting_join),
            known=holder is not None,
            known_rejoined=holder is not None and holder.awaiting_join,
        )

    def _refuse_full(self, now_ms: int, request: JoinRequest, holder: Member | None) -> JoinResult:
        """GROUP_MAX_SIZE_REACHED. As in Kafka, the refused member leaves the group (a member
        that rejoined a rebalance too late to keep its seat), or its pending id is forgotten."""
        if holder is not None:
            self._remove_member_and_update_group(now_ms, holder)
        elif request.member_id in self.pending_members:
            self._remove_pending_member(now_ms, request.member_id)
        return JoinResult(ErrorCode.GROUP_MAX_SIZE_REACHED, UNKNOWN_MEMBER_ID)

    def _join_new_member(self, now_ms: int, request: JoinRequest) -> JoinResult | Pending:
        if self.state is GroupState.DEAD:
            return JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, UNKNOWN_MEMBER_ID)
        if not self._supports_protocols(request.protocol_type, request.protocols):
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, UNKNOWN_MEMBER_ID)
        instance_id = request.group_instance_id
        prefix = instance_id if instance_id is not None else request.client_id
        new_member_id = f"{prefix}-{request.fresh_id}"
        if instance_id is not None:
            old_member_id = self.static_members.get(instance_id)
            if old_member_id is not None:
                return self._rejoin_static_member(now_ms, old_member_id, new_member_id, request)
            return self._add_member_and_rebalance(now_ms, new_member_id, request)
        if request.require_known_member_id:
            session_ms = request.session_timeout_ms
            self.pending_members[new_member_id] = (now_ms + session_ms, session_ms)
            return JoinResult(ErrorCode.MEMBER_ID_REQUIRED, new_member_id)
        return self._add_member_and_rebalance(now_ms, new_member_id, request)

    def _join_current_member(self, now_ms: int, request: JoinRequest) -> JoinResult | Pending:
        member_id = request.member_id
        if self.state is GroupState.DEAD:
            return JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id)
        if not self._supports_protocols(request.protocol_type, request.protocols):
            # The rejected rejoin leaves the existing member exactly as it was.
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)
        if member_id in self.pending_members:
            if request.group_instance_id is not None:
                # Kafka: a static member is never a pending member (IllegalStateException).
                return JoinResult(ErrorCode.UNKNOWN_SERVER_ERROR, member_id)
            return self._add_member_and_rebalance(now_ms, member_id, request)
        instance_id = request.group_instance_id
        instance_unknown = instance_id is not None and instance_id not in self.static_members
        if self.is_static_member_fenced(instance_id, member_id):
            return JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id)
        member = self.members.get(member_id)
        if member is None or instance_unknown:
            return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
        if self.state is GroupState.PREPARING_REBALANCE:
            return self._update_member_and_rebalance(now_ms, member, request)
        if self.state is GroupState.COMPLETING_REBALANCE:
            if member.matches(request.protocols):
                # A retry of a join whose response was lost: the current generation again.
                return self._current_generation(member, with_members=True)
            return self._update_member_and_rebalance(now_ms, member, request)
        if self.state is GroupState.STABLE:
            if member_id == self.leader_id or not member.matches(request.protocols):
                # The leader rejoining forces a rebalance (e.g. topic metadata changed).
                return self._update_member_and_rebalance(now_ms, member, request)
            return self._current_generation(member, with_members=False)
        # Empty (or Dead): let the member reset its generation and join again.
        return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id)

    def _current_generation(self, member: Member, with_members: bool) -> JoinResult:
        is_leader = member.member_id == self.leader_id
        return JoinResult(
            error=ErrorCode.NONE,
            member_id=member.member_id,
            generation_id=self.generation,
            protocol_type=self.protocol_type,
            protocol_name=self.protocol_name,
            leader_id=self.leader_id or "",
            members=self._member_list() if with_members and is_leader else (),
        )

    def _add_member_and_rebalance(
        self, now_ms: int, member_id: str, request: JoinRequest
    ) -> Pending:
        member = Member(
            member_id=member_id,
            group_instance_id=request.group_instance_id,
            client_id=request.client_id,
            client_host=request.client_host,
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            session_timeout_ms=request.session_timeout_ms,
            protocol_type=request.protocol_type,
            protocols=request.protocols,
            is_new=True,
        )
        if self.state is GroupState.PREPARING_REBALANCE and self.generation == 0:
            self._new_member_added = True
        ticket = self._new_ticket()
        self._add(member, ticket)
        # A new member cannot heartbeat yet; it may wait in the join this long, then it is
        # dropped (it will retry if it is still alive).
        self._schedule_heartbeat(member, now_ms, self.config.new_member_join_timeout_ms)
        self._maybe_prepare_rebalance(now_ms)
        return Pending(ticket)

    def _update_member_and_rebalance(
        self, now_ms: int, member: Member, request: JoinRequest
    ) -> Pending:
        ticket = self._new_ticket()
        self._update_member(
            member,
            request.protocols,
            request.rebalance_timeout_ms,
            request.session_timeout_ms,
            ticket,
        )
        self._maybe_prepare_rebalance(now_ms)
        return Pending(ticket)

    def _rejoin_static_member(
        self, now_ms: int, old_member_id: str, new_member_id: str, request: JoinRequest
    ) -> JoinResult | Pending:
        """A known group.instance.id joins with an unknown member id (e.g. after a restart)."""
        instance_id = request.group_instance_id
        assert instance_id is not None
        if self.state not in (
            GroupState.STABLE,
            GroupState.COMPLETING_REBALANCE,
            GroupState.PREPARING_REBALANCE,
        ):
            return JoinResult(ErrorCode.UNKNOWN_SERVER_ERROR, UNKNOWN_MEMBER_ID)
        leader_before = self.leader_id
        member = self._replace_static_member(instance_id, old_member_id, new_member_id)
        self._schedule_heartbeat(member, now_ms)
        old_protocols = member.protocols
        old_rebalance_timeout_ms = member.rebalance_timeout_ms
        old_session_timeout_ms = member.session_timeout_ms
        ticket = self._new_ticket()
        self._update_member(
            member,
            request.protocols,
            request.rebalance_timeout_ms,
            request.session_timeout_ms,
            ticket,
        )
        if self.state is GroupState.STABLE:
            if self._select_protocol() == self.protocol_name:
                # Same protocol next generation: persist the new member id, no rebalance.
                token = StaticRejoinStore(
                    ticket=ticket,
                    group_instance_id=instance_id,
                    old_member_id=old_member_id,
                    new_member_id=new_member_id,
                    old_protocols=old_protocols,
                    old_rebalance_timeout_ms=old_rebalance_timeout_ms,
                    old_session_timeout_ms=old_session_timeout_ms,
                    leader_before=leader_before,
                    supports_skip_assignment=request.supports_skip_assignment,
                )
                self._effects.append(Store(token, self.record()))
            else:
                self._maybe_prepare_rebalance(now_ms)
        elif self.state is GroupState.COMPLETING_REBALANCE:
            # The leader may already assign to the old member id: rebalance again.
            self._prepare_rebalance(now_ms)
        return Pending(ticket)

    # --- SyncGroup ----------------------------------------------------------------------------

    def sync(self, now_ms: int, request: SyncRequest) -> SyncResult | Pending:
        member_id = request.member_id
        if self.state is GroupState.DEAD:
            return SyncResult(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if self.is_static_member_fenced(request.group_instance_id, member_id):
            return SyncResult(ErrorCode.FENCED_INSTANCE_ID)
        member = self.members.get(member_id)
        if member is None:
            return SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)
        if request.generation_id != self.generation:
            return SyncResult(ErrorCode.ILLEGAL_GENERATION)
        if request.protocol_type is not None and request.protocol_type != self.protocol_type:
            return SyncResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        if request.protocol_name is not None and request.protocol_name != self.protocol_name:
            return SyncResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        if self.state is GroupState.EMPTY:
            return SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)
        if self.state is GroupState.PREPARING_REBALANCE:
            return SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)
        if self.state is GroupState.COMPLETING_REBALANCE:
            if member.sync_ticket is not None:
                self._reply(member.sync_ticket, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
            ticket = self._new_ticket()
            member.sync_ticket = ticket
            self._remove_pending_sync(member_id)
            if member_id == self.leader_id:
                assignment = {mid: request.assignments.get(mid, b"") for mid in self.members}
                token = AssignmentStore(self.generation, assignment)
                self._effects.append(Store(token, self.record(assignment)))
            return Pending(ticket)
        # Stable: the assignment of this generation again.
        self._remove_pending_sync(member_id)
        self._schedule_heartbeat(member, now_ms)
        return SyncResult(ErrorCode.NONE, self.protocol_type, self.protocol_name, member.assignment)

    # --- Heartbeat, LeaveGroup, OffsetCommit checks, DeleteGroups -----------------------------

    def heartbeat(
        self, now_ms: int, member_id: str, group_instance_id: str | None, generation: int
    ) -> ErrorCode:
        if self.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if self.is_static_member_fenced(group_instance_id, member_id):
            return ErrorCode.FENCED_INSTANCE_ID
        member = self.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation != self.generation:
            return ErrorCode.ILLEGAL_GENERATION
        if self.state is GroupState.EMPTY:
            return ErrorCode.UNKNOWN_MEMBER_ID
        self._schedule_heartbeat(member, now_ms)
        if self.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(self, now_ms: int, leaving: Sequence[tuple[str, str | None]]) -> list[ErrorCode]:
        """Per (member id, group.instance.id): the member's error. The group must not be Dead."""
        errors = []
        for member_id, instance_id in leaving:
            if member_id == UNKNOWN_MEMBER_ID:
                # Administrative removal by group.instance.id.
                current = self.static_members.get(instance_id) if instance_id is not None else None
                if current is None:
                    errors.append(ErrorCode.UNKNOWN_MEMBER_ID)
                else:
                    self._remove_member_and_update_group(now_ms, self.members[current])
                    errors.append(ErrorCode.NONE)
            elif member_id in self.pending_members:
                self._remove_pending_member(now_ms, member_id)
                errors.append(ErrorCode.NONE)
            elif self.is_static_member_fenced(instance_id, member_id):
                errors.append(ErrorCode.FENCED_INSTANCE_ID)
            elif member_id in self.members:
                self._remove_member_and_update_group(now_ms, self.members[member_id])
                errors.append(ErrorCode.NONE)
            else:
                errors.append(ErrorCode.UNKNOWN_MEMBER_ID)
        return errors

    def validate_commit(
        self, now_ms: int, member_id: str, group_instance_id: str | None, generation: int
    ) -> ErrorCode:
        """May this commit be stored? Generation -1 with no member id: a simple consumer."""
        if self.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        member = self.members.get(member_id)
        if generation >= 0 or member_id != UNKNOWN_MEMBER_ID or group_instance_id is not None:
            if self.is_static_member_fenced(group_instance_id, member_id):
                return ErrorCode.FENCED_INSTANCE_ID
            if member is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if generation != self.generation:
                return ErrorCode.ILLEGAL_GENERATION
        elif self.state is not GroupState.EMPTY:
            # Only members may commit while the group has members.
            return ErrorCode.UNKNOWN_MEMBER_ID
        if self.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        if member is not None and self.state in (
            GroupState.STABLE,
            GroupState.PREPARING_REBALANCE,
        ):
            # A commit is as good as a heartbeat (the heartbeat says when to rejoin).
            self._schedule_heartbeat(member, now_ms)
        return ErrorCode.NONE

    def delete(self) -> ErrorCode:
        """DeleteGroups: only an Empty group may go (it becomes Dead)."""
        if self.state is GroupState.DEAD:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if self.state is not GroupState.EMPTY:
            return ErrorCode.NON_EMPTY_GROUP
        self._transition(GroupState.DEAD, self.state_since_ms)
        return ErrorCode.NONE

    def unload(self) -> None:
        """This broker no longer coordinates the group: everyone waiting looks elsewhere."""
        self.state = GroupState.DEAD
        for member in self.members.values():
            if member.join_ticket is not None:
                self._reply(
                    member.join_ticket, JoinResult(ErrorCode.NOT_COORDINATOR, member.member_id)
                )
                member.join_ticket = None
            if member.sync_ticket is not None:
                self._reply(member.sync_ticket, SyncResult(ErrorCode.NOT_COORDINATOR))
                member.sync_ticket = None
            member.heartbeat_deadline_ms = None
        self.pending_members.clear()
        self._join_deadline_ms = None
        self._sync_deadline = None

    # --- outcomes of writes -------------------------------------------------------------------

    def stored(self, now_ms: int, token: StoreToken, error: ErrorCode) -> None:
        if isinstance(token, AssignmentStore):
            self._assignment_stored(now_ms, token, error)
        elif isinstance(token, StaticRejoinStore):
            self._static_rejoin_stored(now_ms, token, error)

    def _assignment_stored(self, now_ms: int, token: AssignmentStore, error: ErrorCode) -> None:
        # Members may have joined meanwhile: only act if still completing this generation.
        if self.state is not GroupState.COMPLETING_REBALANCE or token.generation != self.generation:
            return
        if error is not ErrorCode.NONE:
            self._reset_and_propagate_assignment_error(now_ms, error)
            self._maybe_prepare_rebalance(now_ms)
            return
        for member in self.members.values():
            member.assignment = token.assignment.get(member.member_id, b"")
        self._propagate_assignment(now_ms, ErrorCode.NONE)
        self._transition(GroupState.STABLE, now_ms)

    def _static_rejoin_stored(
        self, now_ms: int, token: StaticRejoinStore, error: ErrorCode
    ) -> None:
        member = self.members.get(token.new_member_id)
        if member is None or member.join_ticket != token.ticket:
            return  # answered meanwhile (a rebalance started, or the member was removed)
        if error is not ErrorCode.NONE:
            # Not persisted: put the old member back and fail this join.
            self._update_member(
                member,
                token.old_protocols,
                token.old_rebalance_timeout_ms,
                token.old_session_timeout_ms,
                None,
            )
            old = self._replace_static_member(
                token.group_instance_id, token.new_member_id, token.old_member_id
            )
            self._schedule_heartbeat(old, now_ms)
            self._reply(
                token.ticket,
                JoinResult(
                    error=error,
                    member_id=UNKNOWN_MEMBER_ID,
                    generation_id=self.generation,
                    protocol_type=self.protocol_type,
                    protocol_name=self.protocol_name,
                    leader_id=token.leader_before or "",
                ),
            )
            return
        if token.supports_skip_assignment:
            # v9+: the leader learns it leads but keeps the current assignment.
            is_leader = self.leader_id == member.member_id
            result = JoinResult(
                error=ErrorCode.NONE,
                member_id=member.member_id,
                generation_id=self.generation,
                protocol_type=self.protocol_type,
                protocol_name=self.protocol_name,
                leader_id=self.leader_id or "",
                members=self._member_list() if is_leader else (),
                skip_assignment=is_leader,
            )
        else:
            # Older clients: report the old leader id so that nobody runs a pointless
            # assignment that a Stable group would not distribute.
            result = JoinResult(
                error=ErrorCode.NONE,
                member_id=member.member_id,
                generation_id=self.generation,
                protocol_type=self.protocol_type,
                protocol_name=self.protocol_name,
                leader_id=token.leader_before or "",
            )
        # The session deadline set at the rejoin may have passed while the store was pending
        # (a member awaiting its join owes no heartbeat, so it was dropped): restart it now, or
        # a member that never heartbeats again would be kept for ever.
        self._schedule_heartbeat(member, now_ms)
        self._invoke_join(member, result)

    # --- timers -------------------------------------------------------------------------------

    def tick(self, now_ms: int) -> None:
        """Fire every deadline that is due at ``now_ms``."""
        if self.state is GroupState.DEAD:
            return
        for member_id, (expiry_ms, _) in list(self.pending_members.items()):
            if expiry_ms <= now_ms and member_id in self.pending_members:
                self._remove_pending_member(now_ms, member_id)
        for member in list(self.members.values()):
            deadline = member.heartbeat_deadline_ms
            if deadline is None or deadline > now_ms:
                continue
            if self.members.get(member.member_id) is not member:
                continue
            member.heartbeat_deadline_ms = None
            if not self._has_satisfied_heartbeat(member):
                self._remove_member_and_update_group(now_ms, member)
        if (
            self._join_deadline_ms is not None
            and self._join_deadline_ms <= now_ms
            and self.state is GroupState.PREPARING_REBALANCE
        ):
            self._on_join_deadline(now_ms)
        if self._sync_deadline is not None and self._sync_deadline[0] <= now_ms:
            self._on_sync_deadline(now_ms)

    def _has_satisfied_heartbeat(self, member: Member) -> bool:
        if member.is_new:
            return False
        # Members waiting in a join or sync owe no heartbeat.
        return member.awaiting_join or member.awaiting_sync

    def _on_join_deadline(self, now_ms: int) -> None:
        if self._initial_delay is not None:
            delay_ms, remaining_ms = self._initial_delay
            if self._new_member_added and remaining_ms != 0:
                # New members keep arriving: wait another delay, within the rebalance timeout.
                self._new_member_added = False
                next_delay_ms = min(self.config.initial_rebalance_delay_ms, remaining_ms)
                self._initial_delay = (next_delay_ms, max(remaining_ms - delay_ms, 0))
                self._join_deadline_ms = now_ms + next_delay_ms
                return
        self._complete_join(now_ms)

    def _on_sync_deadline(self, now_ms: int) -> None:
        assert self._sync_deadline is not None
        _, generation = self._sync_deadline
        self._sync_deadline = None
        if generation != self.generation:
            return
        if self.state not in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return
        if not self.pending_sync:
            return
        for member_id in list(self.pending_sync):
            member = self.members.get(member_id)
            if member is not None:
                self._answer_removed(member)
            self._remove(member_id)
        self._prepare_rebalance(now_ms)
