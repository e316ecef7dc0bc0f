"""A raw-socket Kafka connection for bad-input tests: frames as bytes, nothing hidden.

Well-formed requests and responses go through the broker's own codec
(``kafscale.broker.protocol.codec``, kio underneath); everything else is plain bytes, so a test
can send garbage, lie about a frame's length, pipeline requests without reading, or check that
the broker closed the connection.
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, get_args, get_origin, get_type_hints

from kafscale.broker.protocol import codec, guard
from kafscale.broker.protocol.errors import ErrorCode

PRODUCE, FETCH, LIST_OFFSETS, METADATA, API_VERSIONS = 0, 1, 2, 3, 18

uvarint = guard.encode_uvarint  # Kafka's unsigned varint: compact lengths, counts, tags

_LENGTH = struct.Struct(">i")


class KafkaWire:
    """One blocking TCP connection to a broker."""

    def __init__(self, bootstrap: str, timeout_s: float = 15.0) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._next_correlation = 1000

    def __enter__(self) -> KafkaWire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    # --- bytes -------------------------------------------------------------------------------

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, payload: bytes) -> None:
        """``payload`` with a correct length prefix."""
        self.sock.sendall(_LENGTH.pack(len(payload)) + payload)

    def recv_frame(self) -> bytes:
        """The next response frame without its length prefix (ConnectionError on EOF)."""
        (length,) = _LENGTH.unpack(self._recv_exactly(_LENGTH.size))
        return self._recv_exactly(length)

    def _recv_exactly(self, size: int) -> bytes:
        chunks = []
        while size:
            chunk = self.sock.recv(size)
            if not chunk:
                raise ConnectionError("connection closed by the broker")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def is_closed_by_peer(self, timeout_s: float = 10.0) -> bool:
        """True once the broker has closed the connection (EOF or reset) within ``timeout_s``.

        Any response bytes that arrive first are read and dropped.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                return False
            except (ConnectionResetError, BrokenPipeError):
                return True
            if not chunk:
                return True
        return False

    # --- requests ----------------------------------------------------------------------------

    def next_correlation_id(self) -> int:
        self._next_correlation += 1
        return self._next_correlation

    def send(self, api_key: int, version: int, body: Any, correlation_id: int | None = None) -> int:
        """Encode and send a request; returns its correlation id."""
        correlation_id = self.next_correlation_id() if correlation_id is None else correlation_id
        self.sock.sendall(codec.encode_request(api_key, version, correlation_id, body))
        return correlation_id

    def recv(self, api_key: int, version: int) -> tuple[int, Any]:
        """(correlation id, decoded body) of the next response."""
        frame = self.recv_frame()
        return correlation_id_of(frame), codec.decode_response(frame, api_key, version)

    def request(self, api_key: int, version: int, body: Any) -> Any:
        sent = self.send(api_key, version, body)
        received, response = self.recv(api_key, version)
        assert received == sent, f"response to {received}, expected {sent}"
        return response


def correlation_id_of(response_frame: bytes) -> int:
    """Every response header starts with the correlation id (i32)."""
    return int(_LENGTH.unpack_from(response_frame, 0)[0])


def request_header(api_key: int, version: int, correlation_id: int, client_id: str = "t") -> bytes:
    """A non-flexible (v1) request header: enough to name a request whose body is garbage."""
    name = client_id.encode()
    return struct.pack(">hhih", api_key, version, correlation_id, len(name)) + name


def flexible_request_header(api_key: int, version: int, correlation_id: int) -> bytes:
    """A flexible (v2) request header, client id "t" and no tagged fields: for flexible
    versions, whose bodies use compact lengths."""
    return struct.pack(">hhih", api_key, version, correlation_id, 1) + b"t" + b"\x00"


def assert_invalid_request_then_served(
    wire: KafkaWire, request: bytes, api_key: int, version: int, correlation_id: int
) -> None:
    """``request`` is answered under its correlation id, with INVALID_REQUEST where the response
    has a top-level error code, and the connection goes on serving."""
    wire.send_frame(request)
    frame = wire.recv_frame()
    assert correlation_id_of(frame) == correlation_id
    response = codec.decode_response(frame, api_key, version)
    if hasattr(response, "error_code"):
        assert int(response.error_code) == ErrorCode.INVALID_REQUEST
    assert int(wire.request(API_VERSIONS, 3, {}).error_code) == ErrorCode.NONE


# --- request bodies (newest-version field names; the codec drops what a version lacks) -------


def produce_body(topic: str, partition: int, records: bytes, acks: int = -1) -> dict[str, Any]:
    return {
        "acks": acks,
        "timeout": 30_000,
        "topic_data": [
            {"name": topic, "partition_data": [{"index": partition, "records": records}]}
        ],
    }


def fetch_body(
    topic: str, partition: int, offset: int, max_wait_ms: int = 0, max_bytes: int = 1 << 20
) -> dict[str, Any]:
    return {
        "replica_id": -1,
        "max_wait": max_wait_ms,
        "min_bytes": 1,
        "max_bytes": max_bytes,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {
                "topic": topic,
                "partitions": [
                    {
                        "partition": partition,
                        "current_leader_epoch": -1,
                        "fetch_offset": offset,
                        "last_fetched_epoch": -1,
                        "log_start_offset": -1,
                        "partition_max_bytes": max_bytes,
                    }
                ],
            }
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }


def metadata_body(topics: list[str] | None, allow_auto_topic_creation: bool = True) -> Any:
    return {
        "topics": None if topics is None else [{"name": name} for name in topics],
        "allow_auto_topic_creation": allow_auto_topic_creation,
    }


def produce_partition(response: Any) -> tuple[int, int]:
    """(error code, base offset) of the one partition in a produce response."""
    partition = response.responses[0].partition_responses[0]
    return int(partition.error_code), int(partition.base_offset)


LEADER_MOVING = (5, 6, 7)  # LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT


def while_leader_moves(
    produce: Callable[[], tuple[int, int]], timeout_s: float = 60
) -> tuple[int, int]:
    """(error code, base offset) of a produce retried as a client retries it while a partition
    changes owner: nothing is written under those codes, so resending is safe."""
    deadline = time.monotonic() + timeout_s
    while True:
        code, offset = produce()
        if code not in LEADER_MOVING or time.monotonic() > deadline:
            return code, offset
        time.sleep(0.2)


def fetch_partition(response: Any) -> Any:
    """The one partition of a fetch response."""
    return response.responses[0].partitions[0]


@dataclass(frozen=True)
class BatchSummary:
    """The fixed header fields of one v2 record batch."""

    base_offset: int
    record_count: int
    attributes: int
    producer_id: int
    producer_epoch: int
    base_sequence: int

    @property
    def compression(self) -> int:
        """0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd."""
        return self.attributes & 0x07


_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")  # the 61-byte v2 batch header


def batches_in(records: bytes | None) -> list[BatchSummary]:
    """The complete v2 batches in a records field (a fetch may end with a partial one)."""
    data = records or b""
    result = []
    position = 0
    while len(data) - position >= _BATCH_HEADER.size:
        fields = _BATCH_HEADER.unpack_from(data, position)
        base_offset, batch_length = fields[0], fields[1]
        if position + 12 + batch_length > len(data):
            break
        attributes, producer_id, producer_epoch, base_sequence, count = (
            fields[5],
            fields[9],
            fields[10],
            fields[11],
            fields[12],
        )
        result.append(
            BatchSummary(base_offset, count, attributes, producer_id, producer_epoch, base_sequence)
        )
        position += 12 + batch_length
    return result


def batch_offsets(records: bytes | None) -> list[tuple[int, int]]:
    """(base offset, record count) of each complete v2 batch in a records field."""
    return [(b.base_offset, b.record_count) for b in batches_in(records)]


# --- a request of any schema with every field filled in ---------------------------------------


def sample_body(entity_type: type[Any]) -> dict[str, Any]:
    """A body with every field set: two elements in every array, text in every string, bytes in
    every bytes field, tagged fields included (they then travel in the tagged section)."""
    hints = get_type_hints(entity_type)
    return {
        field.name: _sample_value(hints[field.name], field.metadata.get("kafka_type"))
        for field in fields(entity_type)
    }


def _sample_value(annotation: Any, kafka_type: str | None) -> Any:
    args = [a for a in get_args(annotation) if a is not type(None)]
    inner = args[0] if args and get_origin(annotation) is not tuple else annotation
    if get_origin(inner) is tuple:
        item = get_args(inner)[0]
        return [_sample_value(item, kafka_type), _sample_value(item, kafka_type)]
    if is_dataclass(inner):
        return sample_body(inner)  # type: ignore[arg-type]
    if kafka_type == "string":
        return "ab"
    if kafka_type in ("bytes", "records"):
        return b"\x01\x02\x03"
    if kafka_type == "uuid":
        return uuid.UUID(int=7)
    if kafka_type == "bool":
        return True
    if kafka_type == "float64":
        return 1.5
    return 1


def heartbeat(wire: KafkaWire, group: str, member: str, epoch: int, **fields: Any) -> Any:
    """A ConsumerGroupHeartbeat v1 (KIP-848): joining at epoch 0, then with ``fields``."""
    body: dict[str, Any] = {
        "group_id": group,
        "member_id": member,
        "member_epoch": epoch,
        "rebalance_timeout": 30000 if epoch == 0 else -1,
        "subscribed_topic_names": None,
        "topic_partitions": [] if epoch == 0 else None,
        **fields,
    }
    return wire.request(68, 1, body)


def share_heartbeat(
    wire: KafkaWire, group: str, member: str, epoch: int, topic: str, **fields: Any
) -> Any:
    """A ShareGroupHeartbeat v1 (KIP-932): joining ``group`` at epoch 0, subscribed to
    ``topic``, then staying; ``fields`` replace the body's own (a bad request, say)."""
    body = {
        "group_id": group,
        "member_id": member,
        "member_epoch": epoch,
        "rack_id": None,
        "subscribed_topic_names": [topic] if epoch == 0 else None,
        **fields,
    }
    return wire.request(76, 1, body)


def share_fetch_partitions(
    wire: KafkaWire,
    group: str,
    member: str,
    epoch: int,
    partitions: Sequence[tuple[Any, int]],
    acks: Mapping[tuple[Any, int], list[Any]] | None = None,
    max_records: int = 100,
) -> Any:
    """A ShareFetch v1 (KIP-932) of ``member`` at share-session ``epoch`` (0 opens the
    session) for ``partitions`` ((topic id, index) pairs), acknowledging ``acks`` (batches by
    partition) on the way."""
    by_topic: dict[Any, list[dict[str, Any]]] = {}
    for topic_id, index in partitions:
        batches = (acks or {}).get((topic_id, index), [])
        by_topic.setdefault(topic_id, []).append(
            {"partition_index": index, "acknowledgement_batches": batches}
        )
    body = {
        "group_id": group,
        "member_id": member,
        "share_session_epoch": epoch,
        "max_wait": 0,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "max_records": max_records,
        "batch_size": max_records,
        "topics": [{"topic_id": t, "partitions": ps} for t, ps in by_topic.items()],
        "forgotten_topics_data": [],
    }
    return wire.request(78, 1, body)


def share_fetch(
    wire: KafkaWire,
    group: str,
    member: str,
    epoch: int,
    topic_id: Any,
    partitions: tuple[int, ...] = (0,),
    acks: Mapping[int, list[Any]] | None = None,
    max_records: int = 100,
) -> Any:
    """``share_fetch_partitions`` of one topic's ``partitions``, ``acks`` by partition index."""
    pairs = [(topic_id, p) for p in partitions]
    by_pair = {(topic_id, p): batches for p, batches in (acks or {}).items()}
    return share_fetch_partitions(wire, group, member, epoch, pairs, by_pair, max_records)
