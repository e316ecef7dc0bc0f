"""The handlers' authorization shell (``api.access``) and Metadata's filtering, for principals
other than ``User:ANONYMOUS`` (which needs SASL end to end): the connection's principal and
host, the watched ACL cache and the settings decide."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import RequestContext
from kafscale.broker.api.metadata import handle_metadata
from kafscale.broker.authz.model import Operation, binding_of
from kafscale.broker.authz.store import AclCache, binding_key
from kafscale.broker.config import AuthorizerSettings, BrokerSettings
from kafscale.broker.metadata.cluster import TopicInfo
from kafscale.broker.metadata.partition_state import PartitionState
from kafscale.broker.protocol.codec import RequestHeader
from kafscale.broker.protocol.errors import ErrorCode, KafkaError
from kafscale.broker.server import Connection

TOPIC, ALLOW, DENY, LITERAL, PREFIXED = 2, 3, 2, 3, 4


def context(
    principal: str,
    peer: str = "10.0.0.1:50000",
    enabled: bool = True,
    acls: list[tuple[Any, ...]] | None = None,
    topics: tuple[str, ...] = (),
    super_users: tuple[str, ...] = (),
) -> RequestContext:
    cache = AclCache()
    for args in acls or []:
        binding = binding_of(*args)
        cache.put(binding_key("c", binding), binding.to_json())
    settings = BrokerSettings(
        authorizer=AuthorizerSettings(enabled=enabled, super_users=super_users)
    )
    infos = {name: TopicInfo(name, f"{i:032x}", 1) for i, name in enumerate(topics, 1)}
    view = SimpleNamespace(
        acls=cache,
        topics=infos,
        topics_by_id={i.topic_id: i for i in infos.values()},
        brokers={},
        live_broker_ids=lambda: [],
    )
    broker = SimpleNamespace(
        settings=settings,
        view=view,
        cluster="c",
        leader_for=lambda tp: -1,
        listed_brokers=lambda: [],
        controller_id=lambda: -1,
        committed_state=lambda tp: PartitionState(),
    )
    header = RequestHeader(3, 12, 1, "test")
    return RequestContext(header, broker, Connection(peer, principal))  # type: ignore[arg-type]


def read(principal: str, name: str, host: str = "*") -> tuple[Any, ...]:
    return (TOPIC, name, LITERAL, principal, host, Operation.READ, ALLOW)


def test_everything_is_allowed_while_authorization_is_off() -> None:
    ctx = context("User:mallory", enabled=False)
    assert access.allowed(ctx, Operation.DELETE, access.TOPIC, "orders")
    assert access.allowed_on_cluster(ctx, Operation.ALTER)
    assert access.allowed_on_any(ctx, Operation.WRITE, access.TOPIC)
    access.require(ctx, Operation.ALTER, access.CLUSTER)


def test_the_connections_principal_decides() -> None:
    acls = [read("User:alice", "orders")]
    assert access.allowed(context("User:alice", acls=acls), Operation.READ, access.TOPIC, "orders")
    assert not access.allowed(
        context("User:bob", acls=acls), Operation.READ, access.TOPIC, "orders"
    )
    assert access.topic_denied(context("User:bob", acls=acls), Operation.READ, "orders") == (
        ErrorCode.TOPIC_AUTHORIZATION_FAILED
    )


def test_the_clients_address_is_the_host() -> None:
    acls = [read("User:alice", "orders", host="10.0.0.1"), read("User:alice", "ipv6", host="::1")]
    here = context("User:alice", acls=acls)
    elsewhere = context("User:alice", peer="10.0.0.2:50000", acls=acls)
    assert access.allowed(here, Operation.READ, access.TOPIC, "orders")
    assert not access.allowed(elsewhere, Operation.READ, access.TOPIC, "orders")
    assert access.client_host(context("User:alice", peer="::1:4000")) == "::1"
    assert access.allowed(
        context("User:alice", peer="::1:4000", acls=acls), Operation.READ, access.TOPIC, "ipv6"
    )


def test_require_raises_the_resource_types_error() -> None:
    ctx = context("User:bob")
    for resource_type, code in access.DENIED_CODES.items():
        try:
            access.require(ctx, Operation.DESCRIBE, resource_type, "x")
        except KafkaError as exc:
            assert exc.code == code
        else:
            raise AssertionError(f"{resource_type.name} was allowed")


def test_super_users_from_the_settings() -> None:
    ctx = context("User:admin", super_users=("User:admin",))
    access.require(ctx, Operation.ALTER, access.CLUSTER)


def test_metadata_lists_only_what_the_principal_may_describe() -> None:
    acls = [
        read("User:alice", "orders"),
        (TOPIC, "pay", PREFIXED, "User:alice", "*", Operation.WRITE, ALLOW),
        (TOPIC, "payroll", LITERAL, "User:alice", "*", Operation.ALL, DENY),
    ]
    topics = ("orders", "payments", "payroll", "secrets")
    alice = context("User:alice", acls=acls, topics=topics)
    request = SimpleNamespace(topics=None, allow_auto_topic_creation=False)
    listed = asyncio.run(handle_metadata(request, alice))
    assert [t["name"] for t in listed["topics"]] == ["orders", "payments"]
    bob = context("User:bob", acls=acls, topics=topics)
    assert asyncio.run(handle_metadata(request, bob))["topics"] == []
    named = SimpleNamespace(
        topics=[SimpleNamespace(name="secrets"), SimpleNamespace(name="orders")],
        allow_auto_topic_creation=False,
    )
    codes = [t["error_code"] for t in asyncio.run(handle_metadata(named, alice))["topics"]]
    assert codes == [ErrorCode.TOPIC_AUTHORIZATION_FAILED, ErrorCode.NONE]


def test_authorized_operations_bit_field() -> None:
    group_read = (3, "billing", LITERAL, "User:alice", "*", Operation.READ, ALLOW)
    ctx = context("User:alice", acls=[group_read])
    ops = (Operation.READ, Operation.DELETE, Operation.DESCRIBE)
    # READ, and DESCRIBE which READ implies; not DELETE
    assert access.authorized_operations(ctx, access.GROUP, "billing", ops) == (1 << 3) | (1 << 8)
    off = context("User:alice", enabled=False)
    assert access.authorized_operations(off, access.GROUP, "billing", ops) == 0b101001000


def test_metadata_reports_authorized_operations_when_asked() -> None:
    ctx = context("User:alice", acls=[read("User:alice", "orders")], topics=("orders",))
    asked = SimpleNamespace(
        topics=None,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=True,
        include_cluster_authorized_operations=True,
    )
    answer = asyncio.run(handle_metadata(asked, ctx))
    assert answer["topics"][0]["topic_authorized_operations"] == (1 << 3) | (1 << 8)
    assert answer["cluster_authorized_operations"] == 0
    not_asked = SimpleNamespace(topics=None, allow_auto_topic_creation=False)
    answer = asyncio.run(handle_metadata(not_asked, ctx))
    assert answer["topics"][0]["topic_authorized_operations"] == access.OPERATIONS_OMITTED


def test_group_configs_are_authorized_on_the_group_as_kafka_does() -> None:
    """DescribeConfigs / IncrementalAlterConfigs of a GROUP resource (config type 32) need
    DESCRIBE_CONFIGS / ALTER_CONFIGS on that group, not on the cluster."""
    group_acl = (3, "billing", LITERAL, "User:alice", "*", Operation.ALTER_CONFIGS, ALLOW)
    ctx = context("User:alice", acls=[group_acl])
    access.require_config(ctx, Operation.ALTER_CONFIGS, 32, "billing")
    try:
        access.require_config(ctx, Operation.ALTER_CONFIGS, 32, "payroll")
    except KafkaError as exc:
        assert exc.code == ErrorCode.GROUP_AUTHORIZATION_FAILED
    else:
        raise AssertionError("ALTER_CONFIGS on another group was allowed")
    # ALTER_CONFIGS on the cluster (enough for broker configs) is not enough for a group's.
    cluster_acl = (4, "kafka-cluster", LITERAL, "User:bob", "*", Operation.ALTER_CONFIGS, ALLOW)
    bob = context("User:bob", acls=[cluster_acl])
    access.require_config(bob, Operation.ALTER_CONFIGS, 4, "1")
    try:
        access.require_config(bob, Operation.ALTER_CONFIGS, 32, "billing")
    except KafkaError as exc:
        assert exc.code == ErrorCode.GROUP_AUTHORIZATION_FAILED
    else:
        raise AssertionError("ALTER_CONFIGS on the cluster allowed a group's configs")
