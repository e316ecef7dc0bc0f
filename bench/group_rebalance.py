"""How long a consumer group takes to become stable: formation, a join, a graceful leave.

Starts etcd, moto's S3 server and ``--brokers`` ``kafscale broker`` processes (default 2), creates
a topic of ``--partitions`` partitions (default 2 per member), then runs ``--members`` confluent-
kafka consumers (default 10, librdkafka, eager ``range`` assignment, heartbeat every
``--heartbeat-ms``) spread over the brokers, each on its own thread, and times:

* formation: all N members start at once -> the last of them receives its assignment. The
  coordinator waits ``group.initial.rebalance.delay.ms`` (``--delay-ms``, default 3000 as in
  Kafka) and, exactly as Kafka does, one more delay when further members arrive during the
  first (bounded by the rebalance timeout): expect about twice the delay;
* join: one more member starts while N-1 are stable -> every member holds its new assignment;
* leave: one of N stable members closes (LeaveGroup) -> the N-1 others hold their new
  assignment.

"Stable" means: every member has received its assignment of the new generation, the
assignments are disjoint and cover every partition, and DescribeGroups says Stable with the
expected member count. Each figure is taken ``--reps`` times (default 3).

Run from the repository root::

    .venv/bin/python bench/group_rebalance.py                 # ~1 minute on 2 cores
    .venv/bin/python bench/group_rebalance.py --members 20 --delay-ms 1000 --reps 5
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from _cluster import RawKafka, Stack, create_topic, percentile, verdict, wait_for

TOPIC = "rebalance"
GROUP = "bench-group"


@dataclass
class BenchMember(threading.Thread):
    """One confluent-kafka consumer polling on its own thread, noting when it was assigned."""

    label: str
    config: dict[str, Any]
    assignment: frozenset[int] = frozenset()
    assigned_at: float = 0.0
    ready: threading.Event = field(default_factory=threading.Event)
    stopping: threading.Event = field(default_factory=threading.Event)
    failure: BaseException | None = None

    def __post_init__(self) -> None:
        threading.Thread.__init__(self, name=self.label, daemon=True)

    def __hash__(self) -> int:
        return id(self)

    def run(self) -> None:
        from confluent_kafka import Consumer

        try:
            consumer = Consumer(self.config)
            consumer.subscribe([TOPIC], on_assign=self._assigned, on_revoke=self._revoked)
            self.ready.set()
            while not self.stopping.is_set():
                consumer.poll(0.02)
            consumer.close()  # revokes and sends LeaveGroup
        except BaseException as exc:
            self.failure = exc
            raise

    def _assigned(self, _consumer: Any, partitions: list[Any]) -> None:
        self.assignment = frozenset(tp.partition for tp in partitions)
        self.assigned_at = time.monotonic()

    def _revoked(self, _consumer: Any, _partitions: list[Any]) -> None:
        self.assignment = frozenset()

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


def member_config(bootstrap: str, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": GROUP,
        "client.id": "bench",
        "auto.offset.reset": "earliest",
        "session.timeout.ms": args.session_ms,
        "heartbeat.interval.ms": args.heartbeat_ms,
        "log_level": 2,
    }


def describe(bootstrap: str) -> tuple[str, int]:
    """(state, member count) of the group, asked of its coordinator."""
    probe = RawKafka(bootstrap, timeout_s=5)
    try:
        found = probe.request(10, 3, {"key": GROUP, "key_type": 0})
    finally:
        probe.close()
    coordinator = RawKafka(f"{found.host}:{found.port}", timeout_s=5)
    try:
        group = coordinator.request(15, 5, {"groups": [GROUP]}).groups[0]
    finally:
        coordinator.close()
    return str(group.group_state), len(group.members)


def stable_after(
    members: list[BenchMember], since: float, partitions: int, bootstrap: str, timeout_s: float
) -> float:
    """Seconds from ``since`` until every member holds its part of one complete assignment."""

    def settled() -> bool:
        assignments = [m.assignment for m in members]
        if not all(assignments) or any(m.assigned_at < since for m in members):
            return False
        union = frozenset().union(*assignments)
        if union != frozenset(range(partitions)) or sum(map(len, assignments)) != partitions:
            return False
        return describe(bootstrap) == ("Stable", len(members))

    wait_for(settled, timeout_s, "a stable group")
    return max(m.assigned_at for m in members) - since


def run(stack: Stack, args: argparse.Namespace) -> dict[str, list[float]]:
    brokers = stack.live_brokers
    bootstrap = brokers[0].bootstrap
    create_topic(bootstrap, TOPIC, args.partitions)
    timeout_s = 2 * args.delay_ms / 1000 + 60
    figures: dict[str, list[float]] = {"formation": [], "join": [], "leave": []}
    counter = 0

    def new_member() -> BenchMember:
        nonlocal counter
        counter += 1
        broker = brokers[counter % len(brokers)]
        return BenchMember(f"m{counter}", member_config(broker.bootstrap, args))

    for rep in range(args.reps):
        members = [new_member() for _ in range(args.members)]
        began = time.monotonic()
        for member in members:
            member.start()
        figures["formation"].append(
            stable_after(members, began, args.partitions, bootstrap, timeout_s)
        )
        leaving = members.pop(rep % len(members))
        time.sleep(1)
        began = time.monotonic()
        leaving.stop()
        figures["leave"].append(stable_after(members, began, args.partitions, bootstrap, timeout_s))
        time.sleep(1)
        joining = new_member()
        began = time.monotonic()
        joining.start()
        members.append(joining)
        figures["join"].append(stable_after(members, began, args.partitions, bootstrap, timeout_s))
        print(
            f"  rep {rep + 1}: formation {figures['formation'][-1]:.2f} s, "
            f"leave {figures['leave'][-1]:.2f} s, join {figures['join'][-1]:.2f} s",
            flush=True,
        )
        for member in members:
            member.stopping.set()
        for member in members:
            member.join(30)
        failed = [m for m in members if m.failure is not None]
        if failed:
            raise RuntimeError(f"member {failed[0].label} failed: {failed[0].failure!r}")
        wait_for(lambda: describe(bootstrap) == ("Empty", 0), 30, "the group to empty")
    return figures


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--members", type=int, default=10, help="group size N (default 10)")
    p.add_argument("--brokers", type=int, default=2, help="broker processes (default 2)")
    p.add_argument("--partitions", type=int, default=0, help="topic partitions (default 2N)")
    p.add_argument("--delay-ms", type=int, default=3000, help="initial rebalance delay")
    p.add_argument("--heartbeat-ms", type=int, default=500, help="members' heartbeat interval")
    p.add_argument("--session-ms", type=int, default=10_000, help="members' session timeout")
    p.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    p.add_argument("--keep", action="store_true", help="keep the work dir (broker logs)")
    args = p.parse_args(argv)
    args.partitions = args.partitions or 2 * args.members
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = {
        "KAFSCALE_GROUPS__INITIAL_REBALANCE_DELAY_MS": str(args.delay_ms),
        "KAFSCALE_GROUPS__MIN_SESSION_TIMEOUT_MS": "1000",
        "KAFSCALE_ETCD__SESSION_TTL_S": "4",
    }
    began = time.perf_counter()
    with Stack(cluster="groups", broker_env=env, keep_workdir=args.keep) as stack:
        print(f"work dir {stack.workdir}; load average {os.getloadavg()[0]:.2f}", flush=True)
        for _ in range(args.brokers):
            stack.start_broker()
        print(
            f"group of {args.members} confluent-kafka members over {args.brokers} brokers, "
            f"{args.partitions} partitions, initial delay {args.delay_ms} ms, heartbeat "
            f"{args.heartbeat_ms} ms, {args.reps} reps",
            flush=True,
        )
        figures = run(stack, args)
    delay_s = args.delay_ms / 1000
    print(f"\nstabilisation times (s) of a group of {args.members}, p50 / max:")
    for name, target_s, rule in (
        ("formation", 2 * delay_s + 1, "2 x initial delay + 1 s (Kafka extends the delay once)"),
        ("join", delay_s + 1, "initial delay + 1 s"),
        ("leave", 1.0, "1 s"),
    ):
        values = figures[name]
        worst = max(values)
        print(
            f"  {name:<9} {percentile(values, 50):6.2f} / {worst:6.2f}   "
            f"target {target_s:.1f} ({rule}): {verdict(worst <= target_s)}"
        )
    print(f"total {time.perf_counter() - began:.0f} s; load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
