"""Ports for the children and servers a test starts, and ports nothing listens on.

``free_port_run`` and ``free_ports`` pick below the kernel's ephemeral range
(``kafscale.broker.free_ports``, shared with the benches and ``EmbeddedEtcd``), so that no other
process's port-0 socket can take a chosen port between the probe and the child's bind (brokers
of ``kafscale local`` listen on --port, --port + 1...). ``closed_port`` is the one port-0 probe
left on purpose: a test of "nobody answers there" needs a port nothing listens on, not one a
child will take.
"""

from __future__ import annotations

import socket
from collections.abc import Collection
from pathlib import Path

from kafscale.broker.free_ports import free_port_run

__all__ = ["closed_port", "ephemeral_low", "free_port_run", "free_ports", "listener_ports"]


def free_ports(count: int, avoid: Collection[int] = ()) -> list[int]:
    """``count`` distinct free ports (one consecutive run), for a child's several listeners;
    none of ``avoid`` (ports promised to a child that has not bound them yet)."""
    first = free_port_run(count, avoid)
    return list(range(first, first + count))


def listener_ports(*names: str) -> dict[str, int]:
    """A free port for each listener name, as ``KAFSCALE_LISTENERS`` builders take them."""
    return dict(zip(names, free_ports(len(names)), strict=True))


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on: connecting to it is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (where port-0 sockets get theirs)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
