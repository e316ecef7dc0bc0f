"""Rows/s read by the Spark data source versus a Kafka consumer through a broker (issue 21).

Starts etcd, moto's S3 server and one ``kafscale broker`` (``_cluster.Stack``), and for each case
(100-byte and 1 KiB values, uncompressed and zstd) produces ``--records`` records into a topic of
``--partitions`` partitions with confluent-kafka, then, in the same run:

a. the data source: ``spark.read.format("kafscale")`` on ``local[N]`` with an action that makes
   every row cross into Spark (``sum(length(value))``), once to warm up (worker start, numba's
   cached kernels), then ``--repeat`` timed runs, best kept; per store of ``--stores``: ``s3``
   (moto, as the broker wrote it) and ``local`` (the same objects copied into a directory and
   read with ``storage.kind=local``: KafScale's own cost without moto's on the same two cores),
   with the CPU seconds the query cost Spark's JVM, its Python workers, moto and the machine;
b. the decoder alone in this process (GET every segment, ``decode_records``): what one core does
   without Spark, for telling where time goes;
c. a confluent-kafka consumer reading the same topic from offset 0 through the broker
   (``assign``, ``fetch.queue.backoff.ms=0``), best of ``--repeat``.

It prints a table and the targets (data source >= 4 x the consumer; >= 1 M rows/s of 100-byte
records) with PASS/MISS. Run from the repository root::

    .venv/bin/python bench/spark_source.py                   # ~3-5 min on 2 cores
    .venv/bin/python bench/spark_source.py --records 200000  # quicker
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _cluster import ACCESS_KEY, REGION, SECRET_KEY, Stack, create_topic

CASES = [
    ("100 B", 100, "none"),
    ("100 B", 100, "zstd"),
    ("1 KiB", 1024, "none"),
    ("1 KiB", 1024, "zstd"),
]


@dataclass
class Cpu:
    """CPU seconds spent during one timed query, by whom, and its wall time."""

    wall_s: float = 0.0
    jvm_s: float = 0.0
    workers_s: float = 0.0
    moto_s: float = 0.0
    machine_s: float = 0.0


@dataclass
class Result:
    label: str
    codec: str
    records: int
    source_rows_s: dict[str, float]
    source_cpu: dict[str, Cpu]
    decoder_rows_s: float
    consumer_rows_s: float


def produce(
    bootstrap: str, topic: str, records: int, size: int, codec: str, partitions: int
) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": codec,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 500_000,
            "queue.buffering.max.kbytes": 1_048_576,
        }
    )
    # Values differ from record to record (a counter in front), as real ones do for zstd.
    filler = os.urandom(size // 2).hex().encode()[:size]
    for i in range(records):
        value = b"%010d" % i + filler[10:]
        while True:
            try:
                producer.produce(topic, value=value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    if left:
        raise SystemExit(f"{left} records were not acknowledged")


def spark_session(cores: int) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName("kafscale-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def source_options(stack: Stack, topic: str) -> dict[str, str]:
    return {
        "etcd.endpoints": stack.etcd_url,
        "cluster": stack.cluster,
        "storage.kind": "s3",
        "storage.endpoint": stack.s3_url,
        "storage.bucket": stack.bucket,
        "storage.region": REGION,
        "storage.access_key_id": ACCESS_KEY,
        "storage.secret_access_key": SECRET_KEY,
        "subscribe": topic,
        "storage.timeout_s": "120",  # moto on two loaded cores can take long for a GET
    }


def local_options(stack: Stack, topic: str, directory: Path) -> dict[str, str]:
    """The same topic read from a local directory holding a copy of its objects."""
    options = source_options(stack, topic)
    for name in list(options):
        if name.startswith("storage."):
            del options[name]
    return options | {"storage.kind": "local", "storage.local_dir": str(directory)}


def copy_objects(stack: Stack, directory: Path) -> int:
    """Every object of the bucket into ``directory`` under its key; returns the bytes copied."""
    client = stack.s3_client()
    copied = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=stack.bucket):
        for item in page.get("Contents", []):
            path = directory / item["Key"]
            if path.exists():
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            data = client.get_object(Bucket=stack.bucket, Key=item["Key"])["Body"].read()
            path.write_bytes(data)
            copied += len(data)
    return copied


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _own_cpu_s(pid: int) -> float:
    """utime + stime of a live process (not of its children)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _machine_cpu_s() -> float:
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:]
    busy = sum(int(f) for f in fields) - int(fields[3]) - int(fields[4])  # minus idle, iowait
    return busy / os.sysconf("SC_CLK_TCK")


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip()
    except OSError:
        return ""


def cpu_snapshot(moto_pid: int) -> tuple[float, float, float, float, float]:
    """(monotonic time, JVM, its Python workers, moto, machine) CPU seconds so far. Spark's
    JVM is this process's ``java`` child; the planner and worker processes are its children."""
    jvms = [pid for pid in _descendants(os.getpid()) if _comm(pid) == "java"]
    workers = [pid for jvm in jvms for pid in _descendants(jvm)]
    return (
        time.perf_counter(),
        sum(_own_cpu_s(pid) for pid in jvms),
        sum(_own_cpu_s(pid) for pid in workers),
        _own_cpu_s(moto_pid),
        _machine_cpu_s(),
    )


def time_source(
    spark: Any, options: dict[str, str], records: int, repeat: int, moto_pid: int
) -> tuple[float, Cpu]:
    """Best rows/s of ``repeat`` queries after a warm-up, and the CPU of that best query."""
    best = Cpu(wall_s=float("inf"))
    for attempt in range(repeat + 1):
        before = cpu_snapshot(moto_pid)
        df = spark.read.format("kafscale").options(**options).load()
        rows, _ = df.selectExpr("count(*)", "sum(length(value))").first()
        after = cpu_snapshot(moto_pid)
        if rows != records:
            raise SystemExit(f"the data source read {rows} rows, not {records}")
        spent = Cpu(*(b - a for a, b in zip(before, after, strict=True)))
        # The first run starts the Python workers and loads the kernels: not timed.
        if attempt > 0 and spent.wall_s < best.wall_s:
            best = spent
    return records / best.wall_s, best


def time_decoder(options: dict[str, str], records: int) -> float:
    """GET every segment of the topic, then decode them all in this process (one core)."""
    from kafscale.pipeline import fetch
    from kafscale.pipeline.options import parse_read_options
    from kafscale.pipeline.readers import _plan_now

    read = parse_read_options(options, streaming=False)
    tasks = _plan_now(read)
    store = fetch._store_for(read.connection.storage)
    loop = fetch._worker_loop()
    bodies = []
    for task in tasks:
        for segment in task.segments:
            key = fetch.keys.segment_object_key(
                read.connection.cluster,
                task.topic,
                task.topic_id,
                task.partition,
                segment.base,
                segment.epoch,
            )
            data = loop.run_until_complete(store.get(key))
            bodies.append((task, fetch._verified_body(key, data)))
    from kafscale.pipeline.decode import decode_records

    for task, body in bodies[:1]:  # loads numba's cached kernels
        decode_records(body, task.topic, task.partition, task.start, task.end, False)
    began = time.perf_counter()
    rows = 0
    for task, body in bodies:
        batch = decode_records(body, task.topic, task.partition, task.start, task.end, False)
        rows += 0 if batch is None else batch.num_rows
    elapsed = time.perf_counter() - began
    if rows != records:
        raise SystemExit(f"the decoder read {rows} rows, not {records}")
    return records / elapsed


def time_consumer(bootstrap: str, topic: str, records: int, partitions: int, repeat: int) -> float:
    from confluent_kafka import Consumer, TopicPartition

    best = float("inf")
    for _ in range(repeat):
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "bench",
                "enable.auto.commit": False,
                "fetch.queue.backoff.ms": 0,
            }
        )
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        began = time.perf_counter()
        seen = 0
        while seen < records:
            for message in consumer.consume(10_000, timeout=1.0):
                if message.error() is None:
                    seen += 1
        best = min(best, time.perf_counter() - began)
        consumer.close()
    return records / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records per case")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--cores", type=int, default=2, help="Spark's local[N]")
    parser.add_argument("--repeat", type=int, default=2, help="timed runs per reader (best kept)")
    parser.add_argument(
        "--sizes", default="100,1024", help="value sizes to run, of 100 and 1024 (comma-separated)"
    )
    parser.add_argument(
        "--stores",
        default="s3,local",
        help="where the data source reads from: s3 (moto), local (a copy in a directory)",
    )
    args = parser.parse_args()
    stores = [store.strip() for store in args.stores.split(",") if store.strip()]

    results = []
    with Stack(broker_env={"KAFSCALE_LOG__CACHE_BYTES": str(64 << 20)}) as stack:
        broker = stack.start_broker()
        spark = spark_session(args.cores)
        moto_pid = stack.s3.pid if stack.s3 is not None else 0
        try:
            sizes = {int(size) for size in args.sizes.split(",")}
            for i, (label, size, codec) in enumerate(CASES):
                if size not in sizes:
                    continue
                topic = f"bench-{i}"
                create_topic(broker.bootstrap, topic, args.partitions)
                began = time.perf_counter()
                produce(broker.bootstrap, topic, args.records, size, codec, args.partitions)
                took = time.perf_counter() - began
                print(f"{label} {codec}: produced {args.records} in {took:.1f} s", flush=True)
                options = source_options(stack, topic)
                rates, cpus = {}, {}
                for store in stores:
                    if store == "local":
                        copy_objects(stack, stack.workdir / "objects-copy")
                        read = local_options(stack, topic, stack.workdir / "objects-copy")
                    else:
                        read = options
                    rates[store], cpus[store] = time_source(
                        spark, read, args.records, args.repeat, moto_pid
                    )
                    print(f"  data source from {store}: {rates[store]:,.0f}/s", flush=True)
                decoder = time_decoder(options, args.records)
                consumer = time_consumer(
                    broker.bootstrap, topic, args.records, args.partitions, args.repeat
                )
                results.append(Result(label, codec, args.records, rates, cpus, decoder, consumer))
                print(f"  decoder {decoder:,.0f}/s  consumer {consumer:,.0f}/s", flush=True)
        finally:
            spark.stop()
    report(results, args)


def report(results: list[Result], args: argparse.Namespace) -> None:
    load = os.getloadavg()
    print()
    print(
        f"records/case {args.records:,}, partitions {args.partitions}, Spark local[{args.cores}], "
        f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    )
    stores = list(results[0].source_rows_s) if results else []
    head = f"{'values':<7} {'codec':<5}" + "".join(f" {'source ' + st:>15}" for st in stores)
    print(f"{head} {'decoder (1 core)':>17} {'consumer':>12}")
    for r in results:
        row = f"{r.label:<7} {r.codec:<5}"
        row += "".join(f" {r.source_rows_s[st]:>13,.0f}/s" for st in stores)
        print(f"{row} {r.decoder_rows_s:>15,.0f}/s {r.consumer_rows_s:>10,.0f}/s")
    print()
    print(
        "CPU seconds of the best timed query (machine: every process's, of cores x wall); "
        "'alone': rows/s if the query's own CPU (JVM + workers + moto) had the cores to itself"
    )
    for r in results:
        for store, cpu in r.source_cpu.items():
            own = cpu.jvm_s + cpu.workers_s + cpu.moto_s
            alone = r.records / max(own / args.cores, 1e-9)
            print(
                f"  {r.label} {r.codec} {store:<5}: wall {cpu.wall_s:.2f}  JVM {cpu.jvm_s:.2f}  "
                f"Python workers {cpu.workers_s:.2f}  moto {cpu.moto_s:.2f}  "
                f"machine {cpu.machine_s:.2f}  alone {alone:,.0f}/s"
            )
    print()
    for r in results:
        for store, rate in r.source_rows_s.items():
            verdict = "PASS" if rate >= 4 * r.consumer_rows_s else "MISS"
            ratio = rate / r.consumer_rows_s
            print(
                f"target: data source ({store}) >= 4 x consumer, {r.label} {r.codec}: "
                f"{ratio:.1f}x {verdict}"
            )
    for r in results:
        if r.label != "100 B":
            continue
        for store, rate in r.source_rows_s.items():
            verdict = "PASS" if rate >= 1_000_000 else "MISS"
            print(
                f"target: >= 1 M rows/s of 100-byte records ({store}, {r.codec}): "
                f"{rate:,.0f}/s {verdict}"
            )


if __name__ == "__main__":
    main()
