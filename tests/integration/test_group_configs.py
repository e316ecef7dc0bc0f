"""A consumer group's own configs (KIP-848's group configs) with real brokers and clients.

The Java AdminClient sets them (``incrementalAlterConfigs`` on ``ConfigResource.Type.GROUP``,
what ``kafka-configs --entity-type groups`` sends) and reads them back; a kio-level
DescribeConfigs reads them too. They are enforced: ConsumerGroupHeartbeat answers the group's
heartbeat interval, and a member that stops heartbeating is removed after the group's session
timeout while the broker's default would keep it for ten minutes. Values outside the broker's
``group.consumer.min/max.*`` bounds, and share/streams group configs, are refused.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from harness import children, topics
from harness.brokers import BrokerCluster, BrokerProcess
from harness.groups import QUIET, wait_for
from harness.java_client import java_program
from harness.kafka_wire import KafkaWire, heartbeat
from harness.proxy import start_proxy

pytestmark = pytest.mark.integration

JAVA_SOURCE = Path(__file__).with_name("java") / "GroupConfigsAdmin.java"
GROUP_RESOURCE = 32
GROUP_CONFIG_SOURCE = 8
BROKER_SESSION_MS = 600_000  # the broker's default: a member relying on it stays 10 minutes
ENV = {
    "KAFSCALE_GROUPS__CONSUMER_SESSION_TIMEOUT_MS": str(BROKER_SESSION_MS),
    "KAFSCALE_GROUPS__CONSUMER_MAX_SESSION_TIMEOUT_MS": str(BROKER_SESSION_MS),
    "KAFSCALE_GROUPS__CONSUMER_MIN_SESSION_TIMEOUT_MS": "1000",
    "KAFSCALE_GROUPS__CONSUMER_MIN_HEARTBEAT_INTERVAL_MS": "100",
}


def java_admin(*args: str) -> tuple[int, list[str]]:
    command = java_program(JAVA_SOURCE, "GroupConfigsAdmin")
    done = children.run([*command, *args], capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout.splitlines()


SHARE_DEFAULTS = {
    "share.session.timeout.ms": ("45000", 5),
    "share.heartbeat.interval.ms": ("5000", 5),
    "share.record.lock.duration.ms": ("30000", 5),
    "share.delivery.count.limit": ("5", 5),
    "share.partition.max.record.locks": ("2000", 5),
    "share.auto.offset.reset": ("latest", 5),
    "share.isolation.level": ("read_uncommitted", 5),
}
"""Share group configs (KIP-932), described beside the consumer ones with Kafka's defaults."""


def describe_configs(bootstrap: str, group: str) -> dict[str, tuple[str, int]]:
    """kio-level DescribeConfigs v4 of the group: name -> (value, config source)."""
    body = {
        "resources": [
            {"resource_type": GROUP_RESOURCE, "resource_name": group, "configuration_keys": None}
        ],
        "include_synonyms": True,
        "include_documentation": False,
    }
    with KafkaWire(bootstrap) as wire:
        (result,) = wire.request(32, 4, body).results
    assert result.error_code == 0, result.error_message
    return {c.name: (c.value, c.config_source) for c in result.configs}


def coordinator_of(brokers: list[BrokerProcess], group: str) -> BrokerProcess:
    for broker in brokers:
        with KafkaWire(broker.bootstrap) as wire:
            body = {"key_type": 0, "coordinator_keys": [group]}
            (found,) = wire.request(10, 4, body).coordinators
        if found.error_code == 0:
            return next(b for b in brokers if b.bootstrap.endswith(f":{found.port}"))
    raise AssertionError(f"no coordinator for {group}")


def members_of(bootstrap: str, group: str) -> list[str]:
    with KafkaWire(bootstrap) as wire:
        request = {"group_ids": [group], "include_authorized_operations": False}
        (described,) = wire.request(69, 1, request).groups
    assert described.error_code == 0, described.error_message
    return [m.member_id for m in described.members]


def interval_ms(response: Any) -> int:
    return int(response.heartbeat_interval.total_seconds() * 1000)


def test_group_configs_are_set_described_and_enforced(broker_cluster: BrokerCluster) -> None:
    broker = broker_cluster.start(**ENV)
    topic, group = f"gc-{time.monotonic_ns()}", f"g-{time.monotonic_ns()}"
    topics.create_topic(broker.bootstrap, topic, 2, log_level=QUIET)
    # Before any change: the broker's defaults, as Kafka reports them.
    assert describe_configs(broker.bootstrap, group) == {
        "consumer.heartbeat.interval.ms": ("5000", 5),
        "consumer.session.timeout.ms": (str(BROKER_SESSION_MS), 5),
        **SHARE_DEFAULTS,
    }
    settings = "consumer.session.timeout.ms=2500,consumer.heartbeat.interval.ms=400"
    assert java_admin("alter", broker.bootstrap, group, settings) == (0, ["ok"])
    assert describe_configs(broker.bootstrap, group) == {
        "consumer.heartbeat.interval.ms": ("400", GROUP_CONFIG_SOURCE),
        "consumer.session.timeout.ms": ("2500", GROUP_CONFIG_SOURCE),
        **SHARE_DEFAULTS,
    }
    # ListConfigResources (KIP-1142) lists the groups with their own configs.
    with KafkaWire(broker.bootstrap) as wire:
        listed = wire.request(74, 1, {"resource_types": [GROUP_RESOURCE]}).config_resources
    assert [(r.resource_name, r.resource_type) for r in listed] == [(group, GROUP_RESOURCE)]
    code, lines = java_admin("describe", broker.bootstrap, group)
    assert code == 0 and sorted(lines) == [
        "entry consumer.heartbeat.interval.ms DYNAMIC_GROUP_CONFIG 400",
        "entry consumer.session.timeout.ms DYNAMIC_GROUP_CONFIG 2500",
        *sorted(
            f"entry {name} DEFAULT_CONFIG {value}" for name, (value, _) in SHARE_DEFAULTS.items()
        ),
    ]
    # Enforced: the heartbeat interval answered is the group's, and a member that stops
    # heartbeating is gone after the group's 2.5 s session (the broker's is 10 minutes).
    with KafkaWire(broker.bootstrap) as wire:
        joined = heartbeat(wire, group, "quiet-member", 0, subscribed_topic_names=[topic])
        assert joined.error_code == 0
        assert interval_ms(joined) == 400
    assert members_of(broker.bootstrap, group) == ["quiet-member"]
    wait_for(
        lambda: members_of(broker.bootstrap, group) == [],
        60,
        "the member to expire after the group's session timeout",
    )


def test_bad_group_configs_are_refused_with_kafkas_messages(broker_cluster: BrokerCluster) -> None:
    broker = broker_cluster.start(**ENV)
    group = f"g-{time.monotonic_ns()}"
    code, lines = java_admin("alter", broker.bootstrap, group, "consumer.session.timeout.ms=500")
    assert code == 1
    assert lines[0].startswith("error InvalidConfigurationException consumer.session.timeout.ms")
    assert "group.consumer.min.session.timeout.ms" in lines[0]
    code, lines = java_admin("alter", broker.bootstrap, group, "share.session.timeout.ms=500")
    assert code == 1 and "share.session.timeout.ms must be greater than" in lines[0]
    code, lines = java_admin("alter", broker.bootstrap, group, "streams.num.standby.replicas=1")
    assert code == 1 and "streams groups" in lines[0]
    code, lines = java_admin("alter", broker.bootstrap, group, "consumer.heartbeat.interval.ms=x")
    assert code == 1 and "InvalidConfigurationException" in lines[0]
    # The bounds are the broker's configs, as DescribeConfigs of the broker shows them.
    with KafkaWire(broker.bootstrap) as wire:
        body = {
            "resources": [{"resource_type": 4, "resource_name": "", "configuration_keys": None}],
            "include_synonyms": False,
            "include_documentation": False,
        }
        (result,) = wire.request(32, 4, body).results
    bounds = {c.name: c.value for c in result.configs if c.name.startswith("group.consumer.")}
    assert bounds["group.consumer.min.session.timeout.ms"] == "1000"
    assert bounds["group.consumer.max.heartbeat.interval.ms"] == "15000"
    # Nothing refused was stored.
    assert describe_configs(broker.bootstrap, group)["consumer.session.timeout.ms"] == (
        str(BROKER_SESSION_MS),
        5,
    )


def test_a_change_through_the_proxy_reaches_a_live_groups_coordinator(
    broker_cluster: BrokerCluster,
) -> None:
    """Set through the proxy (any broker writes etcd), the change reaches the coordinator by
    its watch and applies from the member's next heartbeat; deleting it restores the broker's
    default."""
    brokers = [broker_cluster.start(**ENV) for _ in range(2)]
    proxy = start_proxy(broker_cluster)
    topic, group = f"gc-{time.monotonic_ns()}", f"g-{time.monotonic_ns()}"
    topics.create_topic(brokers[0].bootstrap, topic, 2, log_level=QUIET)
    coordinator = coordinator_of(brokers, group)
    with KafkaWire(coordinator.bootstrap) as wire:
        joined = heartbeat(wire, group, "m", 0, subscribed_topic_names=[topic])
        assert joined.error_code == 0 and interval_ms(joined) == 5000
        epoch = joined.member_epoch

        def answered() -> int:
            return interval_ms(heartbeat(wire, group, "m", epoch))

        assert java_admin(
            "alter", proxy.bootstrap, group, "consumer.heartbeat.interval.ms=700"
        ) == (0, ["ok"])
        wait_for(lambda: answered() == 700, 20, "the coordinator to answer the new interval")
        assert describe_configs(proxy.bootstrap, group)["consumer.heartbeat.interval.ms"] == (
            "700",
            GROUP_CONFIG_SOURCE,
        )
        assert java_admin("alter", proxy.bootstrap, group, "consumer.heartbeat.interval.ms=") == (
            0,
            ["ok"],
        )
        wait_for(lambda: answered() == 5000, 20, "the broker's default interval again")
