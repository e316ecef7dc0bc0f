"""Issue 20: the lease-aware proxy against the brokers themselves, same run, same cluster.

Three ``kafscale broker`` processes and one ``kafscale proxy`` on etcd and moto's S3, a topic of
six partitions spread over the brokers, confluent-kafka, 1 KiB records, acks=all, linger.ms=5.
Rounds alternate direct (bootstrap = the brokers) and proxied (bootstrap = the proxy), so the
machine's drift hits both alike:

* throughput: ``--records`` records as fast as the client pushes them; median of the rounds;
  target: proxied at least 85 % of direct;
* latency: ``--latency-rounds`` rounds of ``--latency-duration`` seconds per path, alternating,
  paced at 1,000 records/s, each record's produce-to-ack time; target: proxied p99 at most
  direct p99 + 5 ms;
* the proxy's CPU seconds per MiB it forwarded (from ``/proc``, over the proxied rounds).

Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cluster import Stack, cpu_seconds, create_topic, percentile, verdict, wait_for

from kafscale.broker.child_process import KAFSCALE, BrokerProcess, free_port_run

MiB = 1024 * 1024


@dataclass
class Round:
    path: str
    records: int = 0
    seconds: float = 0.0
    errors: int = 0
    latencies_s: list[float] = field(default_factory=list)

    def mib_s(self, record_bytes: int) -> float:
        return self.records * record_bytes / MiB / self.seconds if self.seconds else 0.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--records", type=int, default=150_000, help="per throughput round")
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds per path")
    parser.add_argument("--latency-rate", type=float, default=1000.0)
    parser.add_argument("--latency-duration", type=float, default=5.0, help="per latency round")
    parser.add_argument(
        "--latency-rounds",
        type=int,
        default=4,
        help="paced rounds per path, alternating direct and proxied (the machine's load varies)",
    )
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument(
        "--expose-owners",
        action="store_true",
        help="run the proxy with routing.expose_owners (owners' ids at the proxy's address)",
    )
    return parser.parse_args(argv)


def start_proxy(stack: Stack, expose_owners: bool) -> BrokerProcess:
    port, admin_port = free_port_run(), free_port_run()
    env = stack.env(port, admin_port)  # the proxy ignores the storage variables
    env["KAFSCALE_ROUTING__EXPOSE_OWNERS"] = str(expose_owners).lower()
    proxy = BrokerProcess(
        env=env,
        log_path=stack.workdir / "proxy.log",
        port=port,
        admin_port=admin_port,
        command=[KAFSCALE, "proxy"],
    )
    stack.brokers.append(proxy)  # stopped with the stack
    return proxy.start()


def producer(args: argparse.Namespace, bootstrap: str, **extra: Any) -> Any:
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": args.linger_ms,
            "compression.type": "none",
            "message.timeout.ms": 120_000,
            **extra,
        }
    )


def warm_up(args: argparse.Namespace, bootstrap: str, topic: str) -> None:
    client = producer(args, bootstrap)
    for p in range(args.partitions):
        client.produce(topic, value=b"warm-up", partition=p)
    if client.flush(30):
        raise RuntimeError("warm-up records were not acknowledged")


def max_rate(args: argparse.Namespace, bootstrap: str, topic: str, path: str) -> Round:
    """``--records`` records pushed as fast as the client queues them, until all are acked."""
    client = producer(args, bootstrap, **{"queue.buffering.max.messages": 50_000})
    value = os.urandom(args.record_bytes)
    result = Round(path)

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            result.errors += 1

    began = time.perf_counter()
    sent = 0
    while sent < args.records:
        try:
            client.produce(topic, value=value, on_delivery=delivered)
            sent += 1
        except BufferError:
            client.poll(0.005)
    client.flush(120)
    result.seconds = time.perf_counter() - began
    result.records = sent - result.errors
    return result


def paced(args: argparse.Namespace, bootstrap: str, topic: str, path: str) -> Round:
    """``--latency-rate`` records/s for ``--latency-duration`` s; each record's latency."""
    client = producer(args, bootstrap)
    value = os.urandom(args.record_bytes)
    result = Round(path)
    pack, unpack = struct.Struct(">q").pack, struct.Struct(">q").unpack

    def delivered(err: Any, msg: Any) -> None:
        now = time.perf_counter_ns()
        if err is not None:
            result.errors += 1
            return
        result.records += 1
        result.latencies_s.append((now - unpack(msg.key())[0]) / 1e9)

    began = time.perf_counter()
    interval = 1 / args.latency_rate
    next_at = began
    while (now := time.perf_counter()) < began + args.latency_duration:
        if now < next_at:
            client.poll(min(max(next_at - now, 0.001), 0.005))
            continue
        next_at += interval
        client.produce(topic, value=value, key=pack(time.perf_counter_ns()), on_delivery=delivered)
    client.flush(60)
    result.seconds = time.perf_counter() - began
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with Stack(broker_env={"KAFSCALE_LOG__FLUSH_INTERVAL_MS": "100"}) as stack:
        brokers = [stack.start_broker() for _ in range(args.brokers)]
        proxy = start_proxy(stack, args.expose_owners)
        direct = ",".join(b.bootstrap for b in brokers)
        paths = {"direct": direct, "proxy": proxy.bootstrap}
        topic = "bench-proxy"
        create_topic(direct, topic, args.partitions)

        def spread() -> bool:
            owned = [len(b.owned()) for b in brokers]
            return sum(owned) == args.partitions and min(owned) > 0

        for bootstrap in paths.values():
            warm_up(args, bootstrap, topic)
        wait_for(spread, 30, "partitions spread over the brokers")
        print(
            f"{args.brokers} brokers, {args.partitions} partitions "
            f"({[len(b.owned()) for b in brokers]} each), {args.record_bytes} B records, "
            f"acks=all, linger.ms={args.linger_ms}, proxy expose_owners={args.expose_owners}"
        )

        rounds: dict[str, list[Round]] = {"direct": [], "proxy": []}
        proxy_cpu_s = 0.0
        for i in range(args.rounds):
            for path, bootstrap in paths.items():
                cpu_before = cpu_seconds(proxy.pid)
                result = max_rate(args, bootstrap, topic, path)
                if path == "proxy":
                    proxy_cpu_s += cpu_seconds(proxy.pid) - cpu_before
                rounds[path].append(result)
                print(
                    f"  round {i + 1} {path:6s}: {result.records} records in "
                    f"{result.seconds:.2f} s = {result.mib_s(args.record_bytes):.1f} MiB/s "
                    f"({result.errors} errors)"
                )
        latency = {path: Round(path) for path in paths}
        for _ in range(args.latency_rounds):
            for path, bootstrap in paths.items():
                result = paced(args, bootstrap, topic, path)
                latency[path].records += result.records
                latency[path].errors += result.errors
                latency[path].latencies_s += result.latencies_s
        report(args, rounds, latency, proxy_cpu_s, proxy)
    return 0


def report(
    args: argparse.Namespace,
    rounds: dict[str, list[Round]],
    latency: dict[str, Round],
    proxy_cpu_s: float,
    proxy: BrokerProcess,
) -> None:
    rate = {
        p: statistics.median(r.mib_s(args.record_bytes) for r in rs) for p, rs in rounds.items()
    }
    share = rate["proxy"] / rate["direct"] if rate["direct"] else 0.0
    forwarded_mib = sum(r.records for r in rounds["proxy"]) * args.record_bytes / MiB
    p99 = {p: percentile(r.latencies_s, 99) * 1000 for p, r in latency.items()}
    p50 = {p: percentile(r.latencies_s, 50) * 1000 for p, r in latency.items()}
    print("\nthroughput (median of rounds)")
    print(f"  direct {rate['direct']:.1f} MiB/s, proxy {rate['proxy']:.1f} MiB/s")
    print(f"  proxy / direct = {share:.0%}  (target >= 85 %)  {verdict(share >= 0.85)}")
    print(
        f"\nlatency at {args.latency_rate:.0f} records/s, {args.latency_rounds} rounds of "
        f"{args.latency_duration:.0f} s per path, alternating"
    )
    for path, r in latency.items():
        print(
            f"  {path:6s}: p50 {p50[path]:.1f} ms, p99 {p99[path]:.1f} ms "
            f"({r.records} acked, {r.errors} errors)"
        )
    budget = p99["direct"] + 5
    print(
        f"  proxy p99 {p99['proxy']:.1f} ms vs direct + 5 = {budget:.1f} ms  "
        f"{verdict(p99['proxy'] <= budget)}"
    )
    print("\nproxy CPU")
    print(
        f"  {proxy_cpu_s:.2f} s for {forwarded_mib:.0f} MiB forwarded = "
        f"{proxy_cpu_s / forwarded_mib * 1000:.1f} ms per MiB"
    )
    status = proxy.status()
    print(f"  upstream {status['upstream']}, retries {status['retries']}")


if __name__ == "__main__":
    sys.exit(main())
