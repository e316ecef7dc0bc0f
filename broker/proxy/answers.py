"""What the proxy answers itself: ApiVersions, Metadata, FindCoordinator, DescribeCluster (and,
with the brokers' own pure functions, DescribeTopicPartitions, ListConfigResources and
AlterPartitionReassignments: ``handlers``).

To its clients the proxy is the whole cluster's only broker: Metadata lists the proxy alone and
names it the leader of every partition that has a live owner, with the partition's real leader
epoch (clients send it back in Fetch and ListOffsets, and the owners check it). Every replica of
the proxy answers with the same node id and advertised address, so a client may be sent to any.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafscale.broker.api.access import CLUSTER_OPS, GROUP_OPS, TOPIC_OPS
from kafscale.broker.api.features import SHARE_VERSION
from kafscale.broker.api.served import SERVED_APIS, ServedApi, api_versions_body
from kafscale.broker.api.topic_partitions import LeaderOf, metadata_topics, partition_entry
from kafscale.broker.authz.model import CLUSTER_NAME, Operation, ResourceType
from kafscale.broker.metadata.cluster import CLUSTER_ID_PREFIX
from kafscale.broker.metadata.topics import missing_topic_error
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.proxy.routes import RoutingTable

Body = dict[str, Any]
Describable = Callable[[str], bool]
"""Whether the client may describe the topic (or group) of that name."""
Operations = Callable[[ResourceType, str], int]
"""Kafka's ``authorized_operations`` bit field of the client on that resource."""
GROUP_KEY_TYPE = 0
TRANSACTION_KEY_TYPE = 1
AUTHORIZED_OPERATIONS_OMITTED = -2147483648
CANDIDATES: dict[ResourceType, tuple[Operation, ...]] = {
    ResourceType.TOPIC: TOPIC_OPS,
    ResourceType.GROUP: GROUP_OPS,
    ResourceType.CLUSTER: CLUSTER_OPS,
}
"""What can be done to each resource type: the bits an ``authorized_operations`` may set."""


@dataclass(frozen=True, slots=True)
class Identity:
    """The one broker clients see (or, with ``expose_owners``, the owners' ids, all at the
    proxy's address)."""

    node_id: int
    host: str
    port: int
    cluster: str
    expose_owners: bool = False


def _everything(_name: str) -> bool:
    return True


def _all_operations(resource_type: ResourceType, _name: str) -> int:
    return sum(1 << op for op in CANDIDATES[resource_type])


def node_ids(routes: RoutingTable, me: Identity) -> list[int]:
    """The broker ids Metadata lists, every one at the proxy's address."""
    if me.expose_owners and routes.view.brokers:
        return sorted(routes.view.brokers)
    return [me.node_id]


def leader_id(owner: int, me: Identity) -> int:
    """The leader Metadata names for a partition owned by ``owner`` (-1: none)."""
    if owner < 0:
        return -1
    return owner if me.expose_owners else me.node_id


def leader_of(routes: RoutingTable, me: Identity) -> LeaderOf:
    """A partition's leader as the proxy's clients know it."""
    return lambda tp: leader_id(routes.partition_owner(tp), me)


PROXY_TABLE: dict[int, ServedApi] = SERVED_APIS
"""Every API the brokers serve, at every version (``api/served.py``, the module the brokers'
ApiVersions answers from): the proxy forwards them all (a share consumer's too: ``share``)."""


def api_versions(transaction_version: int) -> Body:
    """The brokers' own ranges and features, ``share.version`` included: the proxy serves share
    consumers exactly as the brokers behind it do (it maps a client's share session onto the
    owners', ``share_sessions``)."""
    return api_versions_body(
        PROXY_TABLE, transaction_version=transaction_version, share_version=SHARE_VERSION
    )


def requested_topic_names(request: Any, api_version: int, routes: RoutingTable) -> list[str] | None:
    """The topics a Metadata request names (None: all), ids resolved through the view."""
    topics = metadata_topics(request.topics, api_version)
    if topics is None:
        return None
    by_id = routes.view.topics_by_id
    names = []
    for topic in topics:
        topic_id = getattr(topic, "topic_id", None)
        if topic.name:
            names.append(topic.name)
        elif topic_id is not None and topic_id.hex in by_id:
            names.append(by_id[topic_id.hex].name)
    return names


def metadata(
    request: Any,
    api_version: int,
    routes: RoutingTable,
    me: Identity,
    describable: Describable = _everything,
    operations: Operations = _all_operations,
) -> Body:
    """The cluster as the proxy shows it; all-topics requests list only the topics the client
    may describe, named ones it may not get TOPIC_AUTHORIZATION_FAILED (as from a broker)."""
    names = requested_topic_names(request, api_version, routes)
    if names is None:
        names = [name for name in sorted(routes.view.topics) if describable(name)]

    def topic_ops(name: str) -> int:
        if not getattr(request, "include_topic_authorized_operations", False):
            return AUTHORIZED_OPERATIONS_OMITTED
        return operations(ResourceType.TOPIC, name)

    cluster_ops = AUTHORIZED_OPERATIONS_OMITTED
    if getattr(request, "include_cluster_authorized_operations", False):
        cluster_ops = operations(ResourceType.CLUSTER, CLUSTER_NAME)
    return {
        "throttle_time": 0,
        "brokers": [
            {"node_id": node, "host": me.host, "port": me.port, "rack": None}
            for node in node_ids(routes, me)
        ],
        "cluster_id": CLUSTER_ID_PREFIX + me.cluster,
        "controller_id": node_ids(routes, me)[0],
        "topics": [
            _topic(name, routes, me, topic_ops(name)) if describable(name) else _denied_topic(name)
            for name in names
        ],
        "cluster_authorized_operations": cluster_ops,
    }


def _denied_topic(name: str) -> Body:
    return {"error_code": ErrorCode.TOPIC_AUTHORIZATION_FAILED, "name": name, "partitions": []}


def _topic(name: str, routes: RoutingTable, me: Identity, operations: int) -> Body:
    info = routes.view.topics.get(name)
    if info is None:
        return {"error_code": missing_topic_error(name), "name": name, "partitions": []}
    partitions = [
        partition_entry(name, p, leader_of(routes, me), routes.leader_epoch)
        for p in range(info.partitions)
    ]
    return {
        "error_code": ErrorCode.NONE,
        "name": name,
        "topic_id": uuid.UUID(hex=info.topic_id),
        "is_internal": False,
        "partitions": partitions,
        "topic_authorized_operations": operations,
    }


def find_coordinator(
    request: Any,
    api_version: int,
    me: Identity,
    describable: Describable = _everything,
    txn_describable: Describable = _everything,
) -> Body:
    """The proxy coordinates every group and transactional id (it forwards to the real
    coordinator); a group or transactional id the client may not describe gets
    GROUP_AUTHORIZATION_FAILED or TRANSACTIONAL_ID_AUTHORIZATION_FAILED, as from a broker."""
    key_type = int(getattr(request, "key_type", GROUP_KEY_TYPE))
    if api_version >= 4:
        entries = [
            _coordinator(key, key_type, me, describable, txn_describable)
            for key in request.coordinator_keys
        ]
        return {"throttle_time": 0, "coordinators": entries}
    entry = _coordinator(request.key, key_type, me, describable, txn_describable)
    return {"throttle_time": 0, **{k: v for k, v in entry.items() if k != "key"}}


def _coordinator(
    key: str, key_type: int, me: Identity, describable: Describable, txn_describable: Describable
) -> Body:
    refused = {
        GROUP_KEY_TYPE: (describable, ErrorCode.GROUP_AUTHORIZATION_FAILED),
        TRANSACTION_KEY_TYPE: (txn_describable, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
    }.get(key_type)
    if refused is not None and not refused[0](key):
        return {
            "key": key,
            "node_id": -1,
            "host": "",
            "port": -1,
            "error_code": refused[1],
            "error_message": None,
        }
    if key_type not in (GROUP_KEY_TYPE, TRANSACTION_KEY_TYPE):  # as the brokers answer
        return {
            "key": key,
            "node_id": -1,
            "host": "",
            "port": -1,
            "error_code": ErrorCode.INVALID_REQUEST,
            "error_message": f"key type {key_type} is not supported",
        }
    return {
        "key": key,
        "node_id": me.node_id,
        "host": me.host,
        "port": me.port,
        "error_code": ErrorCode.NONE,
        "error_message": None,
    }


def describe_cluster(
    request: Any, routes: RoutingTable, me: Identity, operations: Operations = _all_operations
) -> Body:
    asked = getattr(request, "include_cluster_authorized_operations", False)
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "endpoint_type": 1,
        "cluster_id": CLUSTER_ID_PREFIX + me.cluster,
        "controller_id": node_ids(routes, me)[0],
        "brokers": [
            {"broker_id": node, "host": me.host, "port": me.port, "rack": None}
            for node in node_ids(routes, me)
        ],
        "cluster_authorized_operations": operations(ResourceType.CLUSTER, CLUSTER_NAME)
        if asked
        else AUTHORIZED_OPERATIONS_OMITTED,
    }


def refused_creations(broker_answer: Any, unknown: list[str]) -> dict[str, ErrorCode]:
    """The unknown topics a broker would not auto-create for the client (it may not CREATE
    them): their code from the broker's Metadata answer, which the proxy's own answer keeps
    (from its view alone they would be UNKNOWN_TOPIC_OR_PARTITION)."""
    wanted = set(unknown)
    return {
        str(topic.name): ErrorCode.TOPIC_AUTHORIZATION_FAILED
        for topic in getattr(broker_answer, "topics", None) or ()
        if topic.name in wanted and int(topic.error_code) == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    }


def with_topic_errors(body: Body, errors: dict[str, ErrorCode]) -> Body:
    """``body`` (a Metadata answer) with ``errors`` for the topics they name."""
    if not errors:
        return body
    topics = [
        {"error_code": errors[t["name"]], "name": t["name"], "partitions": []}
        if t["name"] in errors
        else t
        for t in body["topics"]
    ]
    return {**body, "topics": topics}
