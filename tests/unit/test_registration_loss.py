"""A broker learns that etcd ended its session from the deletion of its own registration
(``registration_loss``), not only at its next keepalive: the pure decision, and the cluster
view telling the broker of the deletions it sees. The real broker against a real etcd:
``tests/integration/test_registration_loss.py``."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.cluster import BrokerInfo, ClusterView
from kafscale.broker.metadata.etcd import WatchEvent, WatchEventKind
from kafscale.broker.metadata.registration_loss import registration_lost
from kafscale.broker.metadata.session_lease import SessionLease

pytestmark = pytest.mark.unit


def test_a_deletion_after_the_current_sessions_registration_is_its_loss() -> None:
    assert registration_lost(deleted_at=12, registered_at=10, released=False)


def test_the_deletion_of_an_earlier_sessions_registration_is_not() -> None:
    """Its event comes after the broker registered again (a lower revision than that put), or
    while it registers on the new session (no put answered yet): the new session lives on."""
    assert not registration_lost(deleted_at=9, registered_at=10, released=False)
    assert not registration_lost(deleted_at=9, registered_at=None, released=False)


def test_a_deletion_seen_before_the_put_was_answered_counts_once_it_is() -> None:
    """The watch can bring the deletion before the put's answer: while unanswered nothing is
    decided; checked again with the put's revision, a later deletion ends the session."""
    assert not registration_lost(deleted_at=14, registered_at=None, released=False)
    assert registration_lost(deleted_at=14, registered_at=11, released=False)


def test_the_brokers_own_revoke_at_a_graceful_stop_is_not_a_loss() -> None:
    assert not registration_lost(deleted_at=12, registered_at=10, released=True)


def registration(node_id: int) -> bytes:
    return BrokerInfo(node_id, "127.0.0.1", 9092 + node_id).to_json()


def event(kind: WatchEventKind, node_id: int, revision: int) -> WatchEvent:
    value = registration(node_id) if kind is WatchEventKind.PUT else b""
    return WatchEvent(kind, keys.broker_key("c", node_id), value, revision)


def test_the_view_tells_of_each_registration_deleted_with_its_revision() -> None:
    etcd: Any = None  # events are applied directly; the view reads etcd only in start()
    view = ClusterView(etcd, "c")
    told: list[tuple[int, int]] = []
    view.listen_broker_deletions(lambda node_id, revision: told.append((node_id, revision)))
    view._apply(event(WatchEventKind.PUT, 1, 5))
    view._apply(event(WatchEventKind.PUT, 2, 6))
    view._apply(event(WatchEventKind.DELETE, 2, 9))
    view._apply(WatchEvent(WatchEventKind.DELETE, keys.draining_key("c", 1), b"", 10))
    assert told == [(2, 9)]
    assert set(view.brokers) == {1}


class ReloadEtcd:
    """Answers the view's full read with one registration, at revision 40."""

    closed = False

    async def get_ranges_with_revision(self, ranges: Any) -> tuple[list[Any], int]:
        key = keys.broker_key("c", 1)
        return [type("KV", (), {"key": key, "value": registration(1)})()], 40


async def test_a_reload_tells_of_the_registrations_gone_in_the_stretch_it_lost() -> None:
    """The watch lost history (compaction): no delete event comes for a registration deleted
    in the lost stretch; the reload finds it gone and tells of it at its own revision."""
    etcd: Any = ReloadEtcd()
    view = ClusterView(etcd, "c")
    told: list[tuple[int, int]] = []
    view.listen_broker_deletions(lambda node_id, revision: told.append((node_id, revision)))
    view._apply(event(WatchEventKind.PUT, 1, 5))
    view._apply(event(WatchEventKind.PUT, 2, 6))
    await view._reload()
    assert told == [(2, 40)]
    assert set(view.brokers) == {1}


class RenewingEtcd:
    """Leases only: every keepalive is answered with the TTL (etcd holds the lease)."""

    async def grant_lease(self, ttl_s: int) -> int:
        return 7

    async def refresh_lease(self, lease_id: int) -> int:
        return 60

    async def revoke_lease(self, lease_id: int) -> None:
        return None


async def test_a_session_marked_lost_from_outside_is_lost_at_once_and_for_good() -> None:
    """What the registration's deletion does (``Broker._check_registration``): the session is
    lost now, whatever its clock says (a keepalive 20 s away), and no later answered keepalive
    brings it back; ``revoke`` marks the session released, so its own deletion is no loss."""
    session = await SessionLease.start(cast(Any, RenewingEtcd()), 60)
    try:
        assert session.still_valid() and session.may_be_held()
        keepalive = session._task
        assert keepalive is not None
        session.mark_lost("etcd deleted this broker's registration")
        assert session.lost.is_set()
        assert not session.still_valid() and not session.may_be_held()
        # Its keepalive ends now, not at its next round 20 s away (the bound is half that).
        await asyncio.wait_for(asyncio.shield(keepalive), 10)
    finally:
        await session.close()
    released = await SessionLease.start(cast(Any, RenewingEtcd()), 60)
    assert not released.released
    await released.revoke()
    assert released.released and not released.lost.is_set()
