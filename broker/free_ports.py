"""Ports for a child process (or a server started later) to listen on, chosen beforehand.

A port-0 probe (bind to 0, read the port, close, hand the number on) picks from the kernel's
ephemeral range, the range every outgoing connection and every other port-0 socket draws from:
one of them can take the port between the probe and the child's bind ("address already in
use"). These ports are taken below that range instead. Used by the broker-process driver, the
test harness, the benches and ``EmbeddedEtcd`` (``kafscale local``'s etcd).
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Collection
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_ATTEMPTS = 200
# "i/n": take ports from slice i of n (see ``port_slice``); set per pytest-xdist worker.
PORT_SLICE_ENV = "KAFSCALE_PORT_SLICE"


def _below_ephemeral() -> tuple[int, int]:
    try:
        low = int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    first, last = 10000, max(10001, low - 64)
    return port_slice(first, last, os.environ.get(PORT_SLICE_ENV, ""))


def port_slice(first: int, last: int, spec: str) -> tuple[int, int]:
    """Slice ``i/n`` (from 0) of the range ``[first, last)``; the whole range for no or a bad spec.

    Processes that pick ports side by side (pytest-xdist workers, each starting brokers) take
    them from disjoint slices, so one cannot pick a port the other probed and has not bound yet
    (nor one the other's broker let go of for a moment to restart on it)."""
    try:
        index, count = (int(part) for part in spec.split("/"))
    except ValueError:
        return first, last
    if not 0 <= index < count or (last - first) // count < 64:
        return first, last
    width = (last - first) // count
    return first + index * width, first + (index + 1) * width


def _all_free(first: int, count: int) -> bool:
    try:
        for port in range(first, first + count):
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


def ports_free(ports: Collection[int]) -> bool:
    """Whether a listener that sets SO_REUSEADDR, as etcd (Go) does, can bind each of ``ports``
    on 127.0.0.1 (a probe, so only a hint). With it, a port whose last connections are still
    in TIME_WAIT, as a stopped etcd's are for a minute, counts as free."""
    try:
        for port in ports:
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(("127.0.0.1", port))
                probe.listen()
    except OSError:
        return False
    return True


def free_port_run(count: int = 1, avoid: Collection[int] = ()) -> int:
    """A port p with p ... p + count - 1 all free on 127.0.0.1, for a child to listen on.

    Taken below the kernel's ephemeral range: every other process (etcd, S3, clients' sockets)
    binds port 0 and gets a port from that range, so a port chosen from it could be handed out
    to one of them between the probe and the child's bind (seen: "address already in use").
    ``avoid``: ports promised to someone else that nobody listens on yet (``kafscale local``'s
    brokers, while its etcd picks its own ports)."""
    first, last = _below_ephemeral()
    for _ in range(_ATTEMPTS):
        port = random.randrange(first, last - count)
        if avoid and not set(range(port, port + count)).isdisjoint(avoid):
            continue
        if _all_free(port, count):
            return port
    raise RuntimeError(f"no {count} consecutive free ports")
