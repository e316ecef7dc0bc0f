"""The cluster view follows etcd's watch; a broker's own partition-state commits, already
applied when they were committed, are not decoded again when the watch brings them back."""

from __future__ import annotations

from typing import Any

import pytest

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.cluster import BrokerInfo, ClusterView
from kafscale.broker.metadata.etcd import WatchEvent, WatchEventKind
from kafscale.broker.metadata.partition_state import PartitionState

pytestmark = pytest.mark.unit

TP = ("orders", 0)
KEY = keys.partition_state_key("c", *TP)


def put(value: bytes, revision: int) -> WatchEvent:
    return WatchEvent(WatchEventKind.PUT, KEY, value, revision)


def view() -> ClusterView:
    etcd: Any = None  # the view reads etcd only in start(); events are applied directly here
    return ClusterView(etcd, "c")


def test_own_commit_coming_back_through_the_watch_is_not_decoded_again() -> None:
    cluster = view()
    mine = PartitionState(high_watermark=10, leader_epoch=1)
    cluster.update_state(TP, mine, revision=7)
    # Not a state document at all: decoding it would fail (and log); it must be skipped.
    cluster._apply(put(b"not json", 7))
    assert cluster.states[TP] == mine


def test_other_writers_commits_are_applied() -> None:
    cluster = view()
    cluster.update_state(TP, PartitionState(high_watermark=10, leader_epoch=1), revision=7)
    cluster._apply(put(b"not json", 7))
    theirs = PartitionState(high_watermark=25, leader_epoch=2)
    cluster._apply(put(theirs.to_json(), 8))  # a new owner's commit, at another revision
    assert cluster.states[TP] == theirs
    # The own revision was forgotten once seen: the same revision again is decoded.
    again = PartitionState(high_watermark=30, leader_epoch=2)
    cluster._apply(put(again.to_json(), 7))
    assert cluster.states[TP] == again


def test_a_watch_event_that_comes_before_the_commit_returns_is_applied() -> None:
    """The watch and the transaction's answer race: an event seen first is decoded as usual."""
    cluster = view()
    state = PartitionState(high_watermark=5, leader_epoch=1)
    cluster._apply(put(state.to_json(), 3))
    cluster.update_state(TP, state, revision=3)
    assert cluster.states[TP] == state


def test_an_own_commit_overtaken_by_the_next_one_is_not_decoded_either() -> None:
    """Rounds pipeline: the next commit's answer can come before the watch brings the previous
    commit back. Both were applied when committed; neither is decoded again."""
    cluster = view()
    first = PartitionState(high_watermark=10, leader_epoch=1)
    second = PartitionState(high_watermark=20, leader_epoch=1)
    cluster.update_state(TP, first, revision=7)
    cluster.update_state(TP, second, revision=9)
    cluster._apply(put(b"not json", 7))  # decoding it would fail (and log)
    cluster._apply(put(b"not json", 9))
    assert cluster.states[TP] == second
    theirs = PartitionState(high_watermark=25, leader_epoch=2)
    cluster._apply(put(theirs.to_json(), 12))  # a later writer's commit is applied
    assert cluster.states[TP] == theirs


def test_an_own_commit_seen_before_its_answer_is_applied_without_decoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watch can bring a commit back before the transaction answers: the view recognises
    the document it is committing by its bytes and applies the state as it is; a different
    document at that key (another writer's) is decoded."""
    cluster = view()
    mine = PartitionState(high_watermark=10, leader_epoch=1)
    document = mine.to_json()
    cluster.expect_commit(TP, document, mine)

    def no_decoding(_: bytes) -> PartitionState:
        raise AssertionError("decoded again")

    with monkeypatch.context() as patched:
        patched.setattr(PartitionState, "from_json", no_decoding)
        cluster._apply(put(document, 7))
    assert cluster.states[TP] is mine
    theirs = PartitionState(high_watermark=25, leader_epoch=2)
    cluster._apply(put(theirs.to_json(), 9))
    assert cluster.states[TP] == theirs


def broker_event(kind: WatchEventKind, node_id: int, revision: int) -> WatchEvent:
    value = BrokerInfo(node_id, "10.0.0.1", 9092 + node_id).to_json() if kind is PUT else b""
    return WatchEvent(kind, keys.broker_key("c", node_id), value, revision)


PUT, DELETE = WatchEventKind.PUT, WatchEventKind.DELETE


def test_a_deleted_registration_is_remembered_as_departed_until_it_registers_again() -> None:
    """Metadata lists a departed broker for a grace period (``listed_brokers.with_departed``);
    only the view knows what a deleted key held."""
    cluster = ClusterView(None, "c", departed_grace_s=30.0)  # type: ignore[arg-type]
    cluster._apply(broker_event(PUT, 1, 2))
    cluster._apply(broker_event(DELETE, 1, 3))
    assert 1 not in cluster.brokers
    assert cluster.departed[1].info == BrokerInfo(1, "10.0.0.1", 9093)
    cluster._apply(broker_event(PUT, 1, 4))
    assert cluster.departed == {}


def test_departures_are_not_kept_without_a_grace() -> None:
    cluster = view()
    cluster._apply(broker_event(PUT, 1, 2))
    cluster._apply(broker_event(DELETE, 1, 3))
    assert cluster.departed == {}
