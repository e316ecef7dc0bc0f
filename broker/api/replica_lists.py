"""Kafka's check of a manual replica list (CreateTopics, CreatePartitions,
AlterPartitionReassignments): pure, in a module of its own so that the proxy, which checks
reassignments against its own view (``api/replicas.py``), need not load the admin handlers."""

from __future__ import annotations

from kafscale.broker.protocol.errors import ErrorCode, KafkaError


def check_replica_list(brokers: list[int], live: set[int]) -> None:
    """Kafka's check of one partition's manual replica list: one or more distinct brokers,
    each registered (CreateTopics, CreatePartitions, AlterPartitionReassignments)."""
    if not brokers or len(set(brokers)) != len(brokers):
        raise KafkaError(
            "each partition needs one or more distinct brokers",
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        )
    unknown = sorted(set(brokers) - live)
    if unknown:
        raise KafkaError(
            f"the assignment names brokers that are not registered: {unknown}",
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        )
