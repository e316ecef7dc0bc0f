"""Which brokers Metadata and DescribeCluster list (``broker/metadata/listed_brokers.py``): the
registered ones and always the broker itself while it serves, also when its lapsed session took
its registration, and for a grace period the departed ones; the controller is the lowest live
one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.metadata.cluster import BrokerInfo, Departure
from kafscale.broker.metadata.listed_brokers import controller_id, listed_brokers, with_departed

pytestmark = pytest.mark.unit


def info(node_id: int, host: str = "10.0.0.1", port: int | None = None) -> BrokerInfo:
    return BrokerInfo(node_id, host, 9092 + node_id if port is None else port)


GRACE_S = 30.0


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


def test_a_departed_broker_is_listed_until_its_grace_ends() -> None:
    """Before: it left the list at once, and librdkafka destroyed its handle (#5511)."""
    live = [info(2)]
    departed = {1: Departure(info(1), at=100.0)}
    assert with_departed(live, departed, 100.0, GRACE_S) == [info(1), info(2)]
    assert with_departed(live, departed, 129.9, GRACE_S) == [info(1), info(2)]
    assert with_departed(live, departed, 130.0, GRACE_S) == [info(2)]
    assert with_departed(live, departed, 100.0, 0.0) == [info(2)]  # 0: disabled


def test_a_departed_id_whose_address_a_live_broker_advertises_is_not_listed() -> None:
    """A restart on the same port: the new process must not be reached under the dead id."""
    departed = {1: Departure(info(1, port=9200), at=100.0)}
    assert with_departed([info(2, port=9200)], departed, 101.0, GRACE_S) == [info(2, port=9200)]
    by_listener = BrokerInfo(2, "10.0.0.2", 9300, listeners=(("EXTERNAL", "10.0.0.1", 9200),))
    assert with_departed([by_listener], departed, 101.0, GRACE_S) == [by_listener]


def test_a_live_registration_wins_over_a_departure_of_the_same_id() -> None:
    again = info(1, host="10.0.0.2")
    departed = {1: Departure(info(1), at=100.0)}
    assert with_departed([again], departed, 101.0, GRACE_S) == [again]


@given(
    registries,
    registries,
    st.floats(0, 100),
    st.floats(0, 60),
)
def test_the_departed_only_add_to_the_live_list(
    live_by_id: dict[int, BrokerInfo],
    gone_by_id: dict[int, BrokerInfo],
    age_s: float,
    grace_s: float,
) -> None:
    live = sorted(live_by_id.values(), key=lambda b: b.node_id)
    departed = {i: Departure(b, at=0.0) for i, b in gone_by_id.items()}
    listed = with_departed(live, departed, age_s, grace_s)
    ids = [b.node_id for b in listed]
    assert ids == sorted(set(ids))
    assert all(b in listed for b in live)  # every live broker, as registered
    live_addresses = {(b.host, b.port) for b in live}
    for b in listed:
        if b not in live:
            assert age_s < grace_s and (b.host, b.port) not in live_addresses
