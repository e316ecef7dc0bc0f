"""Share-partition leaders and share group membership (KIP-932), with real brokers and etcd:

* a member that leaves the group has its acquired records released at once on the partition's
  owner, also when the group's coordinator is another broker (the owner learns of it from the
  cluster watch of ``groups/<g>/metadata``), not when its locks run out (30 s);
* ShareFetch from a member id that is not in the group opens no share session and acquires
  nothing (UNKNOWN_MEMBER_ID); the sessions of a member that left are closed;
* a flush round refused for one share-partition (its stored state moved) fails only that
  share-partition's acknowledgements; the others are stored and answered NONE;
* DeleteGroups' share-state deletion is fenced by the group lease.

Raw requests: they show exactly which member holds which records.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from harness import children, topics
from harness.brokers import BrokerCluster, new_cluster
from harness.etcd import harness_etcd
from harness.kafka_wire import KafkaWire, metadata_body, share_fetch, share_heartbeat
from harness.s3 import S3Endpoint
from harness.share import (
    Received,
    poll_until,
    produce,
    set_group_configs,
    share_consumer,
    stored_share_state,
    wait_stored,
)

from kafscale.broker.api import share_fetch as share_fetch_api
from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.groups.model import GroupRecord
from kafscale.broker.groups.share import ShareConfig
from kafscale.broker.groups.store import Fence, GroupStore, encode_group
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.metadata.share_members import ShareMembers
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.share.manager import OwnerView, ShareManager
from kafscale.broker.share.store import ShareStateStore

pytestmark = pytest.mark.integration

# Locks far longer than any test: records come back only because their member left.
LONG_LOCKS = {"share.auto.offset.reset": "earliest", "share.record.lock.duration.ms": "600000"}


def _acquired(response: Any) -> dict[int, list[tuple[int, int, int]]]:
    return {
        p.partition_index: [
            (a.first_offset, a.last_offset, a.delivery_count) for a in p.acquired_records
        ]
        for t in response.responses
        for p in t.partitions
        if p.acquired_records
    }


def _leader(wire: KafkaWire, topic: str) -> int:
    metadata = wire.request(3, 9, metadata_body([topic]))
    return int(metadata.topics[0].partitions[0].leader_id)


def test_a_member_that_leaves_has_its_records_released_at_once_by_another_broker(
    broker_cluster: BrokerCluster,
) -> None:
    first, second = broker_cluster.start(), broker_cluster.start()
    topics.create_topic(broker_cluster.bootstrap, "q", 1)
    set_group_configs(broker_cluster.bootstrap, "leave", LONG_LOCKS)
    produce(broker_cluster.bootstrap, "q", [f"v{i}".encode() for i in range(5)])
    with KafkaWire(first.bootstrap) as probe:
        owner_id = _leader(probe, "q")
    owner: BrokerProcess = first if owner_id == first.node_id else second
    other: BrokerProcess = second if owner is first else first
    # The group's coordinator is the broker that is not the partition's owner: heartbeats
    # go there (it takes the group lease), fetches go to the owner.
    with (
        KafkaWire(other.bootstrap) as coordinator,
        KafkaWire(owner.bootstrap) as leaver,
        KafkaWire(owner.bootstrap) as stayer,
    ):
        joined = share_heartbeat(coordinator, "leave", "a", 0, "q")
        assert joined.error_code == ErrorCode.NONE, joined
        topic_id = joined.assignment.topic_partitions[0].topic_id
        held = share_fetch(leaver, "leave", "a", 0, topic_id)
        assert held.error_code == ErrorCode.NONE and _acquired(held) == {0: [(0, 4, 1)]}
        assert share_heartbeat(coordinator, "leave", "b", 0, "q").error_code == ErrorCode.NONE
        epoch = 0
        assert _acquired(share_fetch(stayer, "leave", "b", epoch, topic_id)) == {}
        # "a" leaves the group; its connection to the owner stays open, its session too.
        left = share_heartbeat(coordinator, "leave", "a", -1, "q")
        assert left.error_code == ErrorCode.NONE
        deadline = time.monotonic() + 30  # far less than the 600-s locks
        got: dict[int, list[tuple[int, int, int]]] = {}
        while not got:
            assert time.monotonic() < deadline, "the departed member's records never came back"
            epoch += 1
            answer = share_fetch(stayer, "leave", "b", epoch, topic_id)
            assert answer.error_code == ErrorCode.NONE, answer
            got = _acquired(answer)
            time.sleep(0.05)
        assert got == {0: [(0, 4, 2)]}
        # The departed member's session on the owner was closed; it cannot open another.
        assert share_fetch(leaver, "leave", "a", 1, topic_id).error_code == (
            ErrorCode.SHARE_SESSION_NOT_FOUND
        )
        assert share_fetch(leaver, "leave", "a", 0, topic_id).error_code == (
            ErrorCode.UNKNOWN_MEMBER_ID
        )


def test_share_fetch_from_a_member_not_in_the_group_opens_no_session(
    broker_cluster: BrokerCluster,
) -> None:
    """Made-up member ids neither take the broker's share sessions nor acquire records; a
    member of the group (joined through its heartbeat) does."""
    broker = broker_cluster.start()
    topics.create_topic(broker.bootstrap, "q", 1)
    set_group_configs(broker.bootstrap, "members", LONG_LOCKS)
    produce(broker.bootstrap, "q", [b"a", b"b"])
    with KafkaWire(broker.bootstrap) as wire:
        joined = share_heartbeat(wire, "members", "real", 0, "q")
        topic_id = joined.assignment.topic_partitions[0].topic_id
        for member in ("made-up-1", "made-up-2"):
            stranger = share_fetch(wire, "members", member, 0, topic_id)
            assert stranger.error_code == ErrorCode.UNKNOWN_MEMBER_ID, stranger
            assert _acquired(stranger) == {}
            assert share_fetch(wire, "members", member, 1, topic_id).error_code == (
                ErrorCode.SHARE_SESSION_NOT_FOUND
            )
        # Nothing was acquired by them: the member of the group gets every record.
        assert _acquired(share_fetch(wire, "members", "real", 0, topic_id)) == {0: [(0, 1, 1)]}


FROZEN_CONSUMER = textwrap.dedent(
    """
    import sys, time
    from confluent_kafka import ShareConsumer
    c = ShareConsumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
                       "share.acknowledgement.mode": "explicit"})
    c.subscribe([sys.argv[3]])
    got = 0
    while got == 0:
        got = len([m for m in c.poll(1.0) if m.error() is None])
    print(got, flush=True)
    time.sleep(600)  # stopped (SIGSTOP) here by the test: its connection stays open
    """
)


def test_a_frozen_librdkafka_consumer_s_records_go_to_another_member_once_it_expires(
    broker_cluster: BrokerCluster,
) -> None:
    """A librdkafka share consumer stops (SIGSTOP: no heartbeats, its connection open, its
    share session on the owner open). Its member session expires at the coordinator (3 s
    here), and the owner releases what it held at once, not after its 600-s locks."""
    broker = broker_cluster.start(
        KAFSCALE_GROUPS__SHARE_SESSION_TIMEOUT_MS="3000",
        KAFSCALE_GROUPS__SHARE_HEARTBEAT_INTERVAL_MS="500",
    )
    topics.create_topic(broker.bootstrap, "q", 1)
    set_group_configs(broker.bootstrap, "frozen", LONG_LOCKS)
    produce(broker.bootstrap, "q", [f"v{i}".encode() for i in range(10)])
    frozen = children.spawn(
        [sys.executable, "-c", FROZEN_CONSUMER, broker.bootstrap, "frozen", "q"],
        stdout=subprocess.PIPE,
        text=True,
    )
    consumer = None
    try:
        assert frozen.stdout is not None
        held = int(frozen.stdout.readline().split()[0])
        assert held > 0
        os.kill(frozen.pid, signal.SIGSTOP)
        got = Received()
        consumer = share_consumer(broker.bootstrap, "frozen", "q")
        poll_until(consumer, got, lambda: len(got.records) >= 10, timeout_s=60)
    finally:
        frozen.kill()
        frozen.wait(30)
        if consumer is not None:
            consumer.close()
    assert sorted(got.values) == sorted(f"v{i}".encode() for i in range(10))
    # Every record the frozen member held came again, a second delivery (it may have held
    # more than its first poll returned).
    assert sum(1 for _, _, count in got.records if count == 2) >= held


def _bump(etcd_url: str, key: str) -> None:
    """Write a key again with its own value: its mod revision moves, as an admin's write
    (AlterShareGroupOffsets by the coordinator) moves it."""

    async def write() -> None:
        etcd = await harness_etcd(etcd_url)
        try:
            kv = await etcd.get(key)
            assert kv is not None
            await etcd.put(key, kv.value)
        finally:
            await etcd.close()

    asyncio.run(write())


def test_a_refused_share_partition_fails_only_its_own_acknowledgements(
    broker_cluster: BrokerCluster,
) -> None:
    broker = broker_cluster.start()
    topics.create_topic(broker.bootstrap, "q", 2)
    set_group_configs(broker.bootstrap, "rounds", LONG_LOCKS)
    for partition in (0, 1):
        produce(broker.bootstrap, "q", [b"x", b"y", b"z"], partition=partition)
    cluster, etcd_url = broker_cluster.cluster, broker_cluster.etcd_url
    with KafkaWire(broker.bootstrap) as wire:
        joined = share_heartbeat(wire, "rounds", "m", 0, "q")
        topic_id = joined.assignment.topic_partitions[0].topic_id
        held = share_fetch(wire, "rounds", "m", 0, topic_id, (0, 1))
        assert _acquired(held) == {0: [(0, 2, 1)], 1: [(0, 2, 1)]}
        for partition in (0, 1):
            wait_stored(
                lambda p=partition: stored_share_state(etcd_url, cluster, "rounds", "q", p),
                lambda state: bool(state["batches"]),
            )
        # Partition 0's stored state moves under the owner: the next round, carrying both
        # partitions' acknowledgements, is refused by etcd for that one key.
        _bump(etcd_url, keys.share_state_key(cluster, "rounds", "q", 0))
        accept = [{"first_offset": 0, "last_offset": 2, "acknowledge_types": [1]}]
        body = {
            "group_id": "rounds",
            "member_id": "m",
            "share_session_epoch": 1,
            "topics": [
                {
                    "topic_id": topic_id,
                    "partitions": [
                        {"partition_index": p, "acknowledgement_batches": accept} for p in (0, 1)
                    ],
                }
            ],
        }
        answer = wire.request(79, 1, body)
        codes = {p.partition_index: p.error_code for p in answer.responses[0].partitions}
        assert codes == {0: ErrorCode.NOT_LEADER_OR_FOLLOWER, 1: ErrorCode.NONE}
    # Answered NONE: etcd has it.
    stored = stored_share_state(etcd_url, cluster, "rounds", "q", 1)
    assert stored is not None and stored["start"] == 3


async def test_share_state_is_deleted_with_the_group_under_its_lease(
    etcd_server: EmbeddedEtcd, cluster_name: str
) -> None:
    """A coordinator that lost the group lease deletes nothing (share state included); the
    holder deletes the share-partition states with the group, in its fenced transaction."""
    etcd = await harness_etcd(etcd_server.client_url)
    try:
        group = "deleted"
        state_key = keys.share_state_key(cluster_name, group, "q", 0)
        metadata_key = keys.group_metadata_key(cluster_name, group)
        lease_key = keys.group_lease_key(cluster_name, group)
        await etcd.put(state_key, b'{"topic_id":"x","start":0,"batches":[]}')
        record = GroupRecord("share", 1, None, None, group_type="share", consumer={})
        await etcd.put(metadata_key, encode_group(record))
        await etcd.put(lease_key, b"1")
        lease = await etcd.get(lease_key)
        assert lease is not None
        store = GroupStore(etcd, cluster_name)
        stale = Fence(lease_key, b"1", lease.create_revision + 1)
        assert not await store.delete_group(group, stale)
        assert await etcd.get(state_key) is not None
        assert await etcd.get(metadata_key) is not None
        fence = Fence(lease_key, b"1", lease.create_revision)
        assert await store.delete_group(group, fence)
        assert await etcd.get(state_key) is None
        assert await etcd.get(metadata_key) is None and await etcd.get(lease_key) is None
    finally:
        await etcd.close()


async def test_a_member_the_lagging_watch_has_not_shown_yet_is_found_in_etcd(
    etcd_server: EmbeddedEtcd, cluster_name: str
) -> None:
    """A loaded broker's cluster watch may show a member's join later than the join grace:
    the member, whose heartbeat was answered after etcd had its join, still gets its session
    (etcd is read once); a made-up id is still refused."""
    etcd = await harness_etcd(etcd_server.client_url)
    try:
        group = "lagging"
        consumer = {"members": [{"member_id": "joined"}]}
        record = GroupRecord("share", 1, None, None, group_type="share", consumer=consumer)
        await etcd.put(keys.group_metadata_key(cluster_name, group), encode_group(record))
        lagging_view = SimpleNamespace(share_members=ShareMembers())  # no event seen yet
        manager = ShareManager(ShareStateStore(etcd, cluster_name, 1))
        ctx: Any = SimpleNamespace(broker=SimpleNamespace(view=lagging_view, share=manager))
        assert await share_fetch_api._is_member(ctx, group, "joined")
        assert not await share_fetch_api._is_member(ctx, group, "made-up")
    finally:
        await etcd.close()


async def test_a_share_partition_started_before_its_group_was_deleted_writes_no_state(
    etcd_server: EmbeddedEtcd, cluster_name: str
) -> None:
    """A share-partition started (its first write due at the next flush round) when DeleteGroups
    deletes the group: that write is refused, so the deleted group gets no state back (a group
    created again under its name would start from it, and the key would stay forever)."""
    etcd = await harness_etcd(etcd_server.client_url)
    try:
        group = "deleted-meanwhile"
        metadata_key = keys.group_metadata_key(cluster_name, group)
        record = GroupRecord("share", 1, None, None, group_type="share", consumer={})
        await etcd.put(metadata_key, encode_group(record))
        lease_key = keys.partition_lease_key(cluster_name, "q", 0)
        await etcd.put(lease_key, b"1")
        lease = await etcd.get(lease_key)
        assert lease is not None
        manager = ShareManager(ShareStateStore(etcd, cluster_name, 1))
        owner = OwnerView("00" * 16, lease.create_revision, 0, 10)
        entry = await manager.entry((group, "q", 0), owner, ShareConfig())
        assert entry.dirty  # a fresh share-partition: written at the next round
        await etcd.delete(metadata_key)  # DeleteGroups, before that round
        await manager._flush_round()
        assert await etcd.get(keys.share_state_key(cluster_name, group, "q", 0)) is None
        assert entry.dropped
        # The same group created again: a share-partition of it is written as before.
        await etcd.put(metadata_key, encode_group(record))
        again = await manager.entry((group, "q", 0), owner, ShareConfig())
        await manager._flush_round()
        assert await etcd.get(keys.share_state_key(cluster_name, group, "q", 0)) is not None
        assert not again.dirty and not again.dropped
    finally:
        await etcd.close()


def _stored_member_epochs(etcd_url: str, cluster: str, group: str) -> dict[str, int]:
    """Each member's epoch in the group's stored membership (``groups/<g>/metadata``)."""

    async def read() -> dict[str, int]:
        etcd = await harness_etcd(etcd_url)
        try:
            kv = await etcd.get(keys.group_metadata_key(cluster, group))
        finally:
            await etcd.close()
        members = [] if kv is None else json.loads(kv.value)["consumer"]["members"]
        return {str(m["member_id"]): int(m["epoch"]) for m in members}

    return asyncio.run(read())


def test_a_membership_write_etcd_refuses_leaves_the_member_epoch_it_had(
    etcd_server_private: EmbeddedEtcd, s3_server: S3Endpoint, cluster_name: str, tmp_path: Path
) -> None:
    """A heartbeat whose change (a new subscription: a new group and member epoch) cannot be
    written because etcd stopped answering is refused, and the coordinator's in-memory group
    goes back to what etcd has: the member heartbeats again with the epoch it knows and is
    accepted (not FENCED_MEMBER_EPOCH by an epoch it was never told), and etcd then holds the
    epoch it was answered."""
    cluster = new_cluster(
        etcd_server_private.client_url, s3_server, tmp_path, "epoch", name=cluster_name
    )
    try:
        broker = cluster.start(KAFSCALE_ETCD__TIMEOUT_S="1", KAFSCALE_ETCD__SESSION_TTL_S="20")
        topics.create_topic(broker.bootstrap, "epoch-a", 1)
        topics.create_topic(broker.bootstrap, "epoch-b", 1)
        group, both = "epoch-group", ["epoch-a", "epoch-b"]
        etcd_pid = etcd_server_private.pid
        assert etcd_pid is not None
        with KafkaWire(broker.bootstrap, timeout_s=60) as wire:
            joined = share_heartbeat(wire, group, "m1", 0, "epoch-a")
            assert joined.error_code == ErrorCode.NONE, joined
            epoch = int(joined.member_epoch)
            assert share_heartbeat(wire, group, "m1", epoch, "epoch-a").error_code == ErrorCode.NONE
            body = {"group_id": group, "member_id": "m1", "member_epoch": epoch,
                    "rack_id": None, "subscribed_topic_names": both}  # fmt: skip
            children.freeze(etcd_pid)  # stopped: the heartbeat must find etcd silent
            try:
                refused = wire.request(76, 1, body)
            finally:
                os.kill(etcd_pid, signal.SIGCONT)
            assert refused.error_code != ErrorCode.NONE, refused
            again = wire.request(76, 1, body)
            assert again.error_code == ErrorCode.NONE, again
            assert again.member_epoch > epoch
            answered = int(again.member_epoch)
        deadline = time.monotonic() + 60
        while _stored_member_epochs(etcd_server_private.client_url, cluster_name, group) != {
            "m1": answered
        }:
            assert time.monotonic() < deadline, "etcd never took the epoch the member was given"
            time.sleep(0.1)
    finally:
        cluster.stop_all()
