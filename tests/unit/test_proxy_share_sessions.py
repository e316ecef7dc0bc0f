"""A client's share session at the proxy mapped onto one upstream session per owning broker
(``broker/proxy/share_sessions.py``): epochs checked as a broker checks them, each broker's
session opened, moved on and closed, acknowledgements sent to each partition's owner."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from kafscale.broker.api.envelope import forwarded_connection
from kafscale.broker.protocol import codec
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.proxy import share
from kafscale.broker.proxy.share_sessions import (
    FINAL_EPOCH,
    ClientSession,
    ClientSessions,
    PartitionKey,
    UpstreamPart,
    forget_upstream,
    needs_opening,
    next_epoch,
    plan_acknowledge,
    plan_opening,
    plan_round,
    update_partitions,
)
from kafscale.broker.server import Connection
from kafscale.broker.share.sessions import ShareSessions

pytestmark = pytest.mark.unit

T = uuid.UUID(int=7)
P0, P1, P2 = (T, 0), (T, 1), (T, 2)
ACK = ("batch",)


def owners(table: dict[PartitionKey, int]) -> Callable[[PartitionKey], int]:
    return lambda key: table.get(key, -1)


def opened(*partitions: PartitionKey) -> tuple[ClientSessions, ClientSession]:
    sessions = ClientSessions()
    code, session = sessions.open(("g", "m"))
    assert code is ErrorCode.NONE and session is not None
    update_partitions(session, partitions, ())
    return sessions, session


def by_broker(parts: list[UpstreamPart]) -> dict[int, UpstreamPart]:
    return {p.broker: p for p in parts}


def test_client_epochs_are_checked_as_a_broker_checks_them() -> None:
    sessions = ClientSessions(limit=1)
    assert sessions.advance(("g", "m"), 1)[0] is ErrorCode.SHARE_SESSION_NOT_FOUND
    assert sessions.close(("g", "m"))[0] is ErrorCode.SHARE_SESSION_NOT_FOUND
    assert sessions.open(("g", "m"))[0] is ErrorCode.NONE
    assert sessions.advance(("g", "m"), 2)[0] is ErrorCode.INVALID_SHARE_SESSION_EPOCH
    assert sessions.advance(("g", "m"), 1)[0] is ErrorCode.NONE
    assert sessions.advance(("g", "m"), 1)[0] is ErrorCode.INVALID_SHARE_SESSION_EPOCH
    assert sessions.advance(("g", "m"), 2)[0] is ErrorCode.NONE
    assert sessions.open(("g", "other"))[0] is ErrorCode.SHARE_SESSION_LIMIT_REACHED
    assert sessions.close(("g", "m"))[0] is ErrorCode.NONE
    assert sessions.sessions == {}
    assert sessions.open(("g", "other"))[0] is ErrorCode.NONE
    assert next_epoch(0x7FFFFFFF) == 1


def test_each_owner_gets_a_session_of_its_own_partitions_then_incremental_requests() -> None:
    _, session = opened(P0, P1, P2)
    table = {P0: 1, P1: 2, P2: 1}
    first = by_broker(plan_round(session, owners(table), {}).parts)
    assert first[1] == UpstreamPart(1, 0, (P0, P2), {}, ())
    assert first[2] == UpstreamPart(2, 0, (P1,), {}, ())
    # Acknowledgements go to each partition's owner, on that owner's next epoch.
    second = by_broker(plan_round(session, owners(table), {P1: ACK}).parts)
    assert second[1] == UpstreamPart(1, 1, (), {}, ())
    assert second[2] == UpstreamPart(2, 1, (), {P1: ACK}, ())
    assert second[2].partitions == (P1,)
    # A long poll's later round asks only the brokers named (nothing changed elsewhere).
    third = plan_round(session, owners(table), {}, only={2}).parts
    assert third == [UpstreamPart(2, 2, (), {}, ())]
    fourth = by_broker(plan_round(session, owners(table), {}).parts)
    assert (fourth[1].epoch, fourth[2].epoch) == (2, 3)


def test_a_moved_partition_is_forgotten_by_its_old_owner_and_opened_at_the_new_one() -> None:
    _, session = opened(P0, P1)
    table = {P0: 1, P1: 2}
    plan_round(session, owners(table), {})
    table[P1] = 3  # broker 2 gave P1 up (or died): 3 owns it now
    moved = plan_round(session, owners(table), {P1: ACK})
    parts = by_broker(moved.parts)
    # Broker 2 has nothing left: P1 is forgotten there, its session kept (releasing nothing,
    # as Kafka's leader releases nothing for a forgotten partition).
    assert parts[2] == UpstreamPart(2, 1, (), {}, (P1,))
    # Broker 3 is opened with epoch 0, which may carry no acknowledgements (the shell opens
    # such sessions first, ``plan_opening``, and acknowledges on them).
    assert parts[3] == UpstreamPart(3, 0, (P1,), {}, ())
    assert moved.unacknowledged == {P1: ErrorCode.NOT_LEADER_OR_FOLLOWER}
    assert parts[1] == UpstreamPart(1, 1, (), {}, ())
    assert set(session.upstream) == {1, 2, 3}
    # Nothing more to tell broker 2 until the client acknowledges there or closes.
    assert 2 not in by_broker(plan_round(session, owners(table), {}).parts)
    closing = by_broker(plan_round(session, owners(table), {}, closing=True).parts)
    assert closing[2] == UpstreamPart(2, FINAL_EPOCH, (), {}, ())


def test_a_partition_moving_between_two_live_owners_is_forgotten_incrementally() -> None:
    _, session = opened(P0, P1)
    table = {P0: 1, P1: 1}
    plan_round(session, owners(table), {})
    plan_round(session, owners({P0: 1, P1: 2}), {})
    table = {P0: 2, P1: 2}
    parts = by_broker(plan_round(session, owners(table), {}).parts)
    assert parts[1] == UpstreamPart(1, 2, (), {}, (P0,))  # forgotten, the session kept
    assert parts[2] == UpstreamPart(2, 1, (P0,), {}, ())


def test_client_forgetting_a_partition_forgets_it_upstream_and_closing_closes_all() -> None:
    _, session = opened(P0, P1)
    table = {P0: 1, P1: 1}
    plan_round(session, owners(table), {})
    update_partitions(session, (), [P1])
    (part,) = plan_round(session, owners(table), {P1: ACK}).parts
    assert part == UpstreamPart(1, 1, (), {P1: ACK}, (P1,))  # acked, then forgotten
    closing = plan_round(session, owners(table), {P0: ACK}, closing=True)
    assert closing.parts == [UpstreamPart(1, FINAL_EPOCH, (), {P0: ACK}, ())]
    assert session.upstream == {}


def test_partitions_without_a_live_owner_are_unroutable() -> None:
    _, session = opened(P0, (uuid.UUID(int=9), 0))
    plan = plan_round(session, owners({P0: 1}), {(uuid.UUID(int=9), 0): ACK})
    assert plan.unroutable == {(uuid.UUID(int=9), 0)}
    assert plan.unacknowledged == {(uuid.UUID(int=9), 0): ErrorCode.NOT_LEADER_OR_FOLLOWER}
    assert [p.broker for p in plan.parts] == [1]


def test_a_lost_upstream_session_is_opened_again() -> None:
    _, session = opened(P0)
    plan_round(session, owners({P0: 1}), {})
    forget_upstream(session, 1)
    (part,) = plan_round(session, owners({P0: 1}), {P0: ACK}).parts
    assert part == UpstreamPart(1, 0, (P0,), {}, ())


def test_opening_again_replaces_the_brokers_sessions_too() -> None:
    sessions, session = opened(P0, P1)
    plan_round(session, owners({P0: 1, P1: 2}), {})
    _, again = sessions.open(("g", "m"))
    assert again is not None and session.closed
    update_partitions(again, [P0], ())
    parts = by_broker(plan_round(again, owners({P0: 1, P1: 2}), {}).parts)
    assert parts[1] == UpstreamPart(1, 0, (P0,), {}, ())  # epoch 0 replaces the old session
    # The old one on broker 2 is left alone (replacing a session releases nothing in Kafka)
    # and closed with the client's session.
    assert 2 not in parts and again.upstream[2].opened
    closing = by_broker(plan_round(again, owners({P0: 1, P1: 2}), {}, closing=True).parts)
    assert closing[2] == UpstreamPart(2, FINAL_EPOCH, (), {}, ())


def test_acknowledgements_for_an_owner_without_a_session_open_one_first() -> None:
    """A session lost (or never opened) on an owner: ``plan_opening`` opens it with a
    request naming no partition, and the acknowledgements then go on it."""
    _, session = opened(P0, P1)
    table = {P0: 1, P1: 2}
    plan_round(session, owners(table), {})
    forget_upstream(session, 2)
    assert needs_opening(session, 2) and not needs_opening(session, 1)
    opening = plan_opening(session, owners(table), {P0: ACK, P1: ACK})
    assert opening == [UpstreamPart(2, 0, (), {}, ())]
    acked = plan_acknowledge(session, owners(table), {P1: ACK})
    assert acked.parts == [UpstreamPart(2, 1, (), {P1: ACK}, ())] and not acked.unacknowledged
    # The next round names broker 2's partition again, on the session's next epoch.
    parts = by_broker(plan_round(session, owners(table), {}).parts)
    assert parts[2] == UpstreamPart(2, 2, (P1,), {}, ())


def test_acknowledgements_go_to_each_owners_session_and_closing_closes_every_one() -> None:
    _, session = opened(P0, P1)
    table = {P0: 1, P1: 2}
    plan_round(session, owners(table), {})
    acked = plan_acknowledge(session, owners(table), {P1: ACK})
    assert acked.parts == [UpstreamPart(2, 1, (), {P1: ACK}, ())]
    assert session.upstream[2].epoch == 2
    # An owner the proxy has no session with cannot take acknowledgements.
    moved = plan_acknowledge(session, owners({P0: 3, P1: 2}), {P0: ACK})
    assert moved.parts == [] and moved.unacknowledged == {P0: ErrorCode.NOT_LEADER_OR_FOLLOWER}
    closing = plan_acknowledge(session, owners(table), {P0: ACK}, closing=True)
    assert by_broker(closing.parts) == {
        1: UpstreamPart(1, FINAL_EPOCH, (), {P0: ACK}, ()),
        2: UpstreamPart(2, FINAL_EPOCH, (), {}, ()),
    }
    assert session.upstream == {}


def test_a_forwarded_requests_share_session_ends_with_the_proxys_connection() -> None:
    """An enveloped request runs on a connection of its own per request; the member's share
    session on the broker belongs to the proxy's connection it came over (one per client
    connection), so the broker ends it when the proxy closes that connection."""
    proxy_connection = Connection("127.0.0.1:5000", principal="User:proxy")
    forwarded = forwarded_connection(proxy_connection, "User:alice", "10.0.0.7")
    assert forwarded is not proxy_connection and forwarded.principal == "User:alice"
    assert forwarded.session_owner is proxy_connection
    assert proxy_connection.session_owner is proxy_connection
    sessions = ShareSessions()
    sessions.open_or_advance(("g", "m"), 0, [("t", 0)], [], forwarded.session_owner)
    later = forwarded_connection(proxy_connection, "User:alice", "10.0.0.7")
    sessions.open_or_advance(("g", "m"), 1, [], [], later.session_owner)
    assert sessions.of_connection(proxy_connection) == [("g", "m")]


def test_an_upstream_open_refused_at_the_top_level_is_opened_again_next_round() -> None:
    """A broker answering the proxy's opening ShareFetch with a top-level error (say
    UNKNOWN_MEMBER_ID while its watch lags) opened no session: the proxy's next round opens
    one again (epoch 0) instead of sending epoch 1 to a session that is not there."""
    _, session = opened(P0)
    (part,) = plan_round(session, owners({P0: 1}), {}).parts
    assert part.epoch == 0
    body = share.error_body(ErrorCode.UNKNOWN_MEMBER_ID)
    frame = codec.encode_response(share.SHARE_FETCH_KEY, 1, 0, body)[4:]
    call: Any = SimpleNamespace(
        forwarder=None, call=SimpleNamespace(api_key=share.SHARE_FETCH_KEY, api_version=1)
    )

    async def read() -> share._Answers:
        future = asyncio.get_running_loop().create_future()
        future.set_result(frame)
        state = share._Answers()
        await share._read(call, session, [part], [future], state)
        return state

    state = asyncio.run(read())
    assert state.errors == {P0: ErrorCode.UNKNOWN_MEMBER_ID}
    (again,) = plan_round(session, owners({P0: 1}), {}).parts
    assert again.epoch == 0 and again.fetch == (P0,)
