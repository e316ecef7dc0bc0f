"""The cluster view follows only the keys it keeps (``metadata/view_ranges.py``): offset
commits, written per request for their coordinator's own use, reach no other broker's view,
while every change it keeps (topics, ACLs, quotas, group configs, share-group membership)
still does. A share group stored by an older version (its ``groups/<g>/metadata`` alone) is
copied to ``share-groups/`` once, so its members are still known.

Real etcd, a real broker, real clients (confluent-kafka commits offsets and sets group
configs; topics come from its admin client); ACLs and quotas are written with the product's own
stores, as their admin requests write them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from harness.brokers import BrokerCluster
from harness.etcd import harness_etcd
from harness.share import set_group_configs
from harness.topics import create_topic

from kafscale.broker.authz.model import (
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from kafscale.broker.authz.store import create_bindings
from kafscale.broker.groups.model import GroupRecord
from kafscale.broker.groups.share_groups_index import index_share_groups
from kafscale.broker.groups.store import Fence, GroupStore, encode_group
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.cluster import ClusterView
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.metadata.etcd import Etcd, WatchEvent
from kafscale.broker.quotas.entities import make_entity
from kafscale.broker.quotas.store import write_entities

pytestmark = pytest.mark.integration

COMMITS = 40


class CountingView(ClusterView):
    """A cluster view that notes the key of every watch event it is given to apply."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.applied: list[str] = []

    def _apply(self, event: WatchEvent) -> None:
        self.applied.append(event.key)
        super()._apply(event)


async def _until(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def _commit_offsets(bootstrap: str, topic: str, group: str) -> None:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        for offset in range(1, COMMITS + 1):
            consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
        [committed] = consumer.committed([TopicPartition(topic, 0)], timeout=30)
        assert committed.offset == COMMITS
    finally:
        consumer.close()


async def _share_group_joined(etcd_url: str, cluster: str, group: str, members: list[str]) -> None:
    """The group's coordinator saving a share group's membership (``GroupStore.save_group``
    under the group lease)."""
    etcd = await harness_etcd(etcd_url)
    try:
        lease_key = keys.group_lease_key(cluster, group)
        await etcd.put(lease_key, b"99")
        lease = await etcd.get(lease_key)
        assert lease is not None
        consumer = {"members": [{"member_id": m} for m in members]}
        record = GroupRecord("share", 1, None, None, group_type="share", consumer=consumer)
        fence = Fence(lease_key, b"99", lease.create_revision)
        assert await GroupStore(etcd, cluster).save_group(group, record, fence)
    finally:
        await etcd.close()


async def _share_group_deleted(etcd: Etcd, cluster: str, group: str) -> None:
    """DeleteGroups by its coordinator (``GroupStore.delete_group`` under the group lease)."""
    lease_key = keys.group_lease_key(cluster, group)
    lease = await etcd.get(lease_key)
    assert lease is not None
    fence = Fence(lease_key, lease.value, lease.create_revision)
    assert await GroupStore(etcd, cluster).delete_group(group, fence)


async def test_offset_commits_send_no_watch_event_while_kept_kinds_still_do(
    broker_cluster: BrokerCluster,
) -> None:
    broker = broker_cluster.start()
    cluster = broker_cluster.cluster
    etcd = await harness_etcd(broker_cluster.etcd_url)
    view = CountingView(etcd, cluster)
    await view.start()
    try:
        create_topic(broker.bootstrap, "committed", 1)
        await asyncio.to_thread(_commit_offsets, broker.bootstrap, "committed", "readers")
        # Every kind the view keeps, changed after the commits.
        create_topic(broker.bootstrap, "after-commits", 2)
        binding = AclBinding(
            ResourceType.TOPIC,
            "after-commits",
            PatternType.LITERAL,
            "User:alice",
            "*",
            Operation.READ,
            Permission.ALLOW,
        )
        await create_bindings(etcd, cluster, [binding])
        entity = make_entity([("client-id", "slow-client")])
        await write_entities(etcd, cluster, {entity: {"producer_byte_rate": 1024.0}}, {entity: 0})
        await asyncio.to_thread(
            set_group_configs, broker.bootstrap, "readers", {"consumer.session.timeout.ms": "50000"}
        )
        await _share_group_joined(broker_cluster.etcd_url, cluster, "sharers", ["m1", "m2"])

        await _until(lambda: "after-commits" in view.topics, "the new topic")
        await _until(lambda: binding in view.acls.bindings, "the ACL")
        await _until(lambda: entity in view.quotas.quotas, "the quota")
        await _until(lambda: "readers" in view.group_configs, "the group config")
        await _until(lambda: view.share_members.has("sharers", "m2"), "the share members")
        await _share_group_joined(broker_cluster.etcd_url, cluster, "sharers", ["m1"])
        await _until(lambda: not view.share_members.has("sharers", "m2"), "m2's departure")
        await _share_group_deleted(etcd, cluster, "sharers")
        await _until(lambda: "sharers" not in view.share_members.members, "the deletion")
        assert await etcd.get(keys.share_group_key(cluster, "sharers")) is None

        offsets = keys.group_offsets_prefix(cluster, "readers")
        assert await etcd.get(keys.group_offset_key(cluster, "readers", "committed", 0))
        seen_groups = [k for k in view.applied if k.startswith(keys.groups_prefix(cluster))]
        assert seen_groups == [], f"{len(seen_groups)} events under groups/, e.g. {offsets}"
        assert view.group_configs["readers"] == {"consumer.session.timeout.ms": "50000"}
    finally:
        await view.close()
        await etcd.close()


async def test_a_share_group_stored_by_an_older_version_is_copied_once(
    etcd_server: EmbeddedEtcd, cluster_name: str, tmp_path: Path
) -> None:
    """Only ``groups/<g>/metadata`` (as an older coordinator wrote it): the start-up copy puts
    it in ``share-groups/``, so a view knows its members; classic groups are not copied; the
    cluster is then marked, and a later start-up copies nothing."""
    etcd = await harness_etcd(etcd_server.client_url)
    try:
        share = GroupRecord(
            "share", 4, None, None, group_type="share", consumer={"members": [{"member_id": "a"}]}
        )
        classic = GroupRecord("consumer", 2, "range", "x")
        await etcd.put(keys.group_metadata_key(cluster_name, "old/share"), encode_group(share))
        await etcd.put(keys.group_metadata_key(cluster_name, "classic"), encode_group(classic))
        await etcd.put(keys.group_offset_key(cluster_name, "classic", "t", 0), b'{"offset":1}')

        assert await index_share_groups(etcd, cluster_name) == 1
        view = ClusterView(etcd, cluster_name)
        await view.start()
        try:
            assert view.share_members.members == {"old/share": frozenset({"a"})}
        finally:
            await view.close()
        assert await etcd.get(keys.share_group_key(cluster_name, "classic")) is None
        await etcd.delete(keys.share_group_key(cluster_name, "old/share"))
        assert await index_share_groups(etcd, cluster_name) == 0  # marked: not read again
    finally:
        await etcd.close()
