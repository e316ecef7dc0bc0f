"""A client's share session (KIP-932) at the proxy, mapped onto one upstream session per
owning broker: pure state and decisions, no I/O.

A share session belongs to a (group, member) pair and lives on one broker; the proxy is the
only broker its clients see, but the partitions of a session are owned by several brokers,
each of which keeps its own share session (``broker/share/sessions.py``) and checks its own
epochs. So the proxy keeps two levels:

* the client's session, checked exactly as a broker checks it (epoch 0 opens it, each later
  request carries the next epoch, -1 closes it; SHARE_SESSION_NOT_FOUND,
  INVALID_SHARE_SESSION_EPOCH, SHARE_SESSION_LIMIT_REACHED otherwise), with the partitions the
  client fetches;
* per broker that owns some of them, the upstream session the proxy opened there, with the
  epoch of the proxy's next request to it and the partitions that broker was told about.

Each round of a client request is planned by :func:`plan_round`: every partition of the client's
session goes to its owner; a broker the proxy has no session with gets one opened (epoch 0,
every partition it owns); one with a session gets an incremental request naming what it was
not told yet and forgetting what moved away or the client forgot. One left with no partition
keeps its session (it forgets the partitions, as Kafka's leader does, and releases nothing:
the member still holds what it acquired there and may acknowledge it); it is closed with the
client's session. Acknowledgements go with the request to each partition's owner; a broker
whose session must be opened first cannot take them on the opening request (Kafka refuses
acknowledgements there), so :func:`plan_opening` opens it first with a request that names no
partition, and the acknowledgements follow on the session (:func:`plan_acknowledge`).

All of it is per client connection (``UpstreamPool``): closing the connection closes the
proxy's connections to the brokers, which end the upstream sessions and release their records.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kafscale.broker.protocol.errors import ErrorCode

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
MAX_SESSIONS_PER_CONNECTION = 16
"""Share sessions one client connection may hold at the proxy (a share consumer holds one):
beyond, SHARE_SESSION_LIMIT_REACHED. The partitions of a session are bounded by the topics
that exist (an unknown topic id never joins one)."""

PartitionKey = tuple[uuid.UUID, int]
"""(topic id, partition)."""
SessionKey = tuple[str, str]
"""(group id, member id)."""
NO_BROKER = -1


def next_epoch(epoch: int) -> int:
    """The epoch after ``epoch`` (Kafka wraps from the largest int32 to 1)."""
    return 1 if epoch >= 0x7FFFFFFF else epoch + 1


@dataclass(slots=True)
class UpstreamSession:
    """The proxy's share session on one broker."""

    epoch: int = INITIAL_EPOCH
    """The epoch of the proxy's next request to the broker (0: open, or open again)."""
    partitions: set[PartitionKey] = field(default_factory=set)
    opened: bool = False
    """Whether the broker may hold a session of the member (one to close when done)."""


@dataclass(slots=True)
class ClientSession:
    epoch: int = 1
    """The epoch the client's next request must carry."""
    partitions: dict[PartitionKey, None] = field(default_factory=dict)  # ordered set
    upstream: dict[int, UpstreamSession] = field(default_factory=dict)
    closed: bool = False
    # Held while a round is planned and written, so that the upstream epochs reach each broker
    # in the order they were given out (a ShareAcknowledge may come during a long poll).
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass(slots=True)
class ClientSessions:
    """The share sessions of one client connection."""

    limit: int = MAX_SESSIONS_PER_CONNECTION
    sessions: dict[SessionKey, ClientSession] = field(default_factory=dict)

    def open(self, key: SessionKey) -> tuple[ErrorCode, ClientSession | None]:
        """Epoch 0: a new session (an older one of the same member is replaced; its upstream
        sessions are reopened too, with epoch 0, as the broker's own would be)."""
        if key not in self.sessions and len(self.sessions) >= self.limit:
            return ErrorCode.SHARE_SESSION_LIMIT_REACHED, None
        old = self.sessions.get(key)
        if old is not None:
            old.closed = True
        session = self.sessions[key] = ClientSession()
        if old is not None:
            # The brokers still hold the old sessions: opening again (epoch 0) replaces them.
            session.upstream = {b: UpstreamSession(opened=True) for b in old.upstream}
        return ErrorCode.NONE, session

    def advance(self, key: SessionKey, epoch: int) -> tuple[ErrorCode, ClientSession | None]:
        """A later request: its epoch checked, the session moved on by one."""
        session = self.sessions.get(key)
        if session is None:
            return ErrorCode.SHARE_SESSION_NOT_FOUND, None
        if epoch != session.epoch:
            return ErrorCode.INVALID_SHARE_SESSION_EPOCH, None
        session.epoch = next_epoch(session.epoch)
        return ErrorCode.NONE, session

    def close(self, key: SessionKey) -> tuple[ErrorCode, ClientSession | None]:
        """Epoch -1 ends the session whatever epoch it is at (as on a broker)."""
        session = self.sessions.pop(key, None)
        if session is None:
            return ErrorCode.SHARE_SESSION_NOT_FOUND, None
        session.closed = True
        return ErrorCode.NONE, session


def update_partitions(
    session: ClientSession, added: Iterable[PartitionKey], forgotten: Iterable[PartitionKey]
) -> None:
    for key in added:
        session.partitions[key] = None
    for key in forgotten:
        session.partitions.pop(key, None)


@dataclass(frozen=True, slots=True)
class UpstreamPart:
    """One request of a round to one broker."""

    broker: int
    epoch: int
    fetch: tuple[PartitionKey, ...]  # named in the request (the broker adds them)
    acks: Mapping[PartitionKey, Any]  # acknowledgement batches by partition
    forgotten: tuple[PartitionKey, ...]

    @property
    def partitions(self) -> tuple[PartitionKey, ...]:
        """Every partition the request names, in order: fetched, then acknowledged only."""
        return self.fetch + tuple(k for k in self.acks if k not in self.fetch)


@dataclass(frozen=True, slots=True)
class Round:
    parts: list[UpstreamPart]
    unacknowledged: dict[PartitionKey, ErrorCode]  # acks no broker could take this round
    unroutable: set[PartitionKey]  # partitions with no live owner


def plan_round(
    session: ClientSession,
    owner_of: Callable[[PartitionKey], int],
    acks: Mapping[PartitionKey, Any],
    closing: bool = False,
    only: set[int] | None = None,
) -> Round:
    """The requests of one round, and the session's upstream state moved on as if they were
    all sent (a part that fails is dropped by :func:`forget_upstream`). ``closing``: the
    client ends its session, every upstream session is closed. ``only``: the brokers to ask
    (a long poll's later rounds ask the owners of partitions that moved); moves and closes
    are planned in any case."""
    wanted: dict[int, list[PartitionKey]] = {}
    if not closing:
        for key in session.partitions:
            wanted.setdefault(owner_of(key), []).append(key)
    acked: dict[int, dict[PartitionKey, Any]] = {}
    for key, batches in acks.items():
        acked.setdefault(owner_of(key), {})[key] = batches
    parts: list[UpstreamPart] = []
    unacknowledged: dict[PartitionKey, ErrorCode] = {}
    unroutable = set(wanted.pop(NO_BROKER, ()))
    for key in acked.pop(NO_BROKER, {}):
        unacknowledged[key] = ErrorCode.NOT_LEADER_OR_FOLLOWER
    for broker in sorted(set(wanted) | set(acked) | set(session.upstream)):
        desired = wanted.get(broker, [])
        its_acks = acked.get(broker, {})
        if closing:
            part = _plan_close(session, broker, its_acks, unacknowledged)
        else:
            part = _plan_broker(session, broker, desired, its_acks, only, unacknowledged)
        if part is not None:
            parts.append(part)
    return Round(parts, unacknowledged, unroutable)


def _plan_broker(
    session: ClientSession,
    broker: int,
    desired: list[PartitionKey],
    acks: dict[PartitionKey, Any],
    only: set[int] | None,
    unacknowledged: dict[PartitionKey, ErrorCode],
) -> UpstreamPart | None:
    up = session.upstream.get(broker)
    if not desired:
        if up is None or not up.opened:
            # Nothing open there: nowhere to acknowledge.
            session.upstream.pop(broker, None)
            unacknowledged.update(dict.fromkeys(acks, ErrorCode.NOT_LEADER_OR_FOLLOWER))
            return None
        if up.epoch == INITIAL_EPOCH:
            # An older session of the member, replaced once a partition comes back here (or
            # closed with the client's session); replacing releases nothing, as in Kafka.
            unacknowledged.update(dict.fromkeys(acks, ErrorCode.NOT_LEADER_OR_FOLLOWER))
            return None
        if not acks and not up.partitions:
            return None
        # Forgotten, not closed: Kafka's leader only drops forgotten partitions from the
        # session, so what the member acquired there stays its own until acknowledged or
        # its lock runs out.
        part = UpstreamPart(broker, up.epoch, (), acks, tuple(sorted(up.partitions, key=_order)))
        up.epoch = next_epoch(up.epoch)
        up.partitions = set()
        return part
    if up is None or up.epoch == INITIAL_EPOCH:
        unacknowledged.update(dict.fromkeys(acks, ErrorCode.NOT_LEADER_OR_FOLLOWER))
        session.upstream[broker] = UpstreamSession(INITIAL_EPOCH + 1, set(desired), opened=True)
        return UpstreamPart(broker, INITIAL_EPOCH, tuple(desired), {}, ())
    wanted = set(desired)
    if only is not None and broker not in only and not acks and wanted == up.partitions:
        return None
    part = UpstreamPart(
        broker,
        up.epoch,
        tuple(k for k in desired if k not in up.partitions),
        acks,
        tuple(sorted(up.partitions - wanted, key=_order)),
    )
    up.epoch = next_epoch(up.epoch)
    up.partitions = wanted
    return part


def _plan_close(
    session: ClientSession,
    broker: int,
    acks: dict[PartitionKey, Any],
    unacknowledged: dict[PartitionKey, ErrorCode],
) -> UpstreamPart | None:
    """The client ends its session: the proxy's session on ``broker`` is closed (epoch -1,
    which releases what the member holds there), with the acknowledgements for it."""
    up = session.upstream.pop(broker, None)
    if up is None or not up.opened:
        unacknowledged.update(dict.fromkeys(acks, ErrorCode.NOT_LEADER_OR_FOLLOWER))
        return None
    if up.epoch == INITIAL_EPOCH:  # an older session of the member: closed, acks cannot ride
        unacknowledged.update(dict.fromkeys(acks, ErrorCode.NOT_LEADER_OR_FOLLOWER))
        acks = {}
    return UpstreamPart(broker, FINAL_EPOCH, (), acks, ())


def needs_opening(session: ClientSession, broker: int) -> bool:
    """Whether the proxy must open (or open again) its session on ``broker`` before a request
    there may carry acknowledgements."""
    up = session.upstream.get(broker)
    return broker != NO_BROKER and (up is None or up.epoch == INITIAL_EPOCH)


def plan_opening(
    session: ClientSession,
    owner_of: Callable[[PartitionKey], int],
    acks: Mapping[PartitionKey, Any],
) -> list[UpstreamPart]:
    """Sessions to open on the owners of ``acks`` that have none of the proxy's (it was lost:
    the broker restarted, dropped it, or the connection broke; or it is an older one of the
    member): each a request with epoch 0 naming no partition, so it acquires nothing. The
    acknowledgements follow on the opened session (:func:`plan_acknowledge`); the partitions
    are named by the next fetch round (the session holds none yet)."""
    parts = []
    for broker in sorted({owner_of(key) for key in acks}):
        if needs_opening(session, broker):
            session.upstream[broker] = UpstreamSession(INITIAL_EPOCH + 1, set(), opened=True)
            parts.append(UpstreamPart(broker, INITIAL_EPOCH, (), {}, ()))
    return parts


def plan_acknowledge(
    session: ClientSession,
    owner_of: Callable[[PartitionKey], int],
    acks: Mapping[PartitionKey, Any],
    closing: bool = False,
) -> Round:
    """The ShareAcknowledge requests for ``acks``: each partition's to its owner, on the
    proxy's session there (a ShareAcknowledge cannot open one: with none open, the
    acknowledgements are answered NOT_LEADER_OR_FOLLOWER). ``closing``: every upstream
    session is closed too, with or without acknowledgements."""
    acked: dict[int, dict[PartitionKey, Any]] = {}
    for key, batches in acks.items():
        acked.setdefault(owner_of(key), {})[key] = batches
    parts: list[UpstreamPart] = []
    unacknowledged: dict[PartitionKey, ErrorCode] = {}
    brokers = set(acked) | (set(session.upstream) if closing else set())
    for broker in sorted(brokers):
        its_acks = acked.get(broker, {})
        up = session.upstream.get(broker)
        if up is None or up.epoch == INITIAL_EPOCH:
            unacknowledged.update(dict.fromkeys(its_acks, ErrorCode.NOT_LEADER_OR_FOLLOWER))
            if closing and up is not None and up.opened:  # an older session of the member
                parts.append(UpstreamPart(broker, FINAL_EPOCH, (), {}, ()))
            if closing:
                session.upstream.pop(broker, None)
            continue
        if closing:
            del session.upstream[broker]
            parts.append(UpstreamPart(broker, FINAL_EPOCH, (), its_acks, ()))
            continue
        parts.append(UpstreamPart(broker, up.epoch, (), its_acks, ()))
        up.epoch = next_epoch(up.epoch)
    return Round(parts, unacknowledged, set())


def forget_upstream(session: ClientSession, broker: int) -> None:
    """The broker's session is gone (its connection broke, or it answered that it has none):
    the next round opens a new one."""
    session.upstream.pop(broker, None)


def _order(key: PartitionKey) -> tuple[str, int]:
    return key[0].hex, key[1]
