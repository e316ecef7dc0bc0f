"""A minimal blocking Kafka connection for tests that must bypass client-side routing.

Real clients send a produce only to the partition's leader; fencing tests need to send the
same partition's produce to several brokers at once, and to keep a request in flight while a
broker is frozen. Requests are built with the broker's own codec (kio underneath).
"""

from __future__ import annotations

import socket
import struct
from typing import Any

from kafscale.broker.protocol import codec

PRODUCE, FETCH, LIST_OFFSETS = 0, 1, 2


class RawKafka:
    def __init__(self, bootstrap: str, timeout_s: float = 30.0) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self._sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self._correlation = 0

    def close(self) -> None:
        self._sock.close()

    def send(self, api_key: int, version: int, body: dict[str, Any]) -> int:
        self._correlation += 1
        self._sock.sendall(codec.encode_request(api_key, version, self._correlation, body))
        return self._correlation

    def receive(self, api_key: int, version: int) -> Any:
        (length,) = struct.unpack(">i", self._recv_exactly(4))
        frame = self._recv_exactly(length)
        return codec.decode_response(frame, api_key, version)

    def _recv_exactly(self, size: int) -> bytes:
        chunks = []
        while size:
            chunk = self._sock.recv(size)
            if not chunk:
                raise ConnectionError("connection closed")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def produce(self, topic: str, partition: int, batch: bytes, acks: int = -1) -> Any:
        self.send_produce(topic, partition, batch, acks)
        return self.receive(PRODUCE, 9)

    def send_produce(self, topic: str, partition: int, batch: bytes, acks: int = -1) -> int:
        body = {
            "acks": acks,
            "timeout": 30_000,
            "topic_data": [
                {"name": topic, "partition_data": [{"index": partition, "records": batch}]}
            ],
        }
        return self.send(PRODUCE, 9, body)


def produce_result(response: Any) -> tuple[int, int]:
    """(error code, base offset) of the single partition in a produce response."""
    partition = response.responses[0].partition_responses[0]
    return int(partition.error_code), int(partition.base_offset)
