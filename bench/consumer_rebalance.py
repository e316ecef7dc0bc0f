"""A member joining a group of 10 under produce: the consumer protocol (KIP-848) versus classic.

Starts etcd, moto's S3 server and one ``kafscale broker``, and for each protocol in one run —
classic with eager ``range`` (stop-the-world), classic with ``cooperative-sticky``, and the
consumer protocol (``group.protocol=consumer``, server-side ``uniform``) — creates a topic of
``--partitions`` partitions (default 20), produces to every partition at ``--rate`` records/s,
forms a group of ``--members`` confluent-kafka (librdkafka) consumers, waits until it is steady,
then starts one more member and reports:

* first record: from the new member's start to the first record it reads (target: within 1 s);
* settled: until the N+1 members own every partition once;
* paused kept partitions: (member, partition) pairs revoked during the rebalance from a member
  that owns the partition again afterwards (target: none: nobody stops consuming what it keeps);
* longest gap on kept partitions: the longest time between two records of a partition its member
  kept throughout, from the join to one second after it settled (records arrive every
  ``partitions / rate`` seconds per partition, plus polling).

Heartbeats every ``--heartbeat-ms`` for both protocols (classic: the members' setting; consumer:
the broker's ``group.consumer.heartbeat.interval.ms``), classic initial rebalance delay 3 s.

Run from the repository root::

    .venv/bin/python bench/consumer_rebalance.py            # ~1 minute on 2 cores
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from _cluster import Stack, create_topic, verdict, wait_for

QUIET = 2


@dataclass
class Member(threading.Thread):
    label: str
    config: dict[str, Any]
    topic: str
    owned: set[int] = field(default_factory=set)
    revoked: list[tuple[float, int]] = field(default_factory=list)
    records: list[tuple[float, int]] = field(default_factory=list)
    started_at: float = 0.0
    stopping: threading.Event = field(default_factory=threading.Event)
    failure: BaseException | None = None

    def __post_init__(self) -> None:
        threading.Thread.__init__(self, name=self.label, daemon=True)

    def __hash__(self) -> int:
        return id(self)

    def run(self) -> None:
        from confluent_kafka import Consumer

        try:
            self.started_at = time.monotonic()
            consumer = Consumer(self.config)
            consumer.subscribe(
                [self.topic],
                on_assign=self._assigned,
                on_revoke=self._revoked,
                on_lost=self._revoked,
            )
            while not self.stopping.is_set():
                message = consumer.poll(0.02)
                if message is not None and message.error() is None:
                    self.records.append((time.monotonic(), message.partition()))
            consumer.close()
        except BaseException as exc:
            self.failure = exc
            raise

    def _assigned(self, _consumer: Any, partitions: list[Any]) -> None:
        self.owned |= {tp.partition for tp in partitions}

    def _revoked(self, _consumer: Any, partitions: list[Any]) -> None:
        now = time.monotonic()
        for tp in partitions:
            self.revoked.append((now, tp.partition))
            self.owned.discard(tp.partition)


class Feed(threading.Thread):
    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 2})
        self.topic, self.partitions, self.interval_s = topic, partitions, 1 / rate
        self.halt = threading.Event()

    def run(self) -> None:
        sent = 0
        while not self.halt.is_set():
            self.producer.produce(self.topic, value=b"x", partition=sent % self.partitions)
            sent += 1
            self.producer.poll(0)
            time.sleep(self.interval_s)
        self.producer.flush(30)


def covered(members: list[Member], partitions: int) -> bool:
    owned = [p for m in members for p in m.owned]
    return sorted(owned) == list(range(partitions)) and all(m.owned for m in members)


def config(bootstrap: str, group: str, protocol: str, args: argparse.Namespace) -> dict[str, Any]:
    base: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "latest",
        "enable.auto.commit": True,
        "log_level": QUIET,
    }
    if protocol == "consumer":
        return {**base, "group.protocol": "consumer"}
    strategy = "range" if protocol == "classic-eager" else "cooperative-sticky"
    return {
        **base,
        "partition.assignment.strategy": strategy,
        "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": args.heartbeat_ms,
    }


def measure(stack: Stack, protocol: str, args: argparse.Namespace) -> dict[str, float]:
    bootstrap = stack.live_brokers[0].bootstrap
    topic, group = f"join-{protocol}", f"g-{protocol}"
    create_topic(bootstrap, topic, args.partitions)
    feed = Feed(bootstrap, topic, args.partitions, args.rate)
    feed.start()
    members = [
        Member(f"{protocol}-{i}", config(bootstrap, group, protocol, args), topic)
        for i in range(args.members)
    ]
    joining = Member(f"{protocol}-new", config(bootstrap, group, protocol, args), topic)
    try:
        for member in members:
            member.start()
        wait_for(lambda: covered(members, args.partitions), 60, "the group to form")
        time.sleep(2)  # steady consumption
        before = {m.label: set(m.owned) for m in members}
        began = time.monotonic()
        joining.start()
        everyone = [*members, joining]
        wait_for(lambda: joining.records, 30, "the new member's first record")
        first_s = joining.records[0][0] - began
        wait_for(lambda: covered(everyone, args.partitions), 30, "the group to settle")
        settled_s = time.monotonic() - began
        time.sleep(1)
        window_end = began + settled_s + 1
        paused, gap_s = 0, 0.0
        for member in members:
            kept = before[member.label] & member.owned
            paused += sum(1 for t, p in member.revoked if t >= began and p in member.owned)
            for p in kept:
                times = [began] + [
                    t for t, q in member.records if q == p and began <= t <= window_end
                ]
                times.append(window_end)
                gap_s = max(gap_s, max(b - a for a, b in itertools.pairwise(times)))
        return {"first": first_s, "settled": settled_s, "paused": paused, "gap": gap_s}
    finally:
        feed.halt.set()
        for member in [*members, joining]:
            member.stopping.set()
        for member in [*members, joining]:
            if member.is_alive():
                member.join(30)
        feed.join(30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--members", type=int, default=10)
    p.add_argument("--partitions", type=int, default=20)
    p.add_argument("--rate", type=float, default=400, help="records/s over all partitions")
    p.add_argument("--heartbeat-ms", type=int, default=500)
    args = p.parse_args(argv)
    env = {
        "KAFSCALE_GROUPS__INITIAL_REBALANCE_DELAY_MS": "3000",
        "KAFSCALE_GROUPS__MIN_SESSION_TIMEOUT_MS": "1000",
        "KAFSCALE_GROUPS__CONSUMER_HEARTBEAT_INTERVAL_MS": str(args.heartbeat_ms),
        "KAFSCALE_GROUPS__CONSUMER_SESSION_TIMEOUT_MS": "10000",
    }
    with Stack(cluster="kip848", broker_env=env) as stack:
        stack.start_broker()
        print(
            f"a member joins a group of {args.members} (librdkafka), {args.partitions} "
            f"partitions, {args.rate:.0f} records/s, heartbeat {args.heartbeat_ms} ms; "
            f"load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        print(f"  {'protocol':<20} {'first record':>12} {'settled':>8} {'paused kept':>11} "
              f"{'longest gap on kept':>20}")  # fmt: skip
        results = {}
        for protocol in ("classic-eager", "classic-cooperative", "consumer"):
            r = results[protocol] = measure(stack, protocol, args)
            print(
                f"  {protocol:<20} {r['first']:>10.2f} s {r['settled']:>6.2f} s "
                f"{int(r['paused']):>11d} {r['gap']:>18.2f} s",
                flush=True,
            )
    kip848 = results["consumer"]
    print(f"consumer protocol: new member reads within 1 s: {verdict(kip848['first'] <= 1.0)}; "
          f"no member pauses a partition it keeps: {verdict(kip848['paused'] == 0)}")  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
