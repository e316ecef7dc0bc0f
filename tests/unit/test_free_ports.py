"""Ports handed to broker children (tests and benches): free, consecutive, and below the kernel's
ephemeral range, where no other process's port-0 socket can be given one before the child binds
it (a port-0 probe once lost that race: "address already in use")."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kafscale.broker import child_process
from kafscale.broker.child_process import free_port_run

pytestmark = pytest.mark.unit


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


@pytest.mark.parametrize("count", [1, 4])
def test_a_run_of_free_ports_below_the_ephemeral_range(count: int) -> None:
    first = free_port_run(count)
    assert first >= 10000 and first + count <= _ephemeral_low()
    sockets = [socket.socket() for _ in range(count)]
    try:
        for offset, sock in enumerate(sockets):
            sock.bind(("127.0.0.1", first + offset))  # each one free for the child to take
    finally:
        for sock in sockets:
            sock.close()


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", free_port_run()))
    try:
        busy, spare = taken.getsockname()[1], free_port_run()
        picks = iter([busy, spare])
        monkeypatch.setattr(child_process.random, "randrange", lambda *_: next(picks))
        assert free_port_run() == spare
    finally:
        taken.close()
