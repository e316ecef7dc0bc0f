"""Runs of consecutive free ports for `kafscale local` (brokers listen on --port, --port + 1...).

They are taken below the kernel's ephemeral range: every other process (the embedded etcd, the
admin ports, clients' sockets) binds port 0 and gets a port from that range, so a run chosen
from it could be handed out to one of them between the probe and the bind (seen once:
"cannot listen on 127.0.0.1:38512: address already in use").
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _below_ephemeral() -> tuple[int, int]:
    try:
        low = int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return 10000, max(10001, low - 64)


def free_port_run(count: int) -> int:
    """A port p with p ... p + count - 1 all free, below the ephemeral range."""
    first, last = _below_ephemeral()
    for _ in range(200):
        port = random.randrange(first, last - count)
        try:
            for offset in range(count):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port + offset))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no {count} consecutive free ports")
