"""Materialise a topic into a Parquet dataset, incrementally.

Each run appends what was committed to the topic since the last run (``Trigger.AvailableNow``:
read up to the high watermarks seen at start, then stop); the checkpoint remembers where it
stopped, so running it from cron, Airflow or by hand never writes a record twice or skips one.
With ``--continuous`` it keeps running and picks up new records every ``--interval``.

Locally (next to ``kafscale local``; the connection falls back to the ``KAFSCALE_*`` variables)::

    python -m kafscale.pipeline.jobs.topic_to_parquet --topic orders --out lake/orders \\
        --etcd http://127.0.0.1:2379 --local-dir data/objects

Unchanged with ``spark-submit`` (the kafscale package installed on the driver and executors)::

    spark-submit pipeline/jobs/topic_to_parquet.py --topic orders --out s3a://lake/orders ...
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from kafscale.pipeline.options import connection_options, parse_connection


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topic", required=True, help="topic (or comma-separated topics)")
    parser.add_argument("--out", required=True, help="Parquet dataset path")
    parser.add_argument("--checkpoint", help="checkpoint path (default: <out>/_checkpoint)")
    parser.add_argument("--etcd", help="etcd endpoints (default: KAFSCALE_ETCD__ENDPOINTS)")
    parser.add_argument("--cluster", help="cluster name (default: KAFSCALE_CLUSTER)")
    parser.add_argument("--local-dir", help="storage.kind=local: the objects directory")
    parser.add_argument("--s3-endpoint", help="storage.kind=s3: endpoint URL (None: AWS)")
    parser.add_argument("--bucket", help="storage.kind=s3: bucket")
    parser.add_argument("--prefix", help="key prefix inside the bucket or directory")
    parser.add_argument("--starting-offsets", default="earliest", help="for the first run")
    parser.add_argument("--max-offsets-per-trigger", type=int, help="records per micro-batch")
    parser.add_argument("--continuous", action="store_true", help="keep running")
    parser.add_argument("--interval", default="10 seconds", help="with --continuous")
    parser.add_argument("--master", help="Spark master when run with python (default local[*])")
    return parser.parse_args(argv)


def source_options(args: argparse.Namespace) -> dict[str, str]:
    """The data source's options from the command line; unset connection options come from
    this process's KAFSCALE_* variables (resolved here, passed to Spark explicitly)."""
    given = {
        "etcd.endpoints": args.etcd,
        "cluster": args.cluster,
        "storage.prefix": args.prefix,
    }
    if args.local_dir:
        given |= {"storage.kind": "local", "storage.local_dir": args.local_dir}
    if args.bucket or args.s3_endpoint:
        given |= {"storage.kind": "s3", "storage.bucket": args.bucket}
        given |= {"storage.endpoint": args.s3_endpoint}
    connection = parse_connection({k: v for k, v in given.items() if v is not None})
    options = {
        **connection_options(connection),
        "subscribe": args.topic,
        "startingOffsets": args.starting_offsets,
    }
    if args.max_offsets_per_trigger:
        options["maxOffsetsPerTrigger"] = str(args.max_offsets_per_trigger)
    return options


def run(spark: Any, args: argparse.Namespace) -> Any:
    """Start the query; with AvailableNow, wait for it to finish. Returns the query."""
    checkpoint = args.checkpoint or os.path.join(args.out, "_checkpoint")
    rows = (
        spark.readStream.format("kafscale")
        .options(**source_options(args))
        .load()
        .selectExpr(
            "key",
            "value",
            "topic",
            "partition",
            "offset",
            "timestamp",
            "timestampType",
            "to_date(timestamp) AS date",
        )
    )
    writer = (
        rows.writeStream.format("parquet")
        .option("checkpointLocation", checkpoint)
        .partitionBy("date")
    )
    if args.continuous:
        writer = writer.trigger(processingTime=args.interval)
    else:
        writer = writer.trigger(availableNow=True)
    query = writer.start(args.out)
    if not args.continuous:
        query.awaitTermination()
    return query


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(f"kafscale-topic-to-parquet-{args.topic}")
    if args.master:  # spark-submit sets it; plain python gets Spark's default, local[*]
        builder = builder.master(args.master)
    spark = builder.getOrCreate()
    query = run(spark, args)
    if args.continuous:
        query.awaitTermination()
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    print(f"{sum(p['numInputRows'] for p in progress)} records appended to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
