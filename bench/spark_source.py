"""Rows/s read by the Spark data source versus a Kafka consumer through a broker (issue 21).

Starts etcd, moto's S3 server and one ``kafscale broker`` (``_cluster.Stack``), and for each case
(100-byte and 1 KiB values, uncompressed and zstd) produces ``--records`` records into a topic of
``--partitions`` partitions with confluent-kafka, then, in the same run:

a. the data source: ``spark.read.format("kafscale")`` on ``local[N]`` with an action that makes
   every row cross into Spark (``sum(length(value))``), once to warm up (worker start, numba's
   cached kernels), then ``--repeat`` timed runs, best kept;
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
from typing import Any

from _cluster import ACCESS_KEY, REGION, SECRET_KEY, Stack, create_topic

CASES = [
    ("100 B", 100, "none"),
    ("100 B", 100, "zstd"),
    ("1 KiB", 1024, "none"),
    ("1 KiB", 1024, "zstd"),
]


@dataclass
class Result:
    label: str
    codec: str
    records: int
    source_rows_s: float
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


def time_source(spark: Any, options: dict[str, str], records: int, repeat: int) -> float:
    best = float("inf")
    for attempt in range(repeat + 1):
        began = time.perf_counter()
        df = spark.read.format("kafscale").options(**options).load()
        rows, _ = df.selectExpr("count(*)", "sum(length(value))").first()
        elapsed = time.perf_counter() - began
        if rows != records:
            raise SystemExit(f"the data source read {rows} rows, not {records}")
        if attempt > 0:  # the first run starts Python workers and loads the kernels
            best = min(best, elapsed)
    return records / best


def time_decoder(options: dict[str, str], records: int) -> float:
    """GET every segment of the topic, then decode them all in this process (one core)."""
    from kafscale.pipeline import fetch
    from kafscale.pipeline.options import parse_read_options
    from kafscale.pipeline.source import _plan_now

    read = parse_read_options(options, streaming=False)
    tasks = _plan_now(read)
    store = fetch._store_for(read.connection)
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
    args = parser.parse_args()

    results = []
    with Stack(broker_env={"KAFSCALE_LOG__CACHE_BYTES": str(64 << 20)}) as stack:
        broker = stack.start_broker()
        spark = spark_session(args.cores)
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
                source = time_source(spark, options, args.records, args.repeat)
                decoder = time_decoder(options, args.records)
                consumer = time_consumer(
                    broker.bootstrap, topic, args.records, args.partitions, args.repeat
                )
                results.append(Result(label, codec, args.records, source, decoder, consumer))
                figures = f"source {source:,.0f}/s  decoder {decoder:,.0f}/s"
                print(f"  {figures}  consumer {consumer:,.0f}/s", flush=True)
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
    head = f"{'values':<7} {'codec':<5} {'data source':>14} {'decoder (1 core)':>17}"
    print(f"{head} {'consumer':>12} {'ratio':>6}")
    for r in results:
        print(
            f"{r.label:<7} {r.codec:<5} {r.source_rows_s:>12,.0f}/s {r.decoder_rows_s:>15,.0f}/s "
            f"{r.consumer_rows_s:>10,.0f}/s {r.source_rows_s / r.consumer_rows_s:>5.1f}x"
        )
    print()
    for r in results:
        verdict = "PASS" if r.source_rows_s >= 4 * r.consumer_rows_s else "MISS"
        print(f"target: data source >= 4 x consumer, {r.label} {r.codec}: {verdict}")
    small = [r for r in results if r.label == "100 B"]
    for r in small:
        verdict = "PASS" if r.source_rows_s >= 1_000_000 else "MISS"
        rate = f"{r.source_rows_s:,.0f}/s"
        print(f"target: >= 1 M rows/s of 100-byte records ({r.codec}): {rate} {verdict}")


if __name__ == "__main__":
    main()
