"""Which brokers Metadata and DescribeCluster list (``broker/metadata/listed_brokers.py``): the
registered ones and always the broker itself while it serves, also when its lapsed session took
its registration; the controller is the lowest listed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.metadata.cluster import BrokerInfo
from kafscale.broker.metadata.listed_brokers import controller_id, listed_brokers

pytestmark = pytest.mark.unit


def info(node_id: int, host: str = "10.0.0.1") -> BrokerInfo:
    return BrokerInfo(node_id, host, 9092 + node_id)


registries = st.dictionaries(st.integers(0, 9), st.sampled_from(["10.0.0.1", "10.0.0.2"])).map(
    lambda hosts: {node_id: info(node_id, host) for node_id, host in hosts.items()}
)


@given(registries, st.integers(0, 9))
def test_a_serving_broker_always_lists_itself_and_every_registered_one_once(
    registered: dict[int, BrokerInfo], me: int
) -> None:
    listed = listed_brokers(registered, info(me, "10.9.9.9"), serving=True)
    ids = [b.node_id for b in listed]
    assert ids == sorted(set(registered) | {me})
    # A registration the view holds is what is listed (it is what etcd says).
    assert all(b == registered.get(b.node_id, b) for b in listed)


def test_a_lapsed_registration_still_lists_the_broker_itself() -> None:
    """Before: a cluster of one answered Metadata with no broker at all."""
    me = info(3)
    assert listed_brokers({}, me, serving=True) == [me]
    assert listed_brokers({1: info(1)}, me, serving=True) == [info(1), me]
    assert controller_id(listed_brokers({}, me, serving=True)) == 3


def test_a_stopping_broker_lists_only_the_registered_ones() -> None:
    """It deregistered on purpose: clients should go to the others."""
    assert listed_brokers({1: info(1)}, info(3), serving=False) == [info(1)]
    assert listed_brokers({}, info(3), serving=False) == []
    assert listed_brokers({}, None, serving=True) == []


def test_the_controller_is_the_lowest_listed_or_none() -> None:
    assert controller_id([info(2), info(5)]) == 2
    assert controller_id([]) == -1
