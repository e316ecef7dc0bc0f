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

An Envelope (KIP-590, API 58) is ordered as the request it carries: the proxy forwards every
request of a client inside one by default, on one broker connection per client connection, so
a client's DeleteRecords and the ListOffsets behind it arrive as two Envelopes.
"""

from __future__ import annotations

import struct

from kafscale.broker.protocol.guard import MalformedRequest, read_uvarint
from kafscale.broker.security.forwarding import ENVELOPE_KEY

_INT16 = struct.Struct(">h")
_HEADER_FIXED_BYTES = 8  # api key, api version, correlation id

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
    if len(frame) < 2:
        return False
    api_key = int.from_bytes(frame[:2], "big")
    if api_key == ENVELOPE_KEY:
        return enveloped_api_key(frame) in ORDERED_API_KEYS
    return api_key in ORDERED_API_KEYS


def enveloped_api_key(frame: memoryview | bytes) -> int | None:
    """The api key of the request inside an Envelope frame (None when it cannot be read: the
    Envelope's handler then answers INVALID_REQUEST, ordered or not). Reads only as far as that
    key: header v2 (client id, tagged fields), then the start of ``request_data`` (compact
    bytes), the Envelope's first field; the carried request is never copied."""
    view = memoryview(frame)
    try:
        (client_id_bytes,) = _INT16.unpack_from(view, _HEADER_FIXED_BYTES)
        position = _HEADER_FIXED_BYTES + _INT16.size + max(client_id_bytes, 0)
        tagged_fields, position = read_uvarint(view, position)
        for _ in range(tagged_fields):
            _tag, position = read_uvarint(view, position)
            size, position = read_uvarint(view, position)
            position += size
        data_bytes_plus_one, position = read_uvarint(view, position)
        if data_bytes_plus_one < 1 + _INT16.size:
            return None  # null or too short to hold an api key
        (api_key,) = _INT16.unpack_from(view, position)
    except (struct.error, MalformedRequest):
        return None
    return int(api_key)
