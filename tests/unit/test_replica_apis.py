"""ElectLeaders, AlterPartitionReassignments and ListConfigResources decisions: replicas are
the lease owner, elections are never needed while a broker can lead, reassignments complete
when accepted."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kafscale.broker.api.config_resources import config_resources
from kafscale.broker.api.replicas import (
    PREFERRED,
    UNCLEAN,
    alter_reassignments_body,
    elect_leaders_body,
    election_result,
    reassignment_result,
)
from kafscale.broker.protocol.errors import ErrorCode, KafkaError

COUNTS = {"t": 2, "u": 1}


def test_a_led_partition_needs_no_election() -> None:
    assert election_result(PREFERRED, COUNTS, "t", 1, 4)[0] == ErrorCode.ELECTION_NOT_NEEDED
    assert election_result(UNCLEAN, COUNTS, "t", 1, 4)[0] == ErrorCode.ELECTION_NOT_NEEDED


def test_no_broker_to_lead_is_the_election_types_own_error() -> None:
    preferred = election_result(PREFERRED, COUNTS, "t", 0, -1)
    unclean = election_result(UNCLEAN, COUNTS, "t", 0, -1)
    assert preferred[0] == ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE
    assert unclean[0] == ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE
    assert "session TTL" in (unclean[1] or "")


def test_unknown_topic_or_partition() -> None:
    assert election_result(PREFERRED, COUNTS, "x", 0, 1)[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert election_result(PREFERRED, COUNTS, "t", 2, 1)[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert election_result(PREFERRED, COUNTS, "t", -1, 1)[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def _elect(topic_partitions: list[tuple[str, list[int]]] | None, election_type: int = 0) -> Any:
    return SimpleNamespace(
        election_type=election_type,
        topic_partitions=None
        if topic_partitions is None
        else [SimpleNamespace(topic=t, partitions=ps) for t, ps in topic_partitions],
    )


def test_all_partitions_leave_out_those_that_needed_no_election() -> None:
    leaders = {("t", 0): 1, ("t", 1): -1, ("u", 0): 2}
    body = elect_leaders_body(_elect(None, UNCLEAN), COUNTS, leaders.__getitem__)
    results = {r["topic"]: r["partition_result"] for r in body["replica_election_results"]}
    assert results["u"] == []
    assert [(p["partition_id"], p["error_code"]) for p in results["t"]] == [
        (1, ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE)
    ]


def test_named_partitions_are_all_answered() -> None:
    body = elect_leaders_body(_elect([("t", [0, 1]), ("x", [0])]), COUNTS, lambda _tp: 1)
    answered = [
        (r["topic"], p["partition_id"], p["error_code"])
        for r in body["replica_election_results"]
        for p in r["partition_result"]
    ]
    assert answered == [
        ("t", 0, ErrorCode.ELECTION_NOT_NEEDED),
        ("t", 1, ErrorCode.ELECTION_NOT_NEEDED),
        ("x", 0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    ]


def test_an_unknown_election_type_is_invalid_request() -> None:
    with pytest.raises(KafkaError) as raised:
        elect_leaders_body(_elect(None, 7), COUNTS, lambda _tp: 1)
    assert raised.value.code == ErrorCode.INVALID_REQUEST


@pytest.mark.parametrize(
    ("topic", "index", "replicas", "allow", "expected"),
    [
        ("t", 0, [1], True, ErrorCode.NONE),
        ("t", 0, [2, 1], True, ErrorCode.NONE),
        ("t", 0, [2, 1], False, ErrorCode.INVALID_REPLICATION_FACTOR),
        ("t", 0, [2], False, ErrorCode.NONE),
        ("t", 0, [], True, ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        ("t", 0, [1, 1], True, ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        ("t", 0, [9], True, ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        ("t", 0, None, True, ErrorCode.NO_REASSIGNMENT_IN_PROGRESS),
        ("t", 5, [1], True, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        ("x", 0, [1], True, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    ],
)
def test_reassignments_are_checked_as_kafka_checks_them(
    topic: str, index: int, replicas: list[int] | None, allow: bool, expected: ErrorCode
) -> None:
    assert reassignment_result(COUNTS, topic, index, replicas, {1, 2}, allow)[0] == expected


def test_the_answer_echoes_the_replication_factor_flag() -> None:
    request = SimpleNamespace(
        allow_replication_factor_change=False,
        topics=[
            SimpleNamespace(name="t", partitions=[SimpleNamespace(partition_index=0, replicas=[1])])
        ],
    )
    body = alter_reassignments_body(request, COUNTS, {1})
    assert body["allow_replication_factor_change"] is False
    assert body["responses"][0]["partitions"][0]["error_code"] == ErrorCode.NONE


def test_config_resources_by_type() -> None:
    every = config_resources(1, [], ["b", "a"], [3, 1])
    assert every == [
        {"resource_name": "a", "resource_type": 2},
        {"resource_name": "b", "resource_type": 2},
        {"resource_name": "1", "resource_type": 4},
        {"resource_name": "3", "resource_type": 4},
    ]
    assert config_resources(1, [4], ["a"], [1]) == [{"resource_name": "1", "resource_type": 4}]
    assert config_resources(1, [16, 32, 8], ["a"], [1]) == []
    # Groups: those with their own configs (KIP-848).
    assert config_resources(1, [32], ["a"], [1], ["g2", "g1"]) == [
        {"resource_name": "g1", "resource_type": 32},
        {"resource_name": "g2", "resource_type": 32},
    ]
    assert config_resources(0, [], ["a"], [1]) == []  # v0: client metrics only
    with pytest.raises(KafkaError) as raised:
        config_resources(1, [64], ["a"], [1])
    assert raised.value.code == ErrorCode.UNSUPPORTED_VERSION
