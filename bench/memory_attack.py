"""The memory attack of issue 22: many connections each announcing a huge request frame.

Starts etcd, moto's S3 server and one ``kafscale broker``, measures a normal client's acks=all
produce round trips (a 1 KiB batch each) alone, then opens ``--connections`` connections (from
four loopback addresses, as the per-address limit would refuse more from one) that each send
the length prefix of a ``--frame-mib`` MiB request and a few bytes, and measures the normal
client again while they hang there. Prints the broker's RSS before and at its peak, the request
memory the broker reports, and the normal client's p50/p99 alone and under attack. Before the
fix, each announced frame was allocated in full at once: three such connections took 300 MiB.
``--names N`` runs the other attack instead: one connection names ``N`` made-up groups
(DescribeGroups, 1,000 per request) and ``N`` partition indices past a topic's end (Fetch,
1,000 per request), the state a broker used to keep for good per name; it prints the broker's
RSS and ``client_state`` before, right after, and once the made-up groups were let go.
Measured on a loaded 2-core machine with ``--names 20000`` (308 s: each made-up group costs a
lease transaction and a load in etcd, one group after another): RSS 103 MiB before, 122 MiB
right after with 463 groups still held, none held once they were let go. Before the fix every
name stayed: a runtime with two tasks and a lease per group, an event (~1 KiB) per partition
index, for good.
Run from the repository root::

    .venv/bin/python bench/memory_attack.py               # ~30 s
    .venv/bin/python bench/memory_attack.py --connections 2000 --budget-mib 128
    .venv/bin/python bench/memory_attack.py --names 20000  # ~1 min
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cluster import RawKafka, Sampler, Stack, create_topic, make_batch, percentile, rss_bytes

MiB = 1024 * 1024


def round_trips(bootstrap: str, count: int) -> list[float]:
    """Milliseconds of ``count`` acks=all produces of a 1 KiB batch on one connection."""
    kafka = RawKafka(bootstrap)
    batch = make_batch([b"x" * 1024])
    times = []
    try:
        for _ in range(count):
            started = time.perf_counter()
            code, _ = kafka.produce("normal", 0, batch)
            times.append((time.perf_counter() - started) * 1000)
            assert code == 0, code
    finally:
        kafka.close()
    return times


DESCRIBE_GROUPS, FETCH = 15, 1


def name_groups(kafka: RawKafka, count: int) -> None:
    groups = [f"made-up-{uuid.uuid4().hex}" for _ in range(count)]
    kafka.request(DESCRIBE_GROUPS, 5, {"groups": groups, "include_authorized_operations": False})


def name_partitions(kafka: RawKafka, topic: str, first: int, count: int) -> None:
    partition = {
        "current_leader_epoch": -1,
        "fetch_offset": 0,
        "last_fetched_epoch": -1,
        "log_start_offset": -1,
        "partition_max_bytes": 1024,
    }
    body = {
        "replica_id": -1,
        "max_wait": 0,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {
                "topic": topic,
                "partitions": [{**partition, "partition": first + i} for i in range(count)],
            }
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }
    kafka.request(FETCH, 12, body)


def names_attack(names: int) -> int:
    """One client naming ``names`` groups and partitions that do not exist."""
    with Stack(broker_env={"KAFSCALE_LOG__FLUSH_INTERVAL_MS": "20"}) as stack:
        broker = stack.start_broker()
        create_topic(broker.bootstrap, "normal", 1)
        round_trips(broker.bootstrap, 10)
        before = rss_bytes(broker.pid), broker.status()["client_state"]
        kafka = RawKafka(broker.bootstrap)
        started = time.perf_counter()
        try:
            for first in range(0, names, 1000):
                name_groups(kafka, min(1000, names - first))
                name_partitions(kafka, "normal", 1 + first, min(1000, names - first))
        finally:
            kafka.close()
        elapsed_s = time.perf_counter() - started
        flooded = rss_bytes(broker.pid), broker.status()["client_state"]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            state = broker.status()["client_state"]
            if not state["groups"] and not state["group_leases"]:
                break
            time.sleep(0.5)
        settled = rss_bytes(broker.pid), broker.status()["client_state"]
    print(f"{names} made-up groups and {names} made-up partitions named in {elapsed_s:.1f} s")
    for label, (rss, state) in (("before", before), ("right after", flooded), ("later", settled)):
        print(f"{label:>12}: broker RSS {rss / MiB:.0f} MiB, client_state {state}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--frame-mib", type=int, default=100)
    parser.add_argument("--budget-mib", type=int, default=256, help="queued_max_request_bytes")
    parser.add_argument("--requests", type=int, default=100, help="normal round trips per phase")
    parser.add_argument("--names", type=int, default=0, help="run the naming attack instead")
    args = parser.parse_args(argv)
    if args.names:
        return names_attack(args.names)
    env = {
        "KAFSCALE_LIMITS__QUEUED_MAX_REQUEST_BYTES": str(args.budget_mib * MiB),
        "KAFSCALE_LIMITS__MAX_FRAME_BYTES": str(args.frame_mib * MiB),
        "KAFSCALE_LOG__FLUSH_INTERVAL_MS": "20",
    }
    with Stack(broker_env=env) as stack:
        broker = stack.start_broker()
        create_topic(broker.bootstrap, "normal", 1)
        alone = round_trips(broker.bootstrap, args.requests)
        before = rss_bytes(broker.pid)
        sampler = Sampler(broker.pid, 0.02)
        sampler.start()
        with ExitStack() as stack_of_sockets:
            for i in range(args.connections):
                sock = stack_of_sockets.enter_context(socket.socket())
                sock.bind((f"127.0.0.{2 + i % 4}", 0))
                sock.connect(("127.0.0.1", broker.port))
                sock.sendall(struct.pack(">i", args.frame_mib * MiB - 1) + b"\0\0\0\x12")
            time.sleep(1)
            attacked = round_trips(broker.bootstrap, args.requests)
            memory = broker.status()["request_memory"]
        peak = sampler.stop()
    print(
        f"{args.connections} connections announcing {args.frame_mib} MiB each "
        f"(budget {args.budget_mib} MiB)\n"
        f"broker RSS: {before / MiB:.0f} MiB before, {peak / MiB:.0f} MiB at peak "
        f"(+{(peak - before) / MiB:.0f} MiB)\n"
        f"request memory: peak {memory['peak_bytes'] / MiB:.0f} MiB reserved, "
        f"{memory['waiting_connections']} connections waiting\n"
        f"normal client acks=all produce: alone p50 {percentile(alone, 50):.1f} ms "
        f"p99 {percentile(alone, 99):.1f} ms; under attack p50 {percentile(attacked, 50):.1f} ms "
        f"p99 {percentile(attacked, 99):.1f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
