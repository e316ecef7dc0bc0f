"""Every advertised version of every group API, on the wire, against broker processes.

The table advertises FindCoordinator 0-4, JoinGroup 0-9, SyncGroup 0-5, Heartbeat 0-4,
LeaveGroup 0-5, OffsetCommit 2-8, OffsetFetch 1-8, DescribeGroups 0-5, ListGroups 0-4 and
DeleteGroups 0-2; each round below walks one group through its whole life at one version of
each, so every version is encoded, decoded and answered at least once. Then the version-gated
behaviour (MEMBER_ID_REQUIRED from JoinGroup v4 only, batch LeaveGroup from v3, one member's
error at the top of LeaveGroup v0-2), NOT_COORDINATOR from the broker without the lease, and
etcd trouble (REQUEST_TIMED_OUT / COORDINATOR_NOT_AVAILABLE, never a guess).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness.brokers import BrokerCluster, BrokerProcess, new_cluster
from harness.kafka_wire import KafkaWire, metadata_body
from harness.s3 import S3Endpoint

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = pytest.mark.integration

FIND, JOIN, HEARTBEAT, LEAVE, SYNC, DESCRIBE, LIST, DELETE = 10, 11, 12, 13, 14, 15, 16, 42
COMMIT, FETCH_OFFSETS = 8, 9
NONE, NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, REQUEST_TIMED_OUT = 0, 16, 15, 7
UNKNOWN_MEMBER_ID, MEMBER_ID_REQUIRED = 25, 79
GROUP_ENV = {
    "KAFSCALE_GROUPS__INITIAL_REBALANCE_DELAY_MS": "0",
    "KAFSCALE_GROUPS__MIN_SESSION_TIMEOUT_MS": "1000",
}
TOPIC = "wire-topic"


def start(cluster: BrokerCluster, **env: str) -> BrokerProcess:
    return cluster.start(**{**GROUP_ENV, **env})


def join_body(group: str, member_id: str = "", instance: str | None = None) -> dict[str, Any]:
    return {
        "group_id": group,
        "session_timeout": 10_000,
        "rebalance_timeout": 10_000,
        "member_id": member_id,
        "group_instance_id": instance,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b"subscription"}],
        "reason": None,
    }


def join(wire: KafkaWire, version: int, group: str) -> Any:
    response = wire.request(JOIN, version, join_body(group))
    if version >= 4:
        assert response.error_code == MEMBER_ID_REQUIRED
        assert response.member_id
        response = wire.request(JOIN, version, join_body(group, response.member_id))
    else:
        assert response.error_code == NONE
    return response


def find(wire: KafkaWire, version: int, group: str) -> int:
    if version >= 4:
        response = wire.request(FIND, version, {"key_type": 0, "coordinator_keys": [group]})
        (entry,) = response.coordinators
        assert entry.key == group and entry.error_code == NONE
        return int(entry.node_id)
    response = wire.request(FIND, version, {"key": group, "key_type": 0})
    assert response.error_code == NONE
    return int(response.node_id)


def test_every_version_through_a_whole_group_life(broker_cluster: BrokerCluster) -> None:
    broker = start(broker_cluster)
    with KafkaWire(broker.bootstrap) as wire:
        topics = wire.request(3, 9, metadata_body([TOPIC]))
        assert topics.topics[0].error_code == NONE
        for round_ in range(10):
            group = f"wire-{round_}"
            versions = {
                JOIN: round_,
                FIND: min(round_, 4),
                SYNC: min(round_, 5),
                HEARTBEAT: min(round_, 4),
                LEAVE: min(round_, 5),
                COMMIT: 2 + round_ % 7,
                FETCH_OFFSETS: 1 + round_ % 8,
                DESCRIBE: min(round_, 5),
                LIST: min(round_, 4),
                DELETE: round_ % 3,
            }
            assert find(wire, versions[FIND], group) == broker.node_id
            joined = join(wire, versions[JOIN], group)
            member, generation = joined.member_id, joined.generation_id
            assert joined.error_code == NONE and generation == 1
            assert joined.leader == member
            assert [(m.member_id, m.metadata) for m in joined.members] == [
                (member, b"subscription")
            ]
            if versions[JOIN] >= 7:
                assert joined.protocol_type == "consumer"
            assert joined.protocol_name == "range"

            synced = wire.request(
                SYNC,
                versions[SYNC],
                {
                    "group_id": group,
                    "generation_id": generation,
                    "member_id": member,
                    "group_instance_id": None,
                    "protocol_type": "consumer",
                    "protocol_name": "range",
                    "assignments": [{"member_id": member, "assignment": b"all of it"}],
                },
            )
            assert synced.error_code == NONE and synced.assignment == b"all of it"

            beat = wire.request(
                HEARTBEAT,
                versions[HEARTBEAT],
                {"group_id": group, "generation_id": generation, "member_id": member},
            )
            assert beat.error_code == NONE

            committed = wire.request(
                COMMIT,
                versions[COMMIT],
                {
                    "group_id": group,
                    "generation_id_or_member_epoch": generation,
                    "member_id": member,
                    "retention_time": -1,
                    "topics": [
                        {
                            "name": TOPIC,
                            "partitions": [
                                {
                                    "partition_index": 1,
                                    "committed_offset": 42 + round_,
                                    "committed_leader_epoch": 0,
                                    "committed_metadata": "meta",
                                },
                                {"partition_index": 99, "committed_offset": 1},
                            ],
                        }
                    ],
                },
            )
            codes = {p.partition_index: p.error_code for p in committed.topics[0].partitions}
            assert codes == {1: NONE, 99: 3}  # 99: UNKNOWN_TOPIC_OR_PARTITION

            offsets = fetch_offsets(wire, versions[FETCH_OFFSETS], group, [1, 2])
            assert offsets == {1: (42 + round_, "meta"), 2: (-1, "")}
            if versions[FETCH_OFFSETS] >= 2:
                everything = fetch_offsets(wire, versions[FETCH_OFFSETS], group, None)
                assert everything == {1: (42 + round_, "meta")}

            described = wire.request(
                DESCRIBE,
                versions[DESCRIBE],
                {"groups": [group], "include_authorized_operations": True},
            )
            (summary,) = described.groups
            assert (summary.error_code, summary.group_state, summary.protocol_data) == (
                NONE,
                "Stable",
                "range",
            )
            assert [(m.member_id, m.member_assignment) for m in summary.members] == [
                (member, b"all of it")
            ]
            assert summary.members[0].client_id == "kafscale"

            listed = wire.request(LIST, versions[LIST], {"states_filter": ["Stable"]})
            assert listed.error_code == NONE
            assert group in {g.group_id for g in listed.groups}

            leave_body: dict[str, Any] = {"group_id": group, "member_id": member}
            leave_body["members"] = [{"member_id": member, "group_instance_id": None}]
            left = wire.request(LEAVE, versions[LEAVE], leave_body)
            assert left.error_code == NONE
            if versions[LEAVE] >= 3:
                assert [(m.member_id, m.error_code) for m in left.members] == [(member, NONE)]

            deleted = wire.request(DELETE, versions[DELETE], {"groups_names": [group]})
            assert [(r.group_id, r.error_code) for r in deleted.results] == [(group, NONE)]
            gone = wire.request(DESCRIBE, versions[DESCRIBE], {"groups": [group]})
            assert gone.groups[0].group_state == "Dead"
            assert fetch_offsets(wire, versions[FETCH_OFFSETS], group, [1]) == {1: (-1, "")}


def fetch_offsets(
    wire: KafkaWire, version: int, group: str, partitions: list[int] | None
) -> dict[int, tuple[int, str]]:
    topics = None if partitions is None else [{"name": TOPIC, "partition_indexes": partitions}]
    if version >= 8:
        body: dict[str, Any] = {"groups": [{"group_id": group, "topics": topics}]}
        response = wire.request(FETCH_OFFSETS, version, {**body, "require_stable": False})
        (entry,) = response.groups
        assert entry.error_code == NONE
        found = entry.topics
    else:
        response = wire.request(
            FETCH_OFFSETS, version, {"group_id": group, "topics": topics, "require_stable": False}
        )
        if version >= 2:
            assert response.error_code == NONE
        found = response.topics
    return {
        p.partition_index: (p.committed_offset, p.metadata or "")
        for t in found
        for p in t.partitions
        if p.error_code == NONE
    }


def test_version_gates_and_the_coordinator_rule(broker_cluster: BrokerCluster) -> None:
    b1, b2 = start(broker_cluster), start(broker_cluster)
    group = "gated"
    with KafkaWire(b1.bootstrap) as w1, KafkaWire(b2.bootstrap) as w2:
        chosen = find(w1, 4, group)
        assert find(w2, 2, group) == chosen  # every broker names the same one
        batch = w1.request(FIND, 4, {"key_type": 0, "coordinator_keys": [group, "other"]})
        assert [c.key for c in batch.coordinators] == [group, "other"]
        holder, other = (w1, w2) if chosen == b1.node_id else (w2, w1)

        # v3 gets its member id at once; v4 must come back with the one it is given.
        v3 = holder.request(JOIN, 3, join_body(group))
        assert v3.error_code == NONE and v3.member_id.startswith("kafscale-")
        assert other.request(JOIN, 5, join_body(group)).error_code == NOT_COORDINATOR
        assert (
            other.request(
                HEARTBEAT, 3, {"group_id": group, "generation_id": 1, "member_id": v3.member_id}
            ).error_code
            == NOT_COORDINATOR
        )

        # LeaveGroup v0-2: the one member's error at the top; v3+: per member.
        unknown = holder.request(LEAVE, 1, {"group_id": group, "member_id": "nobody"})
        assert unknown.error_code == UNKNOWN_MEMBER_ID
        batch_leave = holder.request(
            LEAVE,
            3,
            {
                "group_id": group,
                "members": [
                    {"member_id": v3.member_id, "group_instance_id": None},
                    {"member_id": "nobody", "group_instance_id": None},
                ],
            },
        )
        assert batch_leave.error_code == NONE
        assert [m.error_code for m in batch_leave.members] == [NONE, UNKNOWN_MEMBER_ID]

        # Simple consumers commit with generation -1 while the group has no members.
        holder.request(3, 9, metadata_body([TOPIC]))
        simple = holder.request(
            COMMIT,
            2,
            {
                "group_id": group,
                "generation_id_or_member_epoch": -1,
                "member_id": "",
                "topics": [
                    {"name": TOPIC, "partitions": [{"partition_index": 0, "committed_offset": 7}]}
                ],
            },
        )
        assert simple.topics[0].partitions[0].error_code == NONE
        nonempty = holder.request(DELETE, 1, {"groups_names": [group, "never-existed"]})
        assert [r.error_code for r in nonempty.results] == [NONE, 69]  # GROUP_ID_NOT_FOUND


def test_etcd_trouble_is_never_a_guess(
    etcd_server_private: EmbeddedEtcd, s3_server: S3Endpoint, cluster_name: str, tmp_path: Path
) -> None:
    cluster = new_cluster(
        etcd_server_private.client_url, s3_server, tmp_path, "g", name=cluster_name
    )
    try:
        broker = cluster.start(
            **GROUP_ENV, KAFSCALE_ETCD__TIMEOUT_S="1", KAFSCALE_ETCD__SESSION_TTL_S="30"
        )
        with KafkaWire(broker.bootstrap) as wire:
            wire.request(3, 9, metadata_body([TOPIC]))
            held = join(wire, 5, "held")
            assert held.error_code == NONE
            etcd_server_private.stop()

            def commit(group: str, generation: int, member: str) -> int:
                response = wire.request(
                    COMMIT,
                    8,
                    {
                        "group_id": group,
                        "generation_id_or_member_epoch": generation,
                        "member_id": member,
                        "topics": [
                            {
                                "name": TOPIC,
                                "partitions": [{"partition_index": 0, "committed_offset": 1}],
                            }
                        ],
                    },
                )
                return int(response.topics[0].partitions[0].error_code)

            assert commit("new-group", -1, "") == REQUEST_TIMED_OUT  # cannot take the lease
            assert wire.request(JOIN, 5, join_body("new-group")).error_code == (
                COORDINATOR_NOT_AVAILABLE
            )
            # The held group: storing the assignment is an etcd write, which cannot happen now.
            sync = wire.request(
                SYNC,
                3,
                {
                    "group_id": "held",
                    "generation_id": held.generation_id,
                    "member_id": held.member_id,
                    "assignments": [{"member_id": held.member_id, "assignment": b"x"}],
                },
            )
            assert sync.error_code == COORDINATOR_NOT_AVAILABLE
            # The member is valid (the failed store restarted the rebalance), the write is not.
            assert commit("held", held.generation_id, held.member_id) == REQUEST_TIMED_OUT
    finally:
        cluster.stop_all()
