"""Produce and consume throughput and produce latency through one broker on moto's S3 server.

Starts etcd, moto's S3 server and one ``kafscale broker`` process, then measures:

a. the S3 server's raw PUT throughput for 4 MiB objects with boto3, built and driven the way the
   broker drives it (one client, a thread pool: single stream and N parallel PUTs), and the PUT
   latency of sequential 1 KiB PUTs and of a flush round's uploads at each paced rate (one
   segment per partition at once, p50/p99);
b. produce throughput with confluent-kafka (1 KiB records, acks=all, linger.ms=5, 3 partitions)
   as fast as the client can push, bounded by ``--records`` and ``--duration``, after a warm-up
   round that is not scored (a running broker reuses the memory of segments it evicted);
c. right after it, consume throughput of those records (assign from offset 0, still in the
   broker's cache);
b'. produce latency per message (produce() to delivery callback) at fixed rates below
   saturation (1000/s and a quarter of the measured maximum), where the client's queue does not
   dominate, and at half the maximum for information (the two cores are saturated there);
d. the broker's RSS, sampled every 100 ms throughout (maximum overall and per phase).

It prints a table and the targets of issue 2 with PASS/MISS. Everything it starts is stopped at
the end. ``--timings`` shows where the time goes inside the broker, ``--profile DIR`` records it
with py-spy. Run from the repository root::

    .venv/bin/python bench/produce_consume.py                 # ~60 s on 2 cores
    .venv/bin/python bench/produce_consume.py --timings --flush-interval-ms 50
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _cluster import (
    Sampler,
    Stack,
    cpu_seconds,
    create_topic,
    minor_faults,
    percentile,
    rss_bytes,
    verdict,
)

MiB = 1024 * 1024
# The shortest full-queue window whose rate is scored (~20 flush commits at 290 MiB/s); below
# it, the whole run's rate (start-up and drain included) is. It was 0.5 s until 2026-11-24,
# which scored the faster rounds, whose 200k records leave a shorter window, on the lower figure.
MIN_SUSTAINED_S = 0.3
TOPIC = "bench"
LATENCY_TOPIC = "bench-latency"
# What a record adds to its value as the broker stores it: its 8-byte key (the paced producer's
# timestamp), its varints and attributes (~12 bytes), and its share of a 61-byte batch header
# (at 1000 records/s, linger 5 ms and 3 partitions a batch holds one or two records).
RECORD_OVERHEAD_BYTES = 60
SEGMENT_FRAME_BYTES = 32 + 16  # segment header and footer (docs/storage-and-etcd-format.md)


@dataclass
class PutResult:
    label: str
    objects: int
    seconds: float
    nbytes: int
    moto_cpu_s: float = 0.0  # moto's CPU seconds over the timed PUTs

    @property
    def mib_s(self) -> float:
        return self.nbytes / MiB / self.seconds


@dataclass
class ProduceResult:
    label: str
    topic: str
    sent: int = 0
    acked: int = 0
    errors: int = 0
    nbytes: int = 0
    seconds: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    first_error: str = ""
    # Sustained: acks delivered between the first ack and the last produce() call (the client
    # queue is still full then, so this is the broker's rate without start-up or final drain).
    sustained_bytes: int = 0
    sustained_records: int = 0
    sustained_s: float = 0.0
    txns: int = 0
    cpu: CpuMeter | None = None  # paced runs: who used the two cores meanwhile
    rate: float = 0.0  # paced runs: the records/s asked for

    @property
    def mib_s(self) -> float:
        return self.nbytes / MiB / self.seconds if self.seconds else 0.0

    @property
    def records_s(self) -> float:
        return self.acked / self.seconds if self.seconds else 0.0

    @property
    def sustained_mib_s(self) -> float:
        return (
            self.sustained_bytes / MiB / self.sustained_s
            if self.sustained_s >= MIN_SUSTAINED_S
            else 0.0
        )

    @property
    def sustained_records_s(self) -> float:
        return (
            self.sustained_records / self.sustained_s
            if self.sustained_s >= MIN_SUSTAINED_S
            else 0.0
        )


@dataclass
class ConsumeResult:
    label: str = "consume"
    records: int = 0
    nbytes: int = 0
    seconds: float = 0.0
    first_s: float = 0.0  # assign() -> first record
    longest_wait_s: float = 0.0  # between two batches returned by consume()
    longest_wait_at: int = 0  # records read before it
    complete: bool = False

    @property
    def mib_s(self) -> float:
        return self.nbytes / MiB / self.seconds if self.seconds else 0.0

    @property
    def records_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0


# --- a: raw PUTs --------------------------------------------------------------------------------


def measure_puts(stack: Stack, size: int, count: int, parallel: int, prefix: str) -> PutResult:
    client = stack.s3_client(max_concurrency=max(parallel, 1))
    body = os.urandom(size)
    keys = [f"rawput/{prefix}/{i:05d}" for i in range(count)]
    client.put_object(Bucket=stack.bucket, Key=f"rawput/{prefix}/warmup", Body=body)
    assert stack.s3 is not None
    with CpuMeter({"moto": stack.s3.pid}) as moto:
        if parallel <= 1:
            for key in keys:
                client.put_object(Bucket=stack.bucket, Key=key, Body=body)
        else:
            with ThreadPoolExecutor(parallel) as pool:
                list(
                    pool.map(
                        lambda k: client.put_object(Bucket=stack.bucket, Key=k, Body=body), keys
                    )
                )
    label = "single stream" if parallel <= 1 else f"{parallel} parallel"
    return PutResult(label, count, moto.wall, size * count, moto.used["moto"])


def measure_small_put_latency(
    stack: Stack, size: int, count: int, parallel: int = 1, conditional: bool = False
) -> list[float]:
    """Latency of each of ``count`` PUTs of ``size`` bytes, issued ``parallel`` at a time;
    ``conditional``: create-only (``If-None-Match: *``), as the broker writes segments."""
    client = stack.s3_client()
    body = os.urandom(size)
    latencies: list[float] = []
    extra = {"IfNoneMatch": "*"} if conditional else {}

    def put(key: str) -> float:
        began = time.perf_counter()
        client.put_object(Bucket=stack.bucket, Key=key, Body=body, **extra)
        return time.perf_counter() - began

    with ThreadPoolExecutor(parallel) as pool:
        for i in range(count // parallel + 2):
            keys = [f"rawput/put-{size}-{parallel}/{i:05d}-{j}" for j in range(parallel)]
            results = list(pool.map(put, keys))
            if i >= 2:  # the first requests open connections
                latencies += results
    return latencies


ROUND_PUT_BYTES = 1024 * MiB  # at most this much PUT per round-pattern latency measurement
# ... deleted after every this much: moto gets slower per MiB once it holds over half a GiB
ROUND_PUT_CHUNK_BYTES = 256 * MiB


def round_segment_bytes(args: argparse.Namespace, rate: float) -> int:
    """The segment one partition uploads per flush round at ``rate`` records/s: the records of
    one flush interval (or ``segment.bytes``, which cuts a round short), in the stored layout."""
    per_round = rate * args.flush_interval_ms / 1000 / args.partitions
    batch = per_round * (args.record_bytes + RECORD_OVERHEAD_BYTES)
    return int(min(max(batch, args.record_bytes), args.segment_bytes)) + SEGMENT_FRAME_BYTES


def measure_round_puts(
    args: argparse.Namespace, stack: Stack, rate: float
) -> tuple[int, list[float]]:
    """PUT latency of the store for the uploads a flush round makes at ``rate``: one segment
    per partition at once, created conditionally, as the broker writes them. This is the "PUT"
    of the latency budget: the store's own time for the broker's writes, measured apart from
    the broker."""
    size = round_segment_bytes(args, rate)
    count = min(args.small_puts, max(30 * args.partitions, ROUND_PUT_BYTES // size))
    chunk = max(10 * args.partitions, ROUND_PUT_CHUNK_BYTES // size)
    latencies: list[float] = []
    for start in range(0, count, chunk):  # each call PUTs whole rounds, at least one
        wanted = max(args.partitions, min(chunk, count - start))
        latencies += measure_small_put_latency(
            stack, size, wanted, args.partitions, conditional=True
        )
        delete_raw_objects(stack)
    return size, latencies


class CpuMeter:
    """CPU seconds of named processes and of the whole machine over a phase."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.wall = 0.0
        self.used: dict[str, float] = {}
        self.broker_faults = 0

    def __enter__(self) -> CpuMeter:
        self._cpu0 = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self._faults0 = minor_faults(self.pids.get("broker", 0))
        self._busy0 = machine_busy()
        self._wall0 = time.perf_counter()
        return self

    def __exit__(self, *_: object) -> None:
        self.wall = time.perf_counter() - self._wall0
        busy1 = machine_busy()
        self.used = {n: cpu_seconds(pid) - self._cpu0[n] for n, pid in self.pids.items()}
        self.broker_faults = minor_faults(self.pids.get("broker", 0)) - self._faults0
        share = (busy1[0] - self._busy0[0]) / max(busy1[1] - self._busy0[1], 1)
        self.used["machine"] = share * self.wall * (os.cpu_count() or 1)

    def line(self, label: str) -> str:
        return (
            f"   CPU seconds during {label} ({self.wall:.1f} s wall, {os.cpu_count()} cores): "
            + ", ".join(f"{n} {s:.1f} ({s / self.wall:.0%})" for n, s in self.used.items())
        )


def exclude_harness_objects_from_gc() -> None:
    """Keep the cyclic garbage collector's full passes off the bench's own long-lived objects.

    This process also holds boto3 clients (botocore's service models: ~100k objects) and the
    stack's bookkeeping, which a Kafka client application does not. Every full collection during
    a max-rate run walked all of them: perf showed 15 % of this process's CPU in the collector,
    taken from the two cores the broker and the S3 server share. Frozen, as the broker freezes
    its start-up objects, they stay alive and uncollected; what the clients create still is.
    """
    gc.collect()
    gc.freeze()


def delete_raw_objects(stack: Stack) -> None:
    """Free moto's memory: the raw-PUT objects are not needed any more."""
    client = stack.s3_client()
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=stack.bucket, Prefix="rawput/"):
        objects = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if objects:
            client.delete_objects(Bucket=stack.bucket, Delete={"Objects": objects})


# --- b: produce ---------------------------------------------------------------------------------


def producer_config(args: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": args.linger_ms,
        "compression.type": "none",
        "message.timeout.ms": 120_000,
    }


def paced_rate(wanted: float, max_records_s: float) -> float:
    """``--latency-rates`` entry: records/s, or (up to 1) a share of the measured max rate."""
    return wanted if wanted > 1 else max(100.0, wanted * max_records_s)


def warm_up(args: argparse.Namespace, bootstrap: str, topic: str, partitions: int) -> None:
    """Connect, fetch metadata and have the broker take every partition before timing."""
    from confluent_kafka import Producer

    producer = Producer(producer_config(args, bootstrap))
    for p in range(partitions):
        producer.produce(topic, value=b"warm-up", partition=p)
    if producer.flush(30):
        raise RuntimeError("warm-up records were not acknowledged")


def produce_paced(
    args: argparse.Namespace, bootstrap: str, label: str, topic: str, duration_s: float, rate: float
) -> ProduceResult:
    """Produce at ``rate`` records/s for ``duration_s``, then flush; latency of every record.

    Each record's key carries its produce() time (8 bytes, perf_counter_ns); the delivery
    callback turns it into that record's latency. Throughput counts acked value bytes from the
    first produce() to the last delivery.
    """
    from confluent_kafka import KafkaException, Producer

    producer = Producer(producer_config(args, bootstrap))
    value = os.urandom(args.record_bytes)
    result = ProduceResult(label, topic)
    last_ack = [0.0]
    pack = struct.Struct(">q").pack
    unpack = struct.Struct(">q").unpack
    size = args.record_bytes

    def delivered(err: Any, msg: Any) -> None:
        now = time.perf_counter_ns()
        if err is not None:
            result.errors += 1
            if not result.first_error:
                result.first_error = str(err)
            return
        result.acked += 1
        result.nbytes += size
        result.latencies_s.append((now - unpack(msg.key())[0]) / 1e9)
        last_ack[0] = now / 1e9

    began = time.perf_counter()
    deadline = began + duration_s
    interval = 1.0 / rate
    next_at = began
    while True:
        now = time.perf_counter()
        if now >= deadline:
            break
        if now < next_at:
            # poll() takes whole milliseconds: a shorter wait returns at once, and waiting that
            # way spun a core at 1000 records/s, taken from the broker and the S3 server. A
            # record due sooner goes out up to a millisecond late; its latency counts from then.
            producer.poll(min(max(next_at - now, 0.001), 0.005))
            continue
        next_at += interval
        try:
            producer.produce(
                topic, value=value, key=pack(time.perf_counter_ns()), on_delivery=delivered
            )
            result.sent += 1
        except BufferError:
            producer.poll(0.01)
            continue
        except KafkaException as exc:  # reported, not raised
            result.first_error = result.first_error or str(exc)
            break
        if result.sent % 256 == 0:  # serve delivery callbacks while behind schedule too
            producer.poll(0)
    remaining = producer.flush(args.flush_timeout)
    end = last_ack[0] or time.perf_counter()
    result.seconds = end - began
    if remaining:
        result.first_error = result.first_error or f"{remaining} records undelivered at the end"
    return result


QUEUE_MESSAGES = 50_000  # half librdkafka's default: 50 MiB, more than the broker takes in at once
BATCH_MESSAGES = 1000


def produce_max_rate(
    args: argparse.Namespace,
    bootstrap: str,
    label: str,
    topic: str,
    records: int,
    duration_s: float,
) -> ProduceResult:
    """Produce as fast as the client can, spending as little of the client's CPU as it allows.

    On two cores the Python client competes with the broker and the S3 server: a ``produce()``
    call and a delivery callback per record cost it about half a core at 110k records/s. So this
    run queues records a thousand at a time (``produce_batch``, librdkafka's own batch call, the
    same requests on the wire), asks for delivery reports of failures only
    (``delivery.report.only.error``) and counts acks as records sent minus records still in the
    client's queue (``len(producer)``: queued, in flight or awaiting their ack).
    """
    from confluent_kafka import Producer

    config = producer_config(args, bootstrap)
    config |= {"delivery.report.only.error": True, "queue.buffering.max.messages": QUEUE_MESSAGES}
    producer = Producer(config)
    value = os.urandom(args.record_bytes)
    batch = [{"value": value} for _ in range(BATCH_MESSAGES)]
    result = ProduceResult(label, topic)

    def failed(err: Any, _msg: Any) -> None:
        if err is not None:
            result.errors += 1
            result.first_error = result.first_error or str(err)

    began = time.perf_counter()
    deadline = began + duration_s
    first_ack: tuple[float, int] | None = None  # (time, records acked by then)
    now = began
    while result.sent < records and now < deadline and not result.first_error:
        waiting = len(producer)
        if first_ack is None and result.sent > waiting:
            first_ack = (now, result.sent - waiting)
        count = min(BATCH_MESSAGES, records - result.sent)
        if waiting + count > QUEUE_MESSAGES:
            producer.poll(0.001)
        else:
            queued = producer.produce_batch(topic, batch[:count], on_delivery=failed)
            result.sent += queued
            if queued < count:
                result.first_error = f"produce_batch queued {queued} of {count} records"
        now = time.perf_counter()
    acked_while_full = result.sent - len(producer)
    if first_ack is not None:
        result.sustained_s = now - first_ack[0]
        result.sustained_records = acked_while_full - first_ack[1]
        result.sustained_bytes = result.sustained_records * args.record_bytes
    remaining = producer.flush(args.flush_timeout)
    result.seconds = time.perf_counter() - began
    result.acked = result.sent - remaining - result.errors
    result.nbytes = result.acked * args.record_bytes
    if remaining:
        result.first_error = result.first_error or f"{remaining} records undelivered at the end"
    return result


# --- c: consume ---------------------------------------------------------------------------------


# librdkafka >= 2.4 stops fetching a partition for fetch.queue.backoff.ms (1 s) whenever its
# local queue holds more than queued.min.messages (100k) records: in a 200k-record run that is a
# one-second pause of the client, not of the broker. The target is measured without it.
# librdkafka also has one fetch in flight per broker: once some partitions are read to the end
# and another's local queue is full, the next fetch carries only the caught-up ones and waits
# out fetch.wait.max.ms (500 ms) on the broker, holding back the partition that still has data.
NO_BACKOFF = {"fetch.queue.backoff.ms": 0, "fetch.wait.max.ms": 50}


def consume(
    bootstrap: str,
    topic: str,
    partitions: int,
    expected: int,
    timeout_s: float,
    batch: int,
    extra: dict[str, Any] | None = None,
) -> ConsumeResult:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-consume",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            **(extra or {}),
        }
    )
    result = ConsumeResult(label="consume, no backoff" if extra else "consume, defaults")
    began = time.perf_counter()
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    deadline = began + timeout_s
    last = began
    try:
        while result.records < expected and time.perf_counter() < deadline:
            # Ask for no more than what is left: a batch that cannot fill waits out the
            # whole timeout, which would count a second of waiting as consume time.
            wanted = min(batch, expected - result.records)
            messages = consumer.consume(wanted, timeout=1.0)
            if not messages:
                continue
            now = time.perf_counter()
            if now - last > result.longest_wait_s:
                result.longest_wait_s, result.longest_wait_at = now - last, result.records
            last = now
            # Counted without a Python statement per record: the loop itself is a bottleneck
            # of a Python client reading several hundred thousand records a second.
            good = [msg for msg in messages if msg.error() is None]
            result.records += len(good)
            result.nbytes += sum(map(len, good))  # len(message) = its value's length
            if not result.first_s:
                result.first_s = last - began
    finally:
        consumer.close()
    result.seconds = last - began
    result.complete = result.records >= expected
    return result


def consume_with_kcat(
    bootstrap: str, topic: str, expected: int, nbytes: int, timeout_s: float
) -> ConsumeResult | None:
    """The same read with kcat (librdkafka in C): a client that is not the bottleneck, so the
    figure shows what the broker serves. None when kcat is not installed."""
    import shutil
    import subprocess

    kcat = shutil.which("kcat")
    if kcat is None:
        return None
    result = ConsumeResult(label="consume, kcat (C)")
    began = time.perf_counter()
    # -c (exit after that many records), not -e: end-of-partition is only known from an empty
    # fetch, which long-polls for fetch.wait.max.ms (500 ms) first.
    command = [kcat, "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-c", str(expected)]
    done = subprocess.run(
        [*command, "-q", "-f", "%o\\n"],
        capture_output=True,
        timeout=timeout_s,
        check=False,
    )
    result.seconds = time.perf_counter() - began
    result.records = done.stdout.count(b"\n")
    result.nbytes = nbytes * result.records // max(expected, 1)
    result.complete = result.records >= expected
    return result


# --- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--records", type=int, default=200_000, help="records in the throughput run")
    p.add_argument("--duration", type=float, default=20.0, help="time limit of the throughput run")
    p.add_argument(
        "--rounds", type=int, default=3, help="max-rate produce/consume rounds (median is scored)"
    )
    p.add_argument(
        "--warm-up-rounds", type=int, default=1, help="max-rate produce rounds before, not scored"
    )
    p.add_argument("--record-bytes", type=int, default=1024)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--linger-ms", type=int, default=5)
    p.add_argument("--flush-interval-ms", type=int, default=100, help="broker flush timer")
    p.add_argument("--segment-bytes", type=int, default=4 * MiB, help="broker size-flush bytes")
    p.add_argument("--cache-bytes", type=int, default=None, help="broker segment cache bytes")
    p.add_argument(
        "--latency-rates",
        type=float,
        nargs="+",
        default=[1000.0, 0.25, 0.5],
        help="paced latency runs: records/s, or up to 1 a share of the median max rate",
    )
    p.add_argument(
        "--latency-target-share",
        type=float,
        default=0.25,
        help="paced runs up to this share of the max rate are held to the latency target; "
        "faster ones are printed for information (the two cores are saturated there)",
    )
    p.add_argument("--latency-duration", type=float, default=15.0, help="seconds per paced run")
    p.add_argument("--put-count", type=int, default=64, help="4 MiB objects per PUT mode")
    p.add_argument("--put-parallel", type=int, nargs="+", default=[4, 8])
    p.add_argument("--small-put-bytes", type=int, default=1024)
    p.add_argument("--small-puts", type=int, default=1000)
    p.add_argument("--consume-batch", type=int, default=10_000)
    p.add_argument("--flush-timeout", type=float, default=60.0)
    p.add_argument("--profile", type=Path, default=None, help="py-spy the broker into this dir")
    p.add_argument(
        "--timings",
        action="store_true",
        help="run the broker with timing probes (bench/_timed_broker.py): flush rounds, uploads, "
        "etcd commits, S3 calls, event-loop lag, per phase",
    )
    p.add_argument(
        "--broker-env",
        action="append",
        default=[],
        metavar="KAFSCALE_X=V",
        help="extra broker environment variable (repeatable)",
    )
    p.add_argument("--keep", action="store_true", help="keep the work dir (logs) at the end")
    return p.parse_args(argv)


class Profiler:
    """py-spy recordings of the broker, one file per phase, if ``--profile DIR`` was given.

    ``--gil``: only samples of the thread holding the GIL, i.e. where the broker's Python CPU
    time goes (one interpreter lock: the event loop and boto3's threads share it).
    """

    def __init__(self, directory: Path | None, pid: int) -> None:
        self.directory = directory
        self.pid = pid
        found = Path(sys.executable).with_name("py-spy")
        self.py_spy = found if found.exists() else Path(shutil.which("py-spy") or found)
        self._process: subprocess.Popen[bytes] | None = None
        self.files: list[Path] = []
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            if not self.py_spy.exists():
                print(f"(no {self.py_spy}: `uv pip install -p .venv/bin/python py-spy`)")
                self.directory = None

    def start(self, phase: str) -> None:
        if self.directory is None:
            return
        out = self.directory / f"broker-{phase}.txt"
        command = [str(self.py_spy), "record", "--pid", str(self.pid), "--format", "raw"]
        command += ["--rate", "100", "--gil", "--output", str(out), "--duration", "600"]
        self._process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        self.files.append(out)
        time.sleep(0.5)  # py-spy attaches

    def stop(self) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            self._process.wait(30)
            self._process = None


def txn_count(stack: Stack) -> int:
    """etcd Txn RPCs so far (every client; here: the broker's commits and acquisitions)."""
    metrics = stack.etcd_metrics()
    return int(
        sum(
            v
            for k, v in metrics.items()
            if k.startswith("grpc_server_started_total{") and 'grpc_method="Txn"' in k
        )
    )


def timing_report(path: Path, phases: list[tuple[str, float, float]]) -> list[str]:
    """Where a phase's time went inside the broker (see ``_timed_broker.py``)."""
    events = []
    with contextlib.suppress(OSError), path.open() as lines:
        for line in lines:
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
    ms = 1000.0

    def stats(values: list[float], scale: float = ms, unit: str = "ms") -> str:
        if not values:
            return "-"
        p50, p99 = percentile(values, 50) * scale, percentile(values, 99) * scale
        return f"p50 {p50:.1f} p99 {p99:.1f} max {max(values) * scale:.1f} {unit} (n={len(values)})"

    def line(label: str, text: str) -> str:
        return f"      {label:<38}{text}"

    out = []
    for name, t0, t1 in phases:
        inside = [e for e in events if t0 <= e.get("start", e.get("queued", 0)) <= t1]
        of = {k: [e for e in inside if e["kind"] == k] for k in ("round", "upload", "commit", "s3")}
        lag = [e["lag"] for e in inside if e["kind"] == "lag"]
        rounds = sorted(of["round"], key=lambda e: e["start"])
        periods = [b["start"] - a["start"] for a, b in itertools.pairwise(rounds)]
        uploads, commits = of["upload"], of["commit"]
        per_commit = sum(e["partitions"] for e in commits) / max(len(commits), 1)
        out.append(f"   {name}:")
        out.append(line("flush round period (start to start)", stats(periods)))
        out.append(line("flush round duration", stats([e["end"] - e["start"] for e in rounds])))
        out.append(
            line(
                "partition upload (encode + segment PUTs)",
                stats([e["end"] - e["start"] for e in uploads]),
            )
        )
        sizes = stats([e["bytes"] for e in uploads], 1 / MiB, "MiB")
        out.append(line("bytes per partition per round", sizes))
        out.append(
            line("etcd commit txn", stats([e["end"] - e["start"] for e in commits]))
            + f", {per_commit:.1f} partitions each"
        )
        puts = [e for e in of["s3"] if e["op"] == "put_object"]
        for label, calls in (
            ("S3 PUT segment", [e for e in puts if e["key"].endswith(".kfs")]),
            ("S3 PUT index", [e for e in puts if e["key"].endswith(".idx")]),
            ("S3 GET", [e for e in of["s3"] if e["op"] == "get_object"]),
        ):
            if calls:
                out.append(
                    line(f"{label}: in boto3", stats([e["end"] - e["start"] for e in calls]))
                )
                out.append(
                    line(
                        f"{label}: wait for a thread",
                        stats([e["start"] - e["queued"] for e in calls]),
                    )
                )
                out.append(
                    line(
                        f"{label}: loop resumes caller",
                        stats([e["resumed"] - e["end"] for e in calls]),
                    )
                )
        out.append(line("event-loop lag (10 ms sleep)", stats(lag)))
        for generation in (0, 1, 2):
            pauses = [
                e["end"] - e["start"]
                for e in inside
                if e["kind"] == "gc" and e["generation"] == generation
            ]
            out.append(line(f"garbage collection, generation {generation}", stats(pauses)))
    return out


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs, from /proc/stat."""
    with open("/proc/stat") as stat:
        values = [float(v) for v in stat.readline().split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


@dataclass
class MaxRateRound:
    """One max-rate produce and the consume runs that read its records back."""

    topic: str
    burst: ProduceResult
    produce_cpu: CpuMeter
    consumed: ConsumeResult | None = None
    consumed_defaults: ConsumeResult | None = None
    consumed_kcat: ConsumeResult | None = None
    consume_cpu: CpuMeter | None = None
    buffers: tuple[int, int] = (0, 0)  # segment buffers reused, newly allocated while producing
    frames: tuple[int, int] = (0, 0)  # request frames received into reused, new pooled buffers
    raw_puts: list[PutResult] = field(default_factory=list)  # measured just before the produce

    @property
    def best_raw_put(self) -> PutResult | None:
        return max(self.raw_puts, key=lambda p: p.mib_s, default=None)

    @property
    def produce_share(self) -> float:
        """Produce as a share of the S3 server's raw PUT rate measured just before it."""
        best = self.best_raw_put
        return self.produced_mib_s / best.mib_s if best is not None and best.mib_s else 0.0

    @property
    def produced_mib_s(self) -> float:
        return self.burst.sustained_mib_s or self.burst.mib_s


@dataclass
class Run:
    """Everything one bench run measured."""

    puts: list[PutResult] = field(default_factory=list)
    small: list[float] = field(default_factory=list)
    # PUT latencies of a flush round's pattern at each paced rate: (object bytes, latencies)
    round_puts: list[tuple[int, list[float]]] = field(default_factory=list)
    warm_ups: list[MaxRateRound] = field(default_factory=list)
    rounds: list[MaxRateRound] = field(default_factory=list)
    paced: list[ProduceResult] = field(default_factory=list)
    idle_rss: int = 0
    max_rss: int = 0
    rss_samples: int = 0
    phases: list[tuple[str, float, float]] = field(default_factory=list)
    phase_rss: list[tuple[str, int]] = field(default_factory=list)
    timings: list[str] = field(default_factory=list)
    load: tuple[float, float] = (0.0, 0.0)

    @property
    def max_records_s(self) -> float:
        """The median round's maximum rate, records/s: what the paced rates are shares of."""
        return statistics.median(
            r.burst.sustained_records_s or r.burst.records_s for r in self.rounds
        )

    @property
    def median_round(self) -> MaxRateRound:
        """The round with the median produce rate: the targets use it, the others show spread."""
        ranked = sorted(self.rounds, key=lambda r: r.produced_mib_s)
        return ranked[(len(ranked) - 1) // 2]


def max_rate_round(
    args: argparse.Namespace,
    stack: Stack,
    bootstrap: str,
    pids: dict[str, int],
    profiler: Profiler,
    run: Run,
    number: int,
    warm_up_only: bool = False,
) -> MaxRateRound:
    """Produce at the highest rate into a new topic, read it back three ways, delete it.

    The max-rate window is short (about a second of acks with the client's queue full), and
    this machine's figures vary from one such window to the next, so the bench runs
    ``--rounds`` of them and the targets use the median round. Deleting the topic afterwards
    frees moto's memory, so every round starts from an S3 server that stores as little as it
    did in the raw-PUT phase (which deletes its objects too): moto's CPU per MiB grows once it
    holds more than half a GiB.

    ``warm_up_only``: produce and delete, no reads. A broker that has been running reuses the
    buffers of segments its cache let go of (``broker/buffer_pool.py``) and moto reuses
    memory it freed; a first round after start-up measures neither, so a warm-up round (not
    scored, ``--warm-up-rounds``) goes first, as the raw PUTs warm moto up before their best
    mode."""
    label = "warm-up" if warm_up_only else "round"
    topic = f"{TOPIC}-{label}-{number}"
    raw_puts = []
    if not warm_up_only:
        # The denominator of the throughput target, taken right before the produce it is
        # compared with: this machine's speed drifts within a run (phase a's best mode varied
        # from 288 to 519 MiB/s between runs while the produce rate stayed within 10 %).
        print(f"a. round {number}: raw PUTs ...", flush=True)
        for n in args.put_parallel:
            raw_puts.append(measure_puts(stack, 4 * MiB, args.put_count, n, f"r{number}-p{n}"))
            delete_raw_objects(stack)
    create_topic(bootstrap, topic, args.partitions)
    warm_up(args, bootstrap, topic, args.partitions)
    exclude_harness_objects_from_gc()
    print(f"b. {label} {number}: produce at the highest rate ...", flush=True)
    txn0 = txn_count(stack)
    profiler.start(f"produce-{label}-{number}")
    mono0 = time.monotonic()
    before = pooled_buffers(stack)
    with CpuMeter(pids) as produce_cpu:
        burst = produce_max_rate(args, bootstrap, "max rate", topic, args.records, args.duration)
    after = pooled_buffers(stack)
    run.phases.append((f"produce max rate, {label} {number}", mono0, time.monotonic()))
    profiler.stop()
    burst.txns = txn_count(stack) - txn0
    segments, frames = (
        (after[kind][0] - before[kind][0], after[kind][1] - before[kind][1])
        for kind in ("segment_cache", "request_frames")
    )
    result = MaxRateRound(
        topic, burst, produce_cpu, buffers=segments, frames=frames, raw_puts=raw_puts
    )
    if warm_up_only:
        delete_topic(stack, bootstrap, topic)
        return result

    print(f"c. round {number}: consume (recent data) ...", flush=True)
    expected = burst.acked + args.partitions  # + the warm-up records
    profiler.start(f"consume-{number}")
    mono0 = time.monotonic()
    with CpuMeter(pids) as result.consume_cpu:
        result.consumed = consume(
            bootstrap, topic, args.partitions, expected, 120.0, args.consume_batch, NO_BACKOFF
        )
    run.phases.append((f"consume #{number}", mono0, time.monotonic()))
    profiler.stop()
    mono0 = time.monotonic()
    result.consumed_defaults = consume(
        bootstrap, topic, args.partitions, expected, 120.0, args.consume_batch
    )
    run.phases.append((f"consume (client defaults) #{number}", mono0, time.monotonic()))
    mono0 = time.monotonic()
    result.consumed_kcat = consume_with_kcat(
        bootstrap, topic, expected, result.consumed.nbytes, 120.0
    )
    run.phases.append((f"consume (kcat) #{number}", mono0, time.monotonic()))
    delete_topic(stack, bootstrap, topic)
    return result


def pooled_buffers(stack: Stack) -> dict[str, tuple[int, int]]:
    """Buffers the broker reused and newly allocated so far, for segments and request frames
    (its ``GET /status``)."""
    status = stack.live_brokers[0].status()
    return {
        kind: (int(status[kind]["buffers_reused"]), int(status[kind]["buffers_allocated"]))
        for kind in ("segment_cache", "request_frames")
    }


def delete_topic(stack: Stack, bootstrap: str, topic: str, timeout_s: float = 30.0) -> None:
    """Delete ``topic`` and wait until the broker has deleted its objects from S3."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics([topic]).values():
        future.result(30)
    client = stack.s3_client()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        prefix = f"{stack.cluster}/topics/{topic}/"
        if not client.list_objects_v2(Bucket=stack.bucket, Prefix=prefix).get("KeyCount"):
            return
        time.sleep(0.1)
    raise TimeoutError(f"the objects of topic {topic} were not deleted within {timeout_s} s")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = {
        "KAFSCALE_LOG__FLUSH_INTERVAL_MS": str(args.flush_interval_ms),
        "KAFSCALE_LOG__SEGMENT_BYTES": str(args.segment_bytes),
        "KAFSCALE_TOPICS__NUM_PARTITIONS": str(args.partitions),
    }
    if args.cache_bytes is not None:
        env["KAFSCALE_LOG__CACHE_BYTES"] = str(args.cache_bytes)
    for item in args.broker_env:
        name, _, value = item.partition("=")
        env[name] = value
    run = Run()
    with Stack(broker_env=env, keep_workdir=args.keep) as stack:
        command = None
        timings_path = stack.workdir / "timings.jsonl"
        if args.timings:
            stack.broker_env["KAFSCALE_BENCH_TIMINGS"] = str(timings_path)
            command = [sys.executable, str(Path(__file__).with_name("_timed_broker.py")), "broker"]
        broker = stack.start_broker(command=command)
        sampler = Sampler(broker.pid)
        sampler.start()
        run.idle_rss = rss_bytes(broker.pid)
        assert stack.s3 is not None and stack.etcd is not None
        pids = {"broker": broker.pid, "moto": stack.s3.pid, "etcd": stack.etcd.pid or 0}
        pids["bench"] = os.getpid()
        profiler = Profiler(args.profile, broker.pid)
        load0 = os.getloadavg()[0]
        print(f"work dir {stack.workdir}; broker pid {broker.pid}; load average {load0:.2f}")

        print("a. raw PUTs ...", flush=True)
        for n in [1, *args.put_parallel]:
            run.puts.append(measure_puts(stack, 4 * MiB, args.put_count, n, f"p{n}"))
            delete_raw_objects(stack)
        run.small = measure_small_put_latency(stack, args.small_put_bytes, args.small_puts)
        delete_raw_objects(stack)

        latency_topics = [f"{LATENCY_TOPIC}-{i}" for i in range(len(args.latency_rates))]
        for topic in latency_topics:
            create_topic(broker.bootstrap, topic, args.partitions)
            warm_up(args, broker.bootstrap, topic, args.partitions)

        for number in range(1, args.warm_up_rounds + 1):
            run.warm_ups.append(
                max_rate_round(
                    args, stack, broker.bootstrap, pids, profiler, run, number, warm_up_only=True
                )
            )
        for number in range(1, args.rounds + 1):
            run.rounds.append(
                max_rate_round(args, stack, broker.bootstrap, pids, profiler, run, number)
            )
        rates = [paced_rate(wanted, run.max_records_s) for wanted in args.latency_rates]
        print("a'. PUT latency of a flush round's uploads at each paced rate ...", flush=True)
        for rate in rates:
            run.round_puts.append(measure_round_puts(args, stack, rate))
        for i, rate in enumerate(rates):
            print(f"b. produce at {rate:.0f} records/s (latency) ...", flush=True)
            exclude_harness_objects_from_gc()
            txn0 = txn_count(stack)
            profiler.start(f"paced-{rate:.0f}")
            mono0 = time.monotonic()
            label = f"{rate:.0f}/s"
            with CpuMeter(pids) as meter:
                result = produce_paced(
                    args, broker.bootstrap, label, latency_topics[i], args.latency_duration, rate
                )
            result.cpu = meter
            result.rate = rate
            profiler.stop()
            run.phases.append((f"produce {label}", mono0, time.monotonic()))
            result.txns = txn_count(stack) - txn0
            run.paced.append(result)

        if args.timings:
            run.timings = timing_report(timings_path, run.phases)
        run.max_rss = sampler.stop()
        run.rss_samples = sampler.samples
        run.phase_rss = [(n, sampler.max_between(t0, t1)) for n, t0, t1 in run.phases]
        run.load = (load0, os.getloadavg()[0])

    report(args, run)
    for path in profiler.files:
        print(f"broker profile (py-spy --gil, collapsed stacks): {path}")
    return 0


def print_produce(r: ProduceResult) -> None:
    ms = 1000.0
    p50, p99 = percentile(r.latencies_s, 50) * ms, percentile(r.latencies_s, 99) * ms
    top = max(r.latencies_s, default=float("nan")) * ms
    print(
        f"   {'produce ' + r.label:<24}{r.acked:>9}{r.mib_s:>8.1f}{r.records_s:>11.0f}"
        f"{p50:>9.1f}{p99:>9.1f}{top:>9.1f}{r.seconds:>9.2f}{r.errors:>8}"
    )
    if r.first_error:
        print(f"      first error: {r.first_error}")
    if r.sustained_s and not r.sustained_mib_s:
        print(
            f"   {'  sustained (queue full)':<24}{r.sustained_records:>9}{'-':>8}{'-':>11}"
            f"{'':>27}{r.sustained_s:>9.2f}   (under {MIN_SUSTAINED_S} s: the whole run's rate "
            "is scored)"
        )
    elif r.sustained_s:
        print(
            f"   {'  sustained (queue full)':<24}{r.sustained_records:>9}"
            f"{r.sustained_mib_s:>8.1f}{r.sustained_records_s:>11.0f}{'':>27}{r.sustained_s:>9.2f}"
        )


def print_consume(c: ConsumeResult) -> None:
    print(
        f"   {c.label:<24}{c.records:>9}{c.mib_s:>8.1f}"
        f"{c.records_s:>11.0f}{'':>27}{c.seconds:>9.2f}"
        + (f"   (first record after {c.first_s * 1000:.0f} ms)" if c.first_s else "")
        + (
            f" (longest wait {c.longest_wait_s * 1000:.0f} ms, after {c.longest_wait_at})"
            if c.longest_wait_s
            else ""
        )
        + ("" if c.complete else "   INCOMPLETE")
    )


def report(args: argparse.Namespace, run: Run) -> None:
    ms = 1000.0
    print()
    print(
        f"kafscale produce/consume bench: 1 broker, {args.partitions} partitions, "
        f"{args.record_bytes} B records, acks=all, linger.ms={args.linger_ms}, "
        f"flush interval {args.flush_interval_ms} ms, segment.bytes {args.segment_bytes}, "
        f"{os.cpu_count()} CPUs, load average {run.load[0]:.2f} -> {run.load[1]:.2f}"
    )
    for item in args.broker_env:
        print(f"   broker env {item}")
    print()
    print("a. S3 server (moto) raw PUT, boto3 client built as the broker builds it")
    for put in run.puts:
        print(
            f"   4 MiB x {put.objects:<3} {put.label:<14} {put.mib_s:8.1f} MiB/s"
            f"   ({put.seconds:.2f} s; moto CPU {put.moto_cpu_s * 1000 / (put.nbytes / MiB):.1f} "
            "ms per MiB)"
        )
    print(
        f"   {args.small_put_bytes} B PUT latency, sequential (n={len(run.small)}): "
        f"p50 {percentile(run.small, 50) * ms:.1f} ms  p99 {percentile(run.small, 99) * ms:.1f} ms"
    )
    for size, values in run.round_puts:
        print(
            f"   {size / 1000:.0f} KB PUT latency, {args.partitions} at once, conditional "
            f"(a flush round's uploads; n={len(values)}): p50 {percentile(values, 50) * ms:.1f} ms"
            f"  p99 {percentile(values, 99) * ms:.1f} ms"
        )
    best_put = max(run.puts, key=lambda p: p.mib_s)
    print()
    print("b/c. Kafka clients (confluent-kafka)")
    header = f"   {'phase':<24}{'records':>9}{'MiB/s':>8}{'records/s':>11}{'p50 ms':>9}"
    print(header + f"{'p99 ms':>9}{'max ms':>9}{'seconds':>9}{'errors':>8}")
    labelled = [(f"warm-up {n}", item) for n, item in enumerate(run.warm_ups, 1)]
    labelled += [(f"round {n}", item) for n, item in enumerate(run.rounds, 1)]
    for label, item in labelled:
        median = " (median, scored)" if item is run.median_round and len(run.rounds) > 1 else ""
        unscored = " (not scored)" if item in run.warm_ups else ""
        print(f"   {label}, topic {item.topic}{median}{unscored}")
        for put in item.raw_puts:
            print(
                f"   raw PUT just before, 4 MiB x {put.objects} {put.label}: {put.mib_s:.1f} MiB/s"
                f" (moto CPU {put.moto_cpu_s * 1000 / (put.nbytes / MiB):.1f} ms per MiB)"
            )
        print_produce(item.burst)
        for c in (item.consumed, item.consumed_defaults, item.consumed_kcat):
            if c is not None:
                print_consume(c)
    for r in run.paced:
        print_produce(r)
    print(
        "   (consume: client defaults but fetch.queue.backoff.ms=0; 'defaults': librdkafka "
        "pauses 1 s when its queue passes 100k records; the target takes the faster of the two)"
    )
    print(
        "   (no latencies at the maximum rate: they would be time spent in the client's full queue)"
    )
    for r in (*(item.burst for item in run.rounds), *run.paced):
        if r.txns:
            print(
                f"   {r.label} ({r.topic}): {r.txns} etcd txns (flush commits) in "
                f"{r.seconds:.1f} s: one per {r.seconds / r.txns * ms:.0f} ms, "
                f"{r.nbytes / r.txns / MiB:.2f} MiB per commit"
            )
    cache = args.cache_bytes or 256 * MiB
    if max(item.burst.nbytes for item in run.rounds) > cache:
        print(f"   note: a round produced more than the {cache / MiB:.0f} MiB broker cache:")
        print("   its consume runs read the older part from S3, not from recent data")
    for label, item in labelled:
        for what, meter in (("max-rate produce", item.produce_cpu), ("consume", item.consume_cpu)):
            if meter is not None:
                print(meter.line(f"{label}'s {what}"))
        if item.burst.nbytes:
            mib = item.burst.nbytes / MiB
            print(
                f"   CPU ms per MiB acked during {label}'s max-rate produce: "
                + ", ".join(f"{n} {s * 1000 / mib:.1f}" for n, s in item.produce_cpu.used.items())
                + " (moto's raw PUTs: see a.); broker minor page faults per MiB "
                f"{item.produce_cpu.broker_faults / mib:.0f} (a fresh buffer: 256); segment "
                f"buffers reused {item.buffers[0]} of {sum(item.buffers)}; request frames "
                f"received into reused buffers {item.frames[0]} of {sum(item.frames)}"
            )
    for r in run.paced:
        if r.cpu is not None:
            print(r.cpu.line(f"produce {r.label} (the bench's producer: one produce() per record)"))
    print()
    print(
        f"d. broker RSS max {run.max_rss / MiB:.0f} MiB ({run.max_rss / 1e6:.0f} MB, "
        f"{run.rss_samples} samples every 100 ms); idle after start {run.idle_rss / 1e6:.0f} MB; "
        "max per phase: " + ", ".join(f"{name} {rss / 1e6:.0f} MB" for name, rss in run.phase_rss)
    )
    print()
    scored = run.median_round
    produced = scored.produced_mib_s
    # The Python consumer's own speed varies by 2x between runs right after one another (one
    # core building a message object per record); like the raw PUT figure, take the best.
    tries = (scored.consumed, scored.consumed_defaults)
    complete = [c for c in tries if c is not None and c.complete]
    best = max(complete, key=lambda c: c.mib_s, default=scored.consumed or ConsumeResult())
    # Throughput: each round's produce against the raw PUT rate measured just before it; the
    # round with the median share is scored.
    by_share = sorted(run.rounds, key=lambda r: r.produce_share)
    share_round = by_share[(len(by_share) - 1) // 2]
    raw = share_round.best_raw_put or best_put
    shares = " / ".join(f"{r.produce_share:.0%}" for r in run.rounds)
    targets = [
        (
            "produce >= 60% of raw PUT MiB/s (4 MiB, best mode)",
            f"{share_round.produced_mib_s:.1f} vs {0.6 * raw.mib_s:.1f} MiB/s "
            f"({share_round.produce_share:.0%} of {raw.mib_s:.1f}, {raw.label}; rounds {shares})",
            share_round.produce_share >= 0.6,
        ),
        (
            "consume >= 2x produce (best Python-client run)",
            f"{best.mib_s:.1f} vs {2 * produced:.1f} MiB/s "
            f"({best.mib_s / produced if produced else 0:.1f}x, {best.label})",
            best.complete and best.mib_s >= 2 * produced,
        ),
    ]
    kcat = scored.consumed_kcat
    if kcat is not None:
        targets.append(
            (
                "consume >= 2x produce, C client (kcat)",
                f"{kcat.mib_s:.1f} vs {2 * produced:.1f} MiB/s "
                f"({kcat.mib_s / produced if produced else 0:.1f}x)",
                kcat.complete and kcat.mib_s >= 2 * produced,
            )
        )
    max_records_s = run.max_records_s
    under_load = []
    for r, (size, puts) in zip(run.paced, run.round_puts, strict=True):
        p99 = percentile(r.latencies_s, 99) * ms
        budget = args.flush_interval_ms + 2 * percentile(puts, 99) * ms
        row = (
            f"produce p99 <= flush interval + 2 x PUT p99 @{r.label}",
            f"{p99:.1f} vs {budget:.1f} ms (PUT: {args.partitions} x {size / 1000:.0f} KB "
            f"at once; acked {r.records_s:.0f} records/s, {r.rate / max_records_s:.1%} of max)",
            p99 <= budget and not r.errors,
        )
        # the same product as in paced_rate, so a run asked at exactly the share compares equal
        scored = r.rate <= args.latency_target_share * max_records_s
        (targets if scored else under_load).append(row)
    targets.append(("broker RSS <= 500 MB", f"{run.max_rss / 1e6:.0f} MB", run.max_rss <= 500e6))
    rounds = " / ".join(f"{item.produced_mib_s:.1f}" for item in run.rounds)
    print(
        "targets (issue 2; produce = the sustained max-rate figure of the median round "
        f"[{rounds} MiB/s]; PUT p99 = a flush round's uploads at that rate)"
    )
    for name, figures, ok in targets:
        print(f"   {verdict(ok)}  {name:<56} {figures}")
    for name, figures, ok in under_load:
        print(f"   ({verdict(ok)}  {name:<56} {figures}: for information, not the target: above")
        print(
            f"    {args.latency_target_share:.0%} of the max rate the paced client's per-record "
            "produce() and callback, moto and the broker saturate the two cores)"
        )
    print(
        f"   (for comparison: the median produce round {produced:.1f} MiB/s is "
        f"{produced / best_put.mib_s:.0%} of phase a's best raw PUT mode, {best_put.mib_s:.1f} "
        "MiB/s, the denominator until 2026-11-24)"
    )
    # Before 2026-11-24 the budget took the p99 of sequential 1 KiB PUTs, a request the broker
    # never makes (each round uploads one segment per partition at once, which moto serves one
    # after another): printed for comparison with the figures recorded until then.
    sequential_budget = args.flush_interval_ms + 2 * percentile(run.small, 99) * ms
    for r in run.paced:
        p99 = percentile(r.latencies_s, 99) * ms
        print(
            f"   (for comparison @{r.label}: p99 {p99:.1f} vs {sequential_budget:.1f} ms with the "
            f"p99 of sequential {args.small_put_bytes} B PUTs, the budget until 2026-11-24)"
        )
    if run.timings:
        print()
        print("inside the broker (timing probes, bench/_timed_broker.py)")
        print("\n".join(run.timings))


if __name__ == "__main__":
    sys.exit(main())
