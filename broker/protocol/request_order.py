"""Which requests a connection runs alone, in order with the requests around them.

A connection runs its requests concurrently (a produce waits for its upload; the next request
need not), but Kafka's protocol promises more: requests on one connection are processed in the
order they were sent. Clients rely on it for admin writes: confluent-kafka's AdminClient sends
DeleteRecords and then, without waiting, ListOffsets for the new log start on the same
connection, and expects the answer after the deletion (run concurrently, ListOffsets answered
first with the old start). So a request that changes what later requests read about topics,
configs, groups, ACLs or users starts only once every earlier request of its connection is
done, and the requests after it only once it is. Produce, Fetch, offset commits and group
heartbeats stay concurrent: pipelining them is what the concurrency is for, and clients wait
for those answers before depending on them.
"""

from __future__ import annotations

ORDERED_API_KEYS = frozenset(
    {
        19,  # CreateTopics
        20,  # DeleteTopics
        21,  # DeleteRecords
        30,  # CreateAcls
        31,  # DeleteAcls
        33,  # AlterConfigs
        37,  # CreatePartitions
        42,  # DeleteGroups
        43,  # ElectLeaders
        44,  # IncrementalAlterConfigs
        45,  # AlterPartitionReassignments
        47,  # OffsetDelete
        51,  # AlterUserScramCredentials
    }
)


def runs_alone(frame: memoryview | bytes) -> bool:
    """Whether the request in ``frame`` (header first, without the length prefix) is one that
    runs after the earlier requests of its connection and before the later ones."""
    return len(frame) >= 2 and int.from_bytes(frame[:2], "big") in ORDERED_API_KEYS
