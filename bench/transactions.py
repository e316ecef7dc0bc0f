"""Transactional produce throughput versus idempotent produce, in the same run.

Starts etcd, moto's S3 server and one ``kafscale broker`` process, then, with confluent-kafka
(1 KiB records, acks=all, linger.ms=5, 3 partitions):

a. idempotent: ``--records`` records as fast as the client pushes them;
b. transactional: the same number in transactions of ``--per-txn`` records (100 by default),
   each begun, produced and committed before the next (how a consume-transform-produce loop
   runs), so every transaction pays AddPartitionsToTxn, the flush and EndTxn with its markers;
c. the commit latency (commit_transaction() call to return) p50/p99 of those transactions.

Prints the figures and the machine's load average (the numbers move with it). Everything it
starts is stopped at the end. Run from the repository root::

    .venv/bin/python bench/transactions.py                  # ~30 s on 2 cores
    .venv/bin/python bench/transactions.py --records 50000 --per-txn 1000
"""

from __future__ import annotations

import argparse
import os
import time

from _cluster import Stack, create_topic, percentile
from confluent_kafka import Producer

TOPIC_IDEMPOTENT = "bench-idempotent"
TOPIC_TXN = "bench-txn"
PARTITIONS = 3
VALUE = b"x" * 1024


def idempotent(bootstrap: str, records: int) -> float:
    """Records per second of an idempotent producer."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                p.produce(TOPIC_IDEMPOTENT, VALUE, partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.01)
    p.flush(120)
    return records / (time.perf_counter() - started)


def transactional(bootstrap: str, records: int, per_txn: int) -> tuple[float, list[float]]:
    """Records per second in transactions of ``per_txn``, and each commit's seconds."""
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "bench-txn", "linger.ms": 5})
    p.init_transactions(30)
    commits: list[float] = []
    started = time.perf_counter()
    for first in range(0, records, per_txn):
        p.begin_transaction()
        for i in range(first, min(first + per_txn, records)):
            while True:
                try:
                    p.produce(TOPIC_TXN, VALUE, partition=i % PARTITIONS)
                    break
                except BufferError:
                    p.poll(0.01)
        before = time.perf_counter()
        p.commit_transaction(60)
        commits.append(time.perf_counter() - before)
    return records / (time.perf_counter() - started), commits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--per-txn", type=int, default=100)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    with Stack(cluster="txn", keep_workdir=args.keep) as stack:
        broker = stack.start_broker()
        print(f"work dir {stack.workdir}; load average {os.getloadavg()[0]:.2f}", flush=True)
        create_topic(broker.bootstrap, TOPIC_IDEMPOTENT, PARTITIONS)
        create_topic(broker.bootstrap, TOPIC_TXN, PARTITIONS)
        idempotent(broker.bootstrap, min(args.records, 2000))  # warm-up, not scored
        plain = idempotent(broker.bootstrap, args.records)
        txn, commits = transactional(broker.bootstrap, args.records, args.per_txn)
        mib = len(VALUE) / 2**20
        print(f"records {args.records} of 1 KiB, {PARTITIONS} partitions, one broker")
        print(f"idempotent     {plain:10.0f} records/s  {plain * mib:7.1f} MiB/s")
        print(
            f"transactional  {txn:10.0f} records/s  {txn * mib:7.1f} MiB/s"
            f"  ({args.per_txn} records per transaction, {len(commits)} transactions,"
            f" {txn / plain:.0%} of idempotent)"
        )
        print(
            f"commit latency p50 {percentile(commits, 50) * 1000:.1f} ms"
            f"  p99 {percentile(commits, 99) * 1000:.1f} ms"
        )
        print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
