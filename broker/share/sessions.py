"""Share sessions (KIP-932) on one broker, as pure state: who fetches which partitions.

A share session belongs to a (group, member) pair. ShareFetch with epoch 0 opens it (replacing
an older one), each later request names the epoch the broker expects next (then it moves on
by one), and -1 closes it. Kafka's errors: SHARE_SESSION_NOT_FOUND for a member without a
session, INVALID_SHARE_SESSION_EPOCH for any other epoch, SHARE_SESSION_LIMIT_REACHED when the
broker holds as many sessions as it may. Partitions are added by the requests that name them
and removed when forgotten. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kafscale.broker.protocol.errors import ErrorCode

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
SessionKey = tuple[str, str]
"""(group id, member id)."""
SharePartitionKey = tuple[str, int]
"""(topic id hex, partition)."""


@dataclass(slots=True)
class ShareSession:
    epoch: int = 1
    """The epoch the next request must carry."""
    partitions: set[SharePartitionKey] = field(default_factory=set)
    connection: object | None = None


@dataclass(slots=True)
class ShareSessions:
    limit: int = 1000
    sessions: dict[SessionKey, ShareSession] = field(default_factory=dict)

    def open_or_advance(
        self,
        key: SessionKey,
        epoch: int,
        added: Iterable[SharePartitionKey],
        forgotten: Iterable[SharePartitionKey],
        connection: object | None = None,
    ) -> tuple[ErrorCode, ShareSession | None]:
        """A ShareFetch's session: opened (epoch 0) or checked and moved on by one."""
        if epoch == INITIAL_EPOCH:
            if key not in self.sessions and len(self.sessions) >= self.limit:
                return ErrorCode.SHARE_SESSION_LIMIT_REACHED, None
            session = ShareSession(connection=connection)
            self.sessions[key] = session
        else:
            error, found = self.check(key, epoch)
            if found is None:
                return error, None
            session = found
            session.epoch += 1
            session.connection = connection
        session.partitions.update(added)
        session.partitions.difference_update(forgotten)
        return ErrorCode.NONE, session

    def check(self, key: SessionKey, epoch: int) -> tuple[ErrorCode, ShareSession | None]:
        session = self.sessions.get(key)
        if session is None:
            return ErrorCode.SHARE_SESSION_NOT_FOUND, None
        if epoch != session.epoch:
            return ErrorCode.INVALID_SHARE_SESSION_EPOCH, None
        return ErrorCode.NONE, session

    def close(self, key: SessionKey) -> ShareSession | None:
        return self.sessions.pop(key, None)

    def of_connection(self, connection: object) -> list[SessionKey]:
        return [k for k, s in self.sessions.items() if s.connection is connection]
