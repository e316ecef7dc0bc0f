"""Consumer-group tests' shared pieces: a producer thread feeding numbered records while members
join and leave, and a wait that fails at once when a member thread crashed.

Both the classic-group tests (kafka-python, aiokafka, confluent-kafka) and the consumer-protocol
(KIP-848) tests check "nothing lost" the same way: record values are sequence numbers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer

QUIET = 2
"""librdkafka log level: critical only (brokers are killed on purpose in these tests)."""


def wait_for(
    check: Callable[[], bool], timeout_s: float, what: str, state: Callable[[], str] | None = None
) -> None:
    """Poll ``check`` until it holds. A thread that recorded an exception in ``crashed`` (a
    group member) fails the wait at once; after ``timeout_s`` it fails naming ``what`` and,
    when given, ``state()``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        crashed = [t for t in threading.enumerate() if getattr(t, "crashed", None) is not None]
        assert not crashed, f"{crashed[0].name} crashed: {crashed[0].crashed!r}"  # type: ignore[attr-defined]
        if time.monotonic() > deadline:
            detail = f"; {state()}" if state is not None else ""
            raise AssertionError(f"timed out waiting for {what}{detail}")
        time.sleep(0.05)


class Feed(threading.Thread):
    """Produces numbered records (value = sequence number) until stopped; ``acked`` holds the
    values delivered, ``failed`` the deliveries that failed. ``config`` adds to (or overrides)
    the producer's settings."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        rate_per_s: float = 200,
        config: dict[str, Any] | None = None,
        flush_timeout_s: float = 30,
    ) -> None:
        super().__init__(daemon=True)
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 5,
                "acks": "all",
                "log_level": QUIET,
                **(config or {}),
            }
        )
        self.topic = topic
        self.interval_s = 1 / rate_per_s
        self.flush_timeout_s = flush_timeout_s
        self.sent = 0
        self.acked: list[int] = []
        self.failed: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.producer.produce(
                self.topic, value=str(self.sent).encode(), on_delivery=self._delivered
            )
            self.sent += 1
            self.producer.poll(0)
            time.sleep(self.interval_s)
        assert self.producer.flush(self.flush_timeout_s) == 0

    def _delivered(self, error: Any, message: Any) -> None:
        if error is not None:
            self.failed.append(str(error))
        else:
            self.acked.append(int(message.value()))

    def produce(self, count: int) -> None:
        """``count`` more numbered records at once (without starting the thread)."""
        for _ in range(count):
            self.producer.produce(self.topic, value=str(self.sent).encode())
            self.sent += 1
        assert self.producer.flush(30) == 0

    def stop(self, timeout_s: float = 40) -> None:
        self._halt.set()
        self.join(timeout_s)
