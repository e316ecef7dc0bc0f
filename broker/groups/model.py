"""Values of the classic group protocol: members, requests, results, effects, persisted records.

Everything here is plain data. The state machine (``group.py``) consumes requests and produces
results and effects; the async shell (``runtime.py``: ``classic_runtime.py`` and
``writer_runtime.py``) turns effects into awaited replies and etcd writes; ``store.py`` turns
records into JSON and back.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kafscale.broker.groups.adoption import ADOPT_PER_CHECK
from kafscale.broker.groups.share import ShareConfig
from kafscale.broker.groups.size_limits import UNBOUNDED
from kafscale.broker.protocol.errors import ErrorCode

UNKNOWN_MEMBER_ID = ""
NO_GENERATION = -1

Protocols = tuple[tuple[str, bytes], ...]
"""(protocol name, member metadata) in the member's order of preference."""


class GroupState(enum.StrEnum):
    """Kafka's names: DescribeGroups and ListGroups report them verbatim."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """The broker settings the protocol depends on (Kafka's ``group.*`` configs)."""

    initial_rebalance_delay_ms: int = 3000
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    max_size: int = UNBOUNDED
    """group.max.size: members a classic group may have (``groups.max_size``)."""
    consumer_max_size: int = UNBOUNDED
    """group.consumer.max.size: members a consumer-protocol group may have."""
    new_member_join_timeout_ms: int = 300_000
    """How long a new member may wait in a join before it is dropped (Kafka: 5 minutes)."""
    consumer_session_timeout_ms: int = 45_000
    """group.consumer.session.timeout.ms (the consumer protocol, KIP-848)."""
    consumer_heartbeat_interval_ms: int = 5_000
    """group.consumer.heartbeat.interval.ms."""
    share: ShareConfig = field(default_factory=ShareConfig)
    """Kafka's ``group.share.*`` defaults (share groups, KIP-932)."""
    share_max_groups: int = 1000
    """Share groups the cluster keeps at most (``groups.share_max_groups``)."""
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    """offsets.retention.minutes in ms (``groups.offsets_retention_minutes``; KIP-211)."""
    offsets_retention_check_interval_ms: int = 600_000
    """offsets.retention.check.interval.ms: how often a coordinator looks for expired offsets."""
    offsets_retention_adopt_per_check: int = ADOPT_PER_CHECK
    """Stored groups nobody coordinates that one retention check takes on at most
    (``adoption``): a fixed bound, not a setting (Kafka has no such thing to name)."""
    idle_release_ms: int = 300_000
    """How long a group without members that keeps committed offsets stays coordinated after
    the last request that named it (``groups.idle_release_ms``; ``release``)."""
    lag_refresh_interval_ms: int = 30_000
    """How often the committed offsets of groups reported uncoordinated are read from etcd
    (``groups.lag_refresh_interval_ms``; ``stored_lag``)."""
    lag_refresh_max_groups: int = 10_000
    """Stored groups one such read takes at most (``groups.lag_refresh_max_groups``)."""
    vacant_release_ms: int = 5_000
    """How long a group that holds nothing (no members, no offsets) stays coordinated after
    the last request that named it (``groups.vacant_release_ms``; ``release``)."""

    def session_timeout_ok(self, session_timeout_ms: int) -> bool:
        return self.min_session_timeout_ms <= session_timeout_ms <= self.max_session_timeout_ms


@dataclass(slots=True)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: Protocols
    assignment: bytes = b""
    join_ticket: int | None = None
    """Set while the member's JoinGroup waits for the rebalance (Kafka's join callback)."""
    sync_ticket: int | None = None
    """Set while the member's SyncGroup waits for the leader's assignment."""
    is_new: bool = False
    heartbeat_deadline_ms: int | None = None

    @property
    def awaiting_join(self) -> bool:
        return self.join_ticket is not None

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_ticket is not None

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    def matches(self, protocols: Protocols) -> bool:
        """Same protocols with the same metadata in the same order."""
        return self.protocols == protocols

    def vote(self, candidates: set[str]) -> str | None:
        """The member's most preferred protocol among ``candidates``."""
        for name, _ in self.protocols:
            if name in candidates:
                return name
        return None


# --- requests ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JoinRequest:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: Protocols
    require_known_member_id: bool
    """JoinGroup v4+: a new dynamic member first gets MEMBER_ID_REQUIRED with its id."""
    supports_skip_assignment: bool
    """JoinGroup v9+: a rejoining static leader may be told to skip the assignor."""
    fresh_id: str
    """A random suffix, used if this join needs a new member id."""
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class SyncRequest:
    member_id: str
    generation_id: int
    group_instance_id: str | None
    protocol_type: str | None
    protocol_name: str | None
    assignments: Mapping[str, bytes] = field(default_factory=dict)


# --- results ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JoinedMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    member_id: str
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    members: tuple[JoinedMember, ...] = ()
    skip_assignment: bool = False


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class Pending:
    """The answer comes later, as a ``Reply`` effect carrying this ticket."""

    ticket: int


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupDescription:
    state: GroupState
    protocol_type: str
    protocol: str
    members: tuple[MemberDescription, ...]


# --- persisted records ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemberRecord:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    """The member's metadata for the group's selected protocol."""
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """What survives the coordinator: written at each completed rebalance."""

    protocol_type: str | None
    generation: int
    protocol_name: str | None
    leader: str | None
    members: tuple[MemberRecord, ...] = ()
    group_type: str = "classic"
    """"consumer" for a KIP-848 group: then ``generation`` is its group epoch and ``consumer``
    its state (``consumer_codec``)."""
    consumer: Mapping[str, Any] | None = None
    empty_since_ms: int | None = None
    """Wall-clock ms since which the group has had no members (set on records written while it
    had none): a new coordinator counts offset retention (KIP-211) from it, not from its own
    load time. Never earlier than the truth: stamped when the Empty record is written."""

    def has_members(self) -> bool:
        """Members of either protocol (a consumer-protocol group keeps them in ``consumer``)."""
        return bool(self.members or (self.consumer or {}).get("members"))


# --- effects ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AssignmentStore:
    """The leader's assignment for ``generation``; the group turns Stable once it is stored."""

    generation: int
    assignment: Mapping[str, bytes]


@dataclass(frozen=True, slots=True)
class StaticRejoinStore:
    """A static member rejoined a Stable group under a new member id without a rebalance."""

    ticket: int
    group_instance_id: str
    old_member_id: str
    new_member_id: str
    old_protocols: Protocols
    old_rebalance_timeout_ms: int
    old_session_timeout_ms: int
    leader_before: str | None
    supports_skip_assignment: bool


@dataclass(frozen=True, slots=True)
class EmptyStore:
    """The group became Empty at ``generation``."""

    generation: int


@dataclass(frozen=True, slots=True)
class ConsumerStore:
    """A consumer-protocol group's state changed: its ``version``-th snapshot."""

    version: int


@dataclass(frozen=True, slots=True)
class EmptyTimeStore:
    """The stored record of a group without members, again, now carrying the time the group
    became Empty (``release``: a coordinator lets such a group go only once etcd has it)."""


StoreToken = AssignmentStore | StaticRejoinStore | EmptyStore | ConsumerStore | EmptyTimeStore


@dataclass(frozen=True, slots=True)
class Reply:
    """Answer the JoinGroup or SyncGroup that is waiting with ``ticket``."""

    ticket: int
    result: JoinResult | SyncResult


@dataclass(frozen=True, slots=True)
class Store:
    """Write ``record`` (fenced by the group lease), then call ``Group.stored(token, error)``."""

    token: StoreToken
    record: GroupRecord


Effect = Reply | Store
