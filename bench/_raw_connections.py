"""Raw Kafka connections to a bench's brokers: one per broker, opened on first use and dropped
when the broker goes away (a stopped or killed one), so a probe that follows ownership or a
coordinator across a stop always talks to the broker it means (``handoff.py``,
``group_stop_handoff.py``)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from _cluster import BrokerProcess, RawKafka


@dataclass
class RawConnections:
    """Connections by node id; ``timeout_s`` bounds each connect and answer."""

    timeout_s: float = 30.0
    connections: dict[int, RawKafka] = field(default_factory=dict)

    def connection(self, broker: BrokerProcess) -> RawKafka:
        conn = self.connections.get(broker.node_id)
        if conn is None:
            conn = self.connections[broker.node_id] = RawKafka(broker.bootstrap, self.timeout_s)
        return conn

    def request(self, broker: BrokerProcess, api_key: int, version: int, body: Any) -> Any:
        """The answer, or None when the broker cannot be reached (its connection is dropped)."""
        try:
            return self.connection(broker).request(api_key, version, body)
        except OSError:
            self.drop(broker.node_id)
            return None

    def drop(self, node_id: int) -> None:
        conn = self.connections.pop(node_id, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.close()

    def close(self) -> None:
        for node_id in list(self.connections):
            self.drop(node_id)
