"""The transactional fault campaign: exactly-once under crashed, hung and restarted brokers, a
paused etcd and a paused object store, directly or through a ``kafscale proxy``.

Starts etcd, moto's S3 server and ``--brokers`` ``kafscale broker`` processes (as
``bench/chaos.py`` does, with its supervisor and its faults), and runs these clients
(confluent-kafka unless said otherwise; librdkafka keeps transaction protocol v1, so every
partition's first batch of a transaction is verified, KIP-890 part 1):

* ``--txn-producers`` transactional producers (``transactional.id`` ``chaos-txn-<i>``), each
  writing transactions of ``--per-txn`` records spread over the ``--partitions`` partitions of
  topic ``txn-out`` (shared by all producers), and aborting ``--abort-share`` of them on
  purpose;
* ``--ctp-workers`` consume-transform-produce workers: worker ``w`` reads partition ``w`` of
  ``txn-in`` (filled with ``--input-records`` records per partition before the faults start),
  writes one output per input record to partition ``w`` of ``ctp-out`` and commits the input
  offsets with ``send_offsets_to_transaction`` (group ``ctp-<w>``) in the same transaction, in
  transactions of up to ``--per-txn`` records, aborting ``--abort-share`` of them and then
  rewinding to the last committed offset;
* ``--java-producers`` transactional producers of the official Java client (``ChaosTxn.java``,
  kafka-clients 4.x: transaction protocol v2, KIP-890 part 2: partitions added by Produce v12,
  the epoch bumped at every EndTxn v5), as the librdkafka ones, ``transactional.id``
  ``java-txn-<i>``; its jars come from the test harness's cache (run one Java client test
  once);
* ``--idempotent`` plain idempotent producers (``bench/chaos.py``'s, on topic ``chaos``),
  checked as that campaign checks them.

Faults, for ``--duration-s`` (or ``--faults``), one every 1-4 s chosen with ``--seed``: those of
``bench/chaos.py`` (``kill``, ``stop``, ``term`` a broker; pause ``etcd`` or the ``store``),
and with ``--via-proxy`` also ``proxy``: SIGKILL the proxy and restart it on its port.

With ``--via-proxy`` every client (producers, workers, the checker) talks to one ``kafscale
proxy`` only; its brokers are never named to them.

Each transaction ends with one of these outcomes, recorded by the client that ran it:
``committed`` (commit_transaction returned), ``aborted`` (aborted on purpose, or never asked to
commit: a produce failed first), ``commit_failed`` (commit raised an abortable error and the
abort then succeeded), ``indeterminate`` (the commit met a fatal error, e.g. fenced, or the
producer gave up: the outcome is the coordinator's). The check then reads both output topics
with a ``read_committed`` consumer, up to each partition's high watermark, and counts:

* ``committed_missing`` / ``committed_partial``: a committed transaction with none / some of its
  records visible; ``duplicated``: a record visible more than once;
* ``aborted_visible``, ``commit_failed_visible``: any record of such a transaction visible;
* ``indeterminate_partial``: a transaction whose outcome the client did not learn, visible only
  in part (all or nothing is the rule);
* ``reordered``: a producer's committed records out of send order in a partition;
* ``stalled_partitions``: partitions a ``read_committed`` consumer could not read to the high
  watermark within ``--read-timeout-s`` (a last stable offset stuck behind a hanging
  transaction);
* for the workers, ``ctp_mismatch``: the committed input offset of a worker's group is ``C``
  but the visible outputs are not exactly one per input record ``0..C-1`` in order;
* ``foreign``: visible records no transaction wrote;
* ``clients_hung``: clients still running ``--join-timeout-s`` after they were told to stop (a
  client blocked in a call for good; named, not waited for, and the last frames of its
  stack printed on stderr: the client call that never returned).

It also reads everything with ``read_uncommitted`` and reports what is there (aborted records
included, as expected). Exit status 1 if any count is not 0. ``--client-conf KEY=VALUE`` adds a
librdkafka setting to the transactional clients and the checkers. Loopback only, bounded in
time (faults for ``--duration-s``, then bounded waits)::

    .venv/bin/python bench/chaos_txn.py --duration-s 180 --seed 1
    .venv/bin/python bench/chaos_txn.py --duration-s 180 --seed 2 --via-proxy
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import chaos
from _cluster import Stack, create_topic, wait_for
from _txn_check import ANOMALIES, check_ctp, check_txns, group_offsets, locate, read_topic
from _txn_clients import (
    CLIENT_CONF,
    COMMITTED,
    CTP_TOPIC,
    IN_TOPIC,
    INDETERMINATE,
    TXN_TOPIC,
    Journal,
    Txn,
    java_command,
    produce_one,
    run_ctp_worker,
    run_java_producer,
    run_txn_producer,
)
from chaos import Acked, Cluster, Slot, check, inject, read_log, run_producer
from confluent_kafka import Producer

from kafscale.broker.child_process import KAFSCALE, BrokerProcess, free_port_run

FAULTS = (*chaos.FAULTS, "proxy")

# --- the proxy -----------------------------------------------------------------------------------


class Proxy:
    """A ``kafscale proxy`` on a port a restart keeps."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.slot = Slot(free_port_run(), free_port_run())
        self.restarts = 0

    def start(self) -> None:
        env = self.stack.env(self.slot.port, self.slot.admin_port)  # storage is ignored
        self.slot.process = BrokerProcess(
            env=env,
            log_path=self.stack.workdir / "proxy.log",
            port=self.slot.port,
            admin_port=self.slot.admin_port,
            command=[KAFSCALE, "proxy"],
        )
        self.slot.process.start(timeout_s=180)

    def kill_and_restart(self, rng: random.Random) -> str:
        process = self.slot.process
        assert process is not None
        process.signal(signal.SIGKILL)
        process.wait(30)
        time.sleep(rng.uniform(0.5, 2.0))
        self.start()
        self.restarts += 1
        return f"kill proxy :{self.slot.port}"

    def close(self) -> None:
        if self.slot.process is not None:
            self.slot.process.kill()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.slot.port}"


# --- the campaign ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=180)
    parser.add_argument("--faults", type=int, default=0, help="stop after this many (0: none)")
    parser.add_argument("--kinds", default=",".join(FAULTS), help=f"from {','.join(FAULTS)}")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--ttl", type=int, default=4, help="broker session TTL, seconds")
    parser.add_argument("--max-stop-s", type=float, default=10)
    parser.add_argument("--txn-producers", type=int, default=2)
    parser.add_argument("--ctp-workers", type=int, default=2)
    parser.add_argument(
        "--java-producers", type=int, default=1, help="Java client (transaction protocol v2)"
    )
    parser.add_argument("--idempotent", type=int, default=0, help="chaos.py's plain producers")
    parser.add_argument("--rate", type=float, default=20, help="records/s per plain producer")
    parser.add_argument("--partitions", type=int, default=4, help="of txn-out")
    parser.add_argument("--per-txn", type=int, default=10)
    parser.add_argument("--abort-share", type=float, default=0.25)
    parser.add_argument("--pause-s", type=float, default=0.05, help="between transactions")
    parser.add_argument("--input-records", type=int, default=20_000, help="per worker")
    parser.add_argument("--read-timeout-s", type=float, default=180)
    parser.add_argument("--via-proxy", action="store_true", help="every client to one proxy")
    parser.add_argument(
        "--client-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a librdkafka setting for the transactional clients and checkers (repeatable)",
    )
    parser.add_argument(
        "--join-timeout-s",
        type=float,
        default=150,
        help="how long the clients may take to finish once told to stop (the rest are hung)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    return parser.parse_args(argv)


def fill_input(bootstrap: str, workers: int, records: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "log_level": 0})
    for worker in range(workers):
        for offset in range(records):
            produce_one(producer, IN_TOPIC, worker, b"in%d-%d" % (worker, offset))
    if producer.flush(300):
        raise RuntimeError("the input records were not all acknowledged")


def start_clients(
    args: argparse.Namespace,
    bootstrap: str,
    stop: threading.Event,
    journal: Journal,
    acked: Acked,
    log_dir: Path,
) -> list[threading.Thread]:
    """Every client in a thread of its own, running until ``stop`` is set."""
    shared = (bootstrap, args, stop, journal)
    targets: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
        *((run_txn_producer, (i, *shared)) for i in range(args.txn_producers)),
        *((run_ctp_worker, (w, *shared)) for w in range(args.ctp_workers)),
        *((run_java_producer, (i, *shared, log_dir)) for i in range(args.java_producers)),
        *((run_producer, (i, bootstrap, args.rate, stop, acked)) for i in range(args.idempotent)),
    ]
    threads = [
        threading.Thread(target=t, args=a, daemon=True, name=f"{t.__name__}-{a[0]}")
        for t, a in targets
    ]
    for thread in threads:
        thread.start()
    return threads


def run_faults(
    args: argparse.Namespace, cluster: Cluster, proxy: Proxy | None, rng: random.Random
) -> Iterator[tuple[str, str]]:
    """Inject faults for the campaign's duration; yields each one's kind and description."""
    kinds = [k for k in args.kinds.split(",") if k in FAULTS and (k != "proxy" or proxy)]
    started = time.monotonic()
    done = 0
    while time.monotonic() - started < args.duration_s:
        if args.faults and done >= args.faults:
            return
        time.sleep(rng.uniform(1.0, 4.0))
        kind = rng.choice(kinds)
        if kind == "proxy":
            assert proxy is not None
            what = proxy.kill_and_restart(rng)
        else:
            what = inject(kind, cluster, rng, args.max_stop_s)
        done += 1
        yield kind, f"{time.monotonic() - started:7.1f}s  {what}"


def campaign(args: argparse.Namespace, stack: Stack, cluster: Cluster) -> dict[str, Any]:
    rng = random.Random(args.seed)
    for slot in cluster.slots:
        cluster.start(slot)
    proxy = Proxy(stack) if args.via_proxy else None
    try:
        if proxy is not None:
            proxy.start()
        bootstrap = proxy.bootstrap if proxy else cluster.bootstrap
        create_topic(bootstrap, TXN_TOPIC, args.partitions)
        create_topic(bootstrap, CTP_TOPIC, max(args.ctp_workers, 1))
        create_topic(bootstrap, IN_TOPIC, max(args.ctp_workers, 1))
        if args.idempotent:
            create_topic(bootstrap, chaos.TOPIC, args.idempotent)
        fill_input(bootstrap, args.ctp_workers, args.input_records)
        acked, stop, journal = Acked(), threading.Event(), Journal()
        threads = start_clients(args, bootstrap, stop, journal, acked, stack.workdir)
        started = time.monotonic()
        faults: Counter[str] = Counter()
        for kind, what in run_faults(args, cluster, proxy, rng):
            faults[kind] += 1
            print(what, flush=True)
        for slot in cluster.slots:  # everything back before the clients finish
            if slot.process is None or not slot.process.alive:
                cluster.restart(slot)
        stop.set()
        deadline = time.monotonic() + args.join_timeout_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        hung = [thread.name for thread in threads if thread.is_alive()]
        print_stacks([thread for thread in threads if thread.is_alive()])
        wait_for(lambda: all(s.process and s.process.alive for s in cluster.slots), 30)
        figures = verify(args, bootstrap, journal, acked)
        if args.keep and failed({**figures, "clients_hung": []}):
            save_bucket(stack)
        figures.update(
            duration_s=round(time.monotonic() - started, 1),
            faults=sum(faults.values()),
            faults_by_kind=dict(sorted(faults.items())),
            broker_restarts=cluster.restarts,
            proxy_restarts=proxy.restarts if proxy else 0,
            clients_hung=hung,
        )
        return figures
    finally:
        if proxy is not None:
            proxy.close()


def print_stacks(threads: list[threading.Thread]) -> None:
    """Where each hung client is blocked, on stderr: which client call never returned (a
    librdkafka ``send_offsets_to_transaction`` past its timeout, a commit retried, ...) is
    what tells a client bug from a broker that never answered. py-spy is not on every
    machine; the campaign's own frames are."""
    frames = sys._current_frames()
    for thread in threads:
        frame = frames.get(thread.ident or 0)
        if frame is not None:
            stack = "".join(traceback.format_stack(frame)[-6:])
            print(f"--- hung client {thread.name}:\n{stack}", file=sys.stderr, flush=True)


def verify(
    args: argparse.Namespace, bootstrap: str, journal: Journal, acked: Acked
) -> dict[str, Any]:
    """Read everything back and count (see the module's docstring)."""
    topics = ((TXN_TOPIC, args.partitions), (CTP_TOPIC, max(args.ctp_workers, 1)))
    raw_logs = [
        read_topic(bootstrap, topic, n, "read_uncommitted", args.read_timeout_s)
        for topic, n in topics
    ]
    committed_logs = [  # to the high watermarks: a stuck last stable offset is a stall
        read_topic(bootstrap, topic, n, "read_committed", args.read_timeout_s, raw.ends)
        for (topic, n), raw in zip(topics, raw_logs, strict=True)
    ]
    txns = list(journal.txns)
    visible, raw = locate(*committed_logs), locate(*raw_logs)
    counts = check_txns(txns, visible)
    offsets = group_offsets(bootstrap, args.ctp_workers)
    counts["ctp_mismatch"] = check_ctp(committed_logs[1], offsets)
    counts["stalled_partitions"] = sum(len(log.stalled) for log in committed_logs)
    figures: dict[str, Any] = {
        "transactions": len(txns),
        "outcomes": dict(sorted(Counter(t.outcome or "unfinished" for t in txns).items())),
        "outcomes_by_client": {
            kind: dict(
                sorted(
                    Counter(t.outcome or "unfinished" for t in txns if client(t) == kind).items()
                )
            )
            for kind in sorted({client(t) for t in txns})
        },
        "records_committed_visible": sum(map(len, visible.values())),
        "records_uncommitted_visible": sum(map(len, raw.values())),
        "not_committed_records_in_log": sum(
            v in raw for t in txns if t.outcome != COMMITTED for _, v in t.records
        ),
        "indeterminate_visible": sum(
            any(v in visible for _, v in t.records) for t in txns if t.outcome == INDETERMINATE
        ),
        "ctp_committed_offsets": offsets,
        "stalled": {
            f"{topic}/{p}@{position}": log.ends[p]
            for (topic, _), log in zip(topics, committed_logs, strict=True)
            for p, position in log.stalled.items()
        },
        "client_errors": dict(sorted(journal.errors.items())),
        "checker_errors": {
            f"{isolation} {topic}/{where}": n
            for isolation, logs in (("committed", committed_logs), ("uncommitted", raw_logs))
            for (topic, _), log in zip(topics, logs, strict=True)
            for where, n in log.errors.items()
        },
        "producer_restarts": dict(sorted(journal.restarts.items())),
        "partly_visible": partly_visible(txns, visible, raw),
        **counts,
    }
    if args.idempotent:
        log, ends = read_log(bootstrap, args.idempotent)
        plain = check(acked, log, ends)
        figures["idempotent"] = {"acked": len(acked.where), "not_acked": acked.failed, **plain}
    return figures


def save_bucket(stack: Stack) -> None:
    """Every object of the bucket into ``<work dir>/bucket/`` (the S3 server keeps them in
    memory only), with the etcd data the work dir holds: what is needed to look into an
    anomaly after the run."""
    client = stack.s3_client()
    target = stack.workdir / "bucket"
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=stack.bucket):
        for item in page.get("Contents", []):
            path = target / item["Key"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(client.get_object(Bucket=stack.bucket, Key=item["Key"])["Body"].read())
    print(f"objects saved in {target}", flush=True)


def partly_visible(
    txns: list[Txn],
    visible: dict[bytes, list[tuple[int, int]]],
    raw: dict[bytes, list[tuple[int, int]]],
    limit: int = 10,
) -> list[str]:
    """The first ``limit`` transactions partly visible to read_committed, each as
    ``producer#number outcome: partition@offset`` of its hidden records (where
    read_uncommitted found them), for looking into an anomaly."""
    found = []
    for txn in txns:
        hidden = [value for _, value in txn.records if value not in visible]
        if hidden and len(hidden) < len(txn.records):
            places = sorted({f"{p}@{o}" for v in hidden for p, o in raw.get(v, [])})
            found.append(f"{txn.producer}#{txn.number} {txn.outcome}: {' '.join(places[:12])}")
    return found[:limit]


def client(txn: Txn) -> str:
    """The kind of client that ran ``txn``: ``chaos-txn``, ``ctp`` or ``java-txn``."""
    return txn.producer.rsplit("-", 1)[0]


def failed(figures: dict[str, Any]) -> bool:
    keys = (*ANOMALIES, "ctp_mismatch", "stalled_partitions", "clients_hung")
    plain = figures.get("idempotent", {})
    return any(figures[k] for k in keys) or any(
        plain.get(k) for k in ("lost", "duplicated", "misplaced", "reordered")
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.java_command = java_command() if args.java_producers else []
    CLIENT_CONF.update(item.split("=", 1) for item in args.client_conf)
    env = {
        "KAFSCALE_ETCD__SESSION_TTL_S": str(args.ttl),
        "KAFSCALE_LOG__FLUSH_INTERVAL_MS": "50",
        "KAFSCALE_LIMITS__SHUTDOWN_GRACE_S": "5",
        "KAFSCALE_ETCD__TIMEOUT_S": "2",
    }
    with Stack(cluster="chaos-txn", broker_env=env, keep_workdir=args.keep) as stack:
        print(f"work dir {stack.workdir}", flush=True)
        cluster = Cluster(stack, args.brokers)
        try:
            figures = campaign(args, stack, cluster)
        finally:
            cluster.close()
    print(json.dumps(figures, indent=1 if not args.json else None))
    return 1 if failed(figures) else 0


if __name__ == "__main__":
    sys.exit(main())
