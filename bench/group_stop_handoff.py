"""How long a consumer group is without a coordinator across its coordinator's graceful stop.

Starts etcd, moto's S3 server and N ``kafscale broker`` processes (default 3), a topic kept
under a light produce load (so each broker owns partitions and its stop flushes something),
then for R repetitions: a group's commits go to the broker that coordinates it (its lease is
taken there by the first commit), that broker gets SIGTERM, and a client-like probe goes on
committing: a commit refused (or a connection gone) sends it to FindCoordinator at the next
broker in turn (the stopping one included while its connection stays open, as a client's
would), then to the broker named there; after each refused commit or unusable answer it waits
``--backoff-ms`` (librdkafka's ``retry.backoff.ms``, 100 ms), as a client does, so each answer
that sends it back to the stopping broker costs what it costs a client. Per stop it prints

* ``refused``: SIGTERM (or ``POST /drain``) -> the first commit the stopping coordinator refused;
* ``gap``: that refusal -> the first commit acked by the new coordinator: the time the group
  had no coordinator a client could reach;
* ``self-named``: FindCoordinator answers after the refusal that named the stopping broker
  (asked there / asked elsewhere): each sends a client back to a broker that refuses it.

Then a new broker is started to keep the count. ``--mode drain`` sends ``POST /drain`` (the
pod's preStop hook, which runs before SIGTERM) instead of SIGTERM, on a thread while the probe
goes on (the figures are then from that request), and stops the drained broker afterwards. Compare
versions by running it with ``PYTHONPATH`` at another tree's ``src`` (the brokers it starts
import from there)::

    .venv/bin/python bench/group_stop_handoff.py                 # ~1 minute on 2 cores
    .venv/bin/python bench/group_stop_handoff.py --reps 10 --brokers 2
    .venv/bin/python bench/group_stop_handoff.py --mode drain
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from _cluster import BrokerProcess, Stack, create_topic, percentile, wait_for
from _raw_connections import RawConnections

TOPIC = "group-stop-load"
OFFSET_COMMIT, FIND_COORDINATOR = 8, 10
NONE = 0


@dataclass
class Stop:
    old_node: int
    new_node: int
    refused_s: float
    gap_s: float
    named_at_stopping: int
    named_elsewhere: int
    finds: int
    drain_answered_s: float | None = None  # --mode drain: when POST /drain answered


def commit(probe: RawConnections, broker: BrokerProcess, group: str, offset: int) -> int:
    """A simple commit's error code (-1: the broker could not be reached)."""
    partition = {"partition_index": 0, "committed_offset": offset}
    body = {
        "group_id": group,
        "generation_id_or_member_epoch": -1,
        "member_id": "",
        "topics": [{"name": TOPIC, "partitions": [partition]}],
    }
    answer = probe.request(broker, OFFSET_COMMIT, 8, body)
    return -1 if answer is None else int(answer.topics[0].partitions[0].error_code)


def find(probe: RawConnections, broker: BrokerProcess, group: str) -> tuple[int, int] | None:
    answer = probe.request(broker, FIND_COORDINATOR, 3, {"key": group, "key_type": 0})
    return None if answer is None else (int(answer.error_code), int(answer.node_id))


@dataclass
class DrainCall:
    """``POST /drain`` on a thread, as the preStop hook sends it while clients go on."""

    broker: BrokerProcess
    answered_at: float | None = None
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="drain", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with contextlib.suppress(Exception):
            self.broker.http("POST", "/drain", 60.0)
        self.answered_at = time.perf_counter()

    def sigterm_once_answered(self) -> None:
        """The pod's SIGTERM follows its preStop hook: a drain that left the group at the
        drained broker (before coordinators were handed over at a drain) moves it then."""
        if self.answered_at is not None and not self.broker.stopping:
            self.broker.signal(signal.SIGTERM)


def measure_one(
    stack: Stack, probe: RawConnections, rep: int, timeout_s: float, backoff_s: float, mode: str
) -> Stop:
    live = stack.live_brokers
    leaving = live[rep % len(live)]
    group = f"bench-group-{rep}"
    assert commit(probe, leaving, group, 0) == NONE, "the group's lease is taken at the leaving"
    for broker in live:
        find(probe, broker, group)  # connect before the clock starts
    began = time.perf_counter()
    if mode == "stop":
        leaving.signal(signal.SIGTERM)
        return probe_until_moved(probe, live, leaving, group, began, timeout_s, backoff_s)
    drain = DrainCall(leaving)
    drain.start()
    try:
        stop = probe_until_moved(
            probe, live, leaving, group, began, timeout_s, backoff_s, drain.sigterm_once_answered
        )
    finally:
        assert drain.thread is not None
        drain.thread.join(60)
        drain.sigterm_once_answered()
    answered = None if drain.answered_at is None else drain.answered_at - began
    return dataclasses.replace(stop, drain_answered_s=answered)


def probe_until_moved(
    probe: RawConnections,
    live: list[BrokerProcess],
    leaving: BrokerProcess,
    group: str,
    began: float,
    timeout_s: float,
    backoff_s: float,
    each_round: Callable[[], None] = lambda: None,
) -> Stop:
    """Commit as a client does until a broker other than ``leaving`` acks (module doc)."""
    by_node = {b.node_id: b for b in live}
    coordinator, refused_at = leaving, None
    named_at_stopping = named_elsewhere = finds = turn = 0
    offset = 1
    while time.perf_counter() - began < timeout_s:
        each_round()
        code = commit(probe, coordinator, group, offset)
        offset += 1
        if code == NONE and coordinator is not leaving:
            assert refused_at is not None
            done = time.perf_counter()
            return Stop(
                leaving.node_id,
                coordinator.node_id,
                refused_at - began,
                done - refused_at,
                named_at_stopping,
                named_elsewhere,
                finds,
            )
        if code == NONE:
            continue
        if refused_at is None:
            refused_at = time.perf_counter()
        else:
            time.sleep(backoff_s)  # a client's retry back-off after a refused commit
        asked = live[turn % len(live)]
        turn += 1
        answer = find(probe, asked, group)
        finds += 1
        if answer is None or answer[0] != NONE or answer[1] not in by_node:
            time.sleep(backoff_s)
            continue
        if answer[1] == leaving.node_id:
            if asked is leaving:
                named_at_stopping += 1
            else:
                named_elsewhere += 1
        coordinator = by_node[answer[1]]
    raise TimeoutError(f"group {group} had no new coordinator {timeout_s} s after the signal")


def start_load(stack: Stack, rate: float, stop: threading.Event) -> threading.Thread:
    """Produce ``rate`` records/s over the topic (confluent-kafka), so brokers flush at stops."""
    from confluent_kafka import Producer

    def run() -> None:
        producer = Producer(
            {"bootstrap.servers": ",".join(b.bootstrap for b in stack.live_brokers)}
        )
        while not stop.is_set():
            with contextlib.suppress(BufferError):
                producer.produce(TOPIC, b"x" * 100)
            producer.poll(0)
            time.sleep(1 / rate)
        producer.flush(5)

    thread = threading.Thread(target=run, name="load", daemon=True)
    thread.start()
    return thread


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--load-rate", type=float, default=200.0, help="records/s")
    parser.add_argument("--ttl", type=int, default=10, help="session TTL (s)")
    parser.add_argument("--backoff-ms", type=float, default=100.0, help="client retry back-off")
    parser.add_argument(
        "--mode", choices=("stop", "drain"), default="stop", help="SIGTERM, or POST /drain"
    )
    args = parser.parse_args()
    env = {"KAFSCALE_ETCD__SESSION_TTL_S": str(args.ttl)}
    stops: list[Stop] = []
    began = time.perf_counter()
    with Stack(broker_env=env) as stack:
        for _ in range(args.brokers):
            stack.start_broker()
        create_topic(stack.live_brokers[0].bootstrap, TOPIC, args.partitions)
        halt = threading.Event()
        load = start_load(stack, args.load_rate, halt)
        probe = RawConnections(timeout_s=10)
        try:
            for rep in range(args.reps):
                time.sleep(1.0)  # the load reaches every owner
                stop = measure_one(stack, probe, rep, 60.0, args.backoff_ms / 1000, args.mode)
                stops.append(stop)
                print(
                    f"   stop #{rep + 1}: group {stop.old_node} -> {stop.new_node}: refused "
                    f"{stop.refused_s * 1000:.0f} ms after {args.mode}, no coordinator for "
                    f"{stop.gap_s * 1000:.0f} ms, stopping broker named "
                    f"{stop.named_at_stopping}x there / {stop.named_elsewhere}x elsewhere "
                    f"({stop.finds} FindCoordinator)" + drain_note(stop),
                    flush=True,
                )
                for broker in stack.brokers:
                    if broker.stopping and broker.alive:
                        with contextlib.suppress(Exception):
                            broker.wait(60)
                        probe.drop(broker.node_id)
                stack.start_broker()
                wait_for(lambda: len(stack.live_brokers) == args.brokers, 60, "broker count")
        finally:
            halt.set()
            load.join(10)
            probe.close()
    report(args, stops, time.perf_counter() - began)
    return 0


def drain_note(stop: Stop) -> str:
    """When ``POST /drain`` answered, against the group's move (``--mode drain``)."""
    if stop.drain_answered_s is None:
        return ""
    return f", drain answered after {stop.drain_answered_s * 1000:.0f} ms"


def report(args: argparse.Namespace, stops: list[Stop], wall: float) -> None:
    ms = 1000.0
    print()
    print(
        f"kafscale group {args.mode} handoff bench: {args.brokers} brokers, {args.partitions} "
        f"partitions under {args.load_rate:.0f} records/s, client back-off "
        f"{args.backoff_ms:.0f} ms, {os.cpu_count()} CPUs, "
        f"{wall:.0f} s wall, load average {os.getloadavg()[0]:.2f}"
    )
    print()
    print(f"   {'figure':<40}{'n':>4}{'p50 ms':>9}{'max ms':>9}")
    for label, values in (
        (f"{args.mode} -> refused", [s.refused_s for s in stops]),
        ("refused -> commit at the next (gap)", [s.gap_s for s in stops]),
    ):
        if values:
            print(
                f"   {label:<40}{len(values):>4}{percentile(values, 50) * ms:>9.0f}"
                f"{max(values) * ms:>9.0f}"
            )
    answered = [s for s in stops if s.drain_answered_s is not None]
    if answered:
        before = sum(1 for s in answered if (s.drain_answered_s or 0) < s.refused_s)
        print(
            f"   the group still coordinated at the drained broker when POST /drain answered "
            f"(it moved only at the SIGTERM after the hook): {before} of {len(answered)}"
        )
    there = sum(s.named_at_stopping for s in stops)
    elsewhere = sum(s.named_elsewhere for s in stops)
    finds = sum(s.finds for s in stops)
    print(
        f"   FindCoordinator answers naming the stopping broker after its refusal: {there} "
        f"there, {elsewhere} elsewhere, of {finds}"
    )


if __name__ == "__main__":
    sys.exit(main())
