"""The memory attack of issue 22: many connections each announcing a huge request frame.

Starts etcd, moto's S3 server and one ``kafscale broker``, measures a normal client's acks=all
produce round trips (a 1 KiB batch each) alone, then opens ``--connections`` connections (from
four loopback addresses, as the per-address limit would refuse more from one) that each send
the length prefix of a ``--frame-mib`` MiB request and a few bytes, and measures the normal
client again while they hang there. Prints the broker's RSS before and at its peak, the request
memory the broker reports, and the normal client's p50/p99 alone and under attack. Before the
fix, each announced frame was allocated in full at once: three such connections took 300 MiB.
Run from the repository root::

    .venv/bin/python bench/memory_attack.py               # ~30 s
    .venv/bin/python bench/memory_attack.py --connections 2000 --budget-mib 128
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import time
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--frame-mib", type=int, default=100)
    parser.add_argument("--budget-mib", type=int, default=256, help="queued_max_request_bytes")
    parser.add_argument("--requests", type=int, default=100, help="normal round trips per phase")
    args = parser.parse_args(argv)
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
