"""The cost of metrics: produce and consume throughput with metrics on and off, same run.

Starts etcd and moto's S3 server, then, for each round, two fresh ``kafscale broker`` processes
on them, each its own cluster (so they share nothing but the servers), started in alternating
order: one with metrics (the default), one with
``KAFSCALE_METRICS_ENABLED=false`` (every hot-path record call returns at once; the
scrape-time gauges cost nothing until scraped). A Prometheus-like scraper reads the metrics
broker's ``/metrics`` every second throughout, as a real deployment would. After a short
unscored warm-up, in an order that alternates between rounds (on/off, off/on, ...) so that the
machine's drift hits both alike, each broker takes:

a. a max-rate produce of ``--records`` 1 KiB records (confluent-kafka, acks=all,
   linger.ms=5, 3 partitions, ``produce_batch``), on a new topic each round;
b. a consume of those records from offset 0 (assign, ``fetch.queue.backoff.ms=0``);
c. small requests: ``--small-records`` 100-byte records with ``linger.ms=0`` and
   ``batch.num.messages=1`` (the per-request cost: one Produce request per record or so).

It prints per-round figures (records/s, broker CPU µs per record), each mode's median
(records/s and MiB/s) and the broker's CPU per 1000 records, the differences between the
medians (the issue's budget: within 3 %) and the medians of each round's own on/off ratios.
On a shared machine throughput and even CPU per record move by tens of percent between
rounds, more than metrics can cost; so it also times the metrics work one Produce and one
Fetch request do (in this process, no I/O) and prints it as a share of the broker's CPU per
small produce request: the noise-free figure. ``--control`` runs the same rounds with metrics
off on both brokers (an A/A run): its "differences" are the machine's noise floor.
``--interleaved N`` keeps one pair of brokers for the whole run and alternates N small-request
runs between them (the steadiest same-run comparison on a busy machine).
Run from the repository root, when the load average is low (it prints it)::

    .venv/bin/python bench/metrics_cost.py                 # ~3 min on 2 cores
    .venv/bin/python bench/metrics_cost.py --rounds 7 --records 100000
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from _cluster import Stack, cpu_seconds, create_topic, make_batch, parse_metrics

from kafscale.broker.child_process import BrokerProcess

PARTITIONS = 3
RECORD_BYTES = 1024
SMALL_BYTES = 100


@dataclass
class Figures:
    mode: str
    workload: str
    records: int
    seconds: float
    cpu_s: float

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0


def start_broker(stack: Stack, cluster: str, metrics: bool) -> BrokerProcess:
    return stack.start_broker(
        cluster,
        KAFSCALE_METRICS_ENABLED="true" if metrics else "false",
        KAFSCALE_LOG__FLUSH_INTERVAL_MS="50",
    )


def produce(bootstrap: str, topic: str, records: int, size: int, small: bool) -> float:
    """Seconds to have ``records`` acked (as fast as the client pushes)."""
    from confluent_kafka import Producer

    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": 0 if small else 5,
        "compression.type": "none",
        "delivery.report.only.error": True,
        "queue.buffering.max.messages": 50_000,
    }
    if small:
        config["batch.num.messages"] = 1
    producer = Producer(config)
    errors: list[Any] = []
    batch = [{"value": b"x" * size} for _ in range(1000)]
    began = time.perf_counter()
    sent = 0
    while sent < records:
        count = min(1000, records - sent)
        if len(producer) + count > 50_000:
            producer.poll(0.001)
            continue
        sent += producer.produce_batch(
            topic, batch[:count], on_delivery=lambda e, _m: errors.append(e)
        )
    remaining = producer.flush(120)
    seconds = time.perf_counter() - began
    if remaining or errors:
        raise RuntimeError(f"{remaining} undelivered, errors: {errors[:3]}")
    return seconds


def consume(bootstrap: str, topic: str, records: int) -> float:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "metrics-cost",
            "enable.auto.commit": False,
            "fetch.queue.backoff.ms": 0,
            "fetch.wait.max.ms": 50,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen = 0
    began = time.perf_counter()
    deadline = began + 120
    while seen < records and time.perf_counter() < deadline:
        seen += sum(1 for m in consumer.consume(1000, 0.5) if m.error() is None)
    seconds = time.perf_counter() - began
    consumer.close()
    if seen < records:
        raise RuntimeError(f"consumed {seen} of {records}")
    return seconds


def one_round(
    broker: BrokerProcess, mode: str, index: int, args: argparse.Namespace
) -> list[Figures]:
    out: list[Figures] = []
    topic = f"cost-{mode}-{index}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    cpu = cpu_seconds(broker.pid)
    seconds = produce(broker.bootstrap, topic, args.records, RECORD_BYTES, small=False)
    out.append(Figures(mode, "produce 1 KiB", args.records, seconds, cpu_seconds(broker.pid) - cpu))
    cpu = cpu_seconds(broker.pid)
    seconds = consume(broker.bootstrap, topic, args.records)
    out.append(Figures(mode, "consume 1 KiB", args.records, seconds, cpu_seconds(broker.pid) - cpu))
    small_topic = f"cost-small-{mode}-{index}"
    create_topic(broker.bootstrap, small_topic, PARTITIONS)
    cpu = cpu_seconds(broker.pid)
    seconds = produce(broker.bootstrap, small_topic, args.small_records, SMALL_BYTES, small=True)
    out.append(
        Figures(mode, "produce small", args.small_records, seconds, cpu_seconds(broker.pid) - cpu)
    )
    return out


class Scraper(threading.Thread):
    """Reads ``/metrics`` every second, as Prometheus would (its cost is part of "on")."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.scrapes = 0
        self.last: dict[str, float] = {}

    def run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                with urllib.request.urlopen(self.url, timeout=5) as response:
                    self.last = parse_metrics(response.read().decode())
                self.scrapes += 1
            except OSError:
                pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds per mode (scored)")
    parser.add_argument("--records", type=int, default=50_000, help="1 KiB records per round")
    parser.add_argument("--small-records", type=int, default=20_000, help="small records/round")
    parser.add_argument(
        "--control",
        action="store_true",
        help="A/A run: both brokers without metrics and unscraped (the machine's noise floor)",
    )
    parser.add_argument(
        "--interleaved",
        type=int,
        default=0,
        metavar="N",
        help="instead: one broker pair for the whole run, N alternating small-produce runs each",
    )
    args = parser.parse_args()
    if args.interleaved:
        interleaved(args.interleaved, args.small_records)
        return
    if args.control:
        print("control (A/A) run: 'on' and 'off' are the same (metrics off, no scrapes)")
    warm_up = argparse.Namespace(records=5000, small_records=500)
    results: list[Figures] = []
    scrapes = 0
    print(f"load average at the start (1, 5, 15 min): {os.getloadavg()}", flush=True)
    with Stack() as stack:
        for index in range(args.rounds):
            # Fresh broker processes each round, started in alternating order: a process that
            # happens to run faster (placement, allocator state) does not favour one mode.
            order = ["on", "off"] if index % 2 == 0 else ["off", "on"]
            brokers = {
                mode: start_broker(
                    stack, f"{mode}-{index}", metrics=mode == "on" and not args.control
                )
                for mode in order
            }
            scraper = Scraper(f"{brokers['on'].admin_url}/metrics")
            if not args.control:
                scraper.start()
            for mode in order:  # warm-up, not scored
                one_round(brokers[mode], mode, -1, warm_up)
            for mode in order:
                figures = one_round(brokers[mode], mode, index, args)
                results += figures
                print(
                    f"round {index} {mode:>3}: "
                    + "  ".join(
                        f"{f.workload} {f.rate:>9,.0f}/s {f.cpu_s * 1e6 / f.records:6.1f} us"
                        for f in figures
                    ),
                    flush=True,
                )
            scraper.stop.set()
            scrapes += scraper.scrapes
            for broker in brokers.values():
                broker.stop()  # graceful: its session and leases go at once
        report(results, scrapes)


def interleaved(runs: int, records: int) -> None:
    """Small requests on the same two broker processes, alternating on/off ``runs`` times: the
    difference between fresh processes (placement, allocator, hash seeds) drops out, and load
    swings longer than one run hit both alike."""
    print(f"load average at the start (1, 5, 15 min): {os.getloadavg()}", flush=True)
    results: list[Figures] = []
    with Stack() as stack:
        brokers = {mode: start_broker(stack, f"{mode}-i", metrics=mode == "on") for mode in MODES}
        for mode, broker in brokers.items():
            create_topic(broker.bootstrap, f"small-{mode}", PARTITIONS)
            produce(broker.bootstrap, f"small-{mode}", 1000, SMALL_BYTES, small=True)
        scraper = Scraper(f"{brokers['on'].admin_url}/metrics")
        scraper.start()
        for index in range(runs):
            for mode in MODES if index % 2 == 0 else MODES[::-1]:
                broker = brokers[mode]
                cpu = cpu_seconds(broker.pid)
                seconds = produce(broker.bootstrap, f"small-{mode}", records, SMALL_BYTES, True)
                figure = Figures(
                    mode, "produce small", records, seconds, cpu_seconds(broker.pid) - cpu
                )
                results.append(figure)
                print(
                    f"run {index} {mode:>3}: {figure.rate:>7,.0f}/s "
                    f"{figure.cpu_s * 1e6 / records:6.1f} us per record",
                    flush=True,
                )
        scraper.stop.set()
        report(results, scraper.scrapes)


MODES = ("on", "off")


def report(results: list[Figures], scrapes: int) -> None:
    """Medians per mode: throughput (wall clock: shared machines make it noisy) and the
    broker's CPU per 1000 records (what metrics add to the broker's own work)."""
    print()
    print(f"{'workload':<16}{'mode':>5}{'median rec/s':>14}{'MiB/s':>9}{'CPU ms/1k rec':>15}")
    small_cpu_us: dict[str, float] = {}
    for workload in dict.fromkeys(f.workload for f in results):
        rates: dict[str, float] = {}
        cpus: dict[str, float] = {}
        for mode in ("on", "off"):
            runs = [f for f in results if f.workload == workload and f.mode == mode]
            rates[mode] = statistics.median(f.rate for f in runs)
            cpus[mode] = statistics.median(f.cpu_s * 1e6 / f.records for f in runs)
            size = SMALL_BYTES if "small" in workload else RECORD_BYTES
            mib_s = rates[mode] * size / 2**20
            print(f"{workload:<16}{mode:>5}{rates[mode]:>14,.0f}{mib_s:>9.1f}{cpus[mode]:>15.2f}")
        difference = (rates["on"] - rates["off"]) / rates["off"] * 100
        cpu_difference = (cpus["on"] - cpus["off"]) / cpus["off"] * 100
        paired = paired_difference(results, workload, lambda f: f.rate)
        paired_cpu = paired_difference(results, workload, lambda f: f.cpu_s / f.records)
        verdict = "PASS" if abs(difference) <= 3 else "MISS"
        print(
            f"{'':<16}on vs off: throughput {difference:+.1f} % (budget ±3 %: {verdict}); "
            f"median of the rounds' own on/off ratios {paired:+.1f} %; "
            f"broker CPU per record {cpu_difference:+.1f} % (paired {paired_cpu:+.1f} %)"
        )
        if "small" in workload:
            small_cpu_us = dict(cpus)  # µs per record: one request each
    print(f"\nscrapes of the metrics brokers (one a second while they ran): {scrapes}")
    print(f"load average at the end (1, 5, 15 min): {os.getloadavg()}")
    print_call_costs(small_cpu_us)


def paired_difference(
    results: list[Figures], workload: str, figure: Callable[[Figures], float]
) -> float:
    """Median over rounds of (on - off) / off of ``figure``, each round's two runs back to
    back: the machine's drift between rounds cancels out."""
    on = [figure(f) for f in results if f.workload == workload and f.mode == "on"]
    off = [figure(f) for f in results if f.workload == workload and f.mode == "off"]
    return statistics.median((a - b) / b * 100 for a, b in zip(on, off, strict=True))


def print_call_costs(small_cpu_us: dict[str, float]) -> None:
    """What one request pays, timed in this process: the metrics work of a Produce request
    (dispatch's two clock reads and latency observation, one partition's batch counted) and of
    a Fetch request (one partition of 16 batches counted), set against the broker's measured
    CPU per small produce (one request per record)."""
    from kafscale.broker.observability.metrics import Metrics
    from kafscale.broker.protocol.record_batch import read_header

    metrics = Metrics()
    clock = time.perf_counter
    batches = [make_batch([b"x" * SMALL_BYTES])]
    headers = [read_header(b) for b in batches]
    fetched = b"".join(make_batch([b"x" * SMALL_BYTES] * 8) for _ in range(16))

    def produce_request() -> None:
        started = clock()
        metrics.produced_batches("topic", batches, headers)
        metrics.request("Produce", clock() - started, failed=False)

    def fetch_request() -> None:
        started = clock()
        metrics.fetched("topic", fetched)
        metrics.request("Fetch", clock() - started, failed=False)

    calls = {
        "Produce request (1 partition)": produce_request,
        "Fetch request (16 batches)": fetch_request,
        "request(api, seconds)": lambda: metrics.request("Produce", 0.001, failed=False),
        "store_call(op, seconds)": lambda: metrics.store_call("put", 0.01, failed=False),
        "etcd_call(op, seconds)": lambda: metrics.etcd_call("txn", 0.001, failed=False),
    }
    print("\nmetrics work per request or call, in this process (median of 5 x 200k):")
    costs = {name: median_ns(call) for name, call in calls.items()}
    for name, ns in costs.items():
        print(f"  {name:<32}{ns:>8.0f} ns")
    produce_ns = costs["Produce request (1 partition)"]
    for mode, cpu_us in small_cpu_us.items():
        share = produce_ns / 1000 / cpu_us * 100
        print(
            f"  small produce, metrics {mode}: broker CPU {cpu_us:.0f} us per record (request);"
            f" the metrics work is {share:.2f} % of it"
        )


def median_ns(call: Callable[[], None], repeat: int = 5, number: int = 200_000) -> float:
    timings = []
    for _ in range(repeat):
        began = time.perf_counter()
        for _ in range(number):
            call()
        timings.append((time.perf_counter() - began) / number * 1e9)
    return statistics.median(timings)


if __name__ == "__main__":
    main()
