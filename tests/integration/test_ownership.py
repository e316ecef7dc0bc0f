"""Several broker processes share partitions: balanced ownership, fenced handoffs."""

from __future__ import annotations

import time

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from harness.brokers import BrokerCluster, BrokerProcess

pytestmark = pytest.mark.integration


def owned_counts(brokers: list[BrokerProcess]) -> dict[int, int]:
    return {b.node_id: len(b.status()["owned"]) for b in brokers}


def wait_for(condition, timeout_s: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"condition not met in {timeout_s}s (last: {last})")


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, 1)])
    futures[name].result(15)


def test_ownership_balances_across_three_brokers(broker_cluster: BrokerCluster) -> None:
    brokers = [broker_cluster.start() for _ in range(3)]
    create_topic(brokers[0].bootstrap, "spread", 9)

    def balanced() -> dict[int, int] | None:
        counts = owned_counts(brokers)
        return counts if sorted(counts.values()) == [3, 3, 3] else None

    wait_for(balanced)
