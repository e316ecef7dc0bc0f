"""Ports handed to broker children (tests and benches) and to ``kafscale local``'s etcd: free,
consecutive, and below the kernel's ephemeral range, where no other process's port-0 socket can
be given one before the child binds it (a port-0 probe once lost that race: "address already in
use"); explicit ports are kept; etcd keeps off the ports promised to ``kafscale local``'s
brokers."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from harness.ports import ephemeral_low

from kafscale.broker import free_ports
from kafscale.broker.free_ports import free_port_run
from kafscale.broker.local import LocalOptions
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd, choose_ports

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("count", [1, 4])
def test_a_run_of_free_ports_below_the_ephemeral_range(count: int) -> None:
    first = free_port_run(count)
    assert first >= 10000 and first + count <= ephemeral_low()
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
        monkeypatch.setattr(free_ports.random, "randrange", lambda *_: next(picks))
        assert free_port_run() == spare
    finally:
        taken.close()


def test_ports_to_avoid_are_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run overlapping a promised port is skipped, though nothing listens there yet."""
    spare = free_port_run(2)
    promised = spare + 100
    picks = iter([promised - 1, promised, spare])
    monkeypatch.setattr(free_ports.random, "randrange", lambda *_: next(picks))
    assert free_port_run(2, avoid={promised}) == spare


def test_embedded_etcd_picks_its_own_ports_below_the_ephemeral_range(tmp_path: Path) -> None:
    """``kafscale local`` and the fixtures give no ports: both come from below the range."""
    etcd = EmbeddedEtcd(tmp_path, binary=Path("/bin/true"))
    assert etcd.client_port != etcd.peer_port
    for port in (etcd.client_port, etcd.peer_port):
        assert 10000 <= port < ephemeral_low()
    assert f"--listen-client-urls=http://127.0.0.1:{etcd.client_port}" in etcd.command()


def test_embedded_etcd_keeps_the_ports_it_is_given(tmp_path: Path) -> None:
    etcd = EmbeddedEtcd(tmp_path, client_port=40001, peer_port=40002, binary=Path("/bin/true"))
    assert (etcd.client_port, etcd.peer_port) == (40001, 40002)
    client, peer = choose_ports(None, 40002)
    assert peer == 40002 and client != 40002 and client < ephemeral_low()
    client, peer = choose_ports(40001, None)
    assert client == 40001 and peer != 40001 and peer < ephemeral_low()


def test_local_etcd_keeps_off_the_ports_of_the_brokers_and_the_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``kafscale local --port P --brokers 3 --proxy`` listens on P..P+3 once etcd is up."""
    spare = free_port_run(2)
    port = spare + 100
    options = LocalOptions(Path("/data"), brokers=3, port=port, host="127.0.0.1", proxy=True)
    assert list(options.listen_ports()) == [port, port + 1, port + 2, port + 3]
    picks = iter([port - 1, port + 3, spare])  # each run of two overlaps a promised port
    monkeypatch.setattr(free_ports.random, "randrange", lambda *_: next(picks))
    assert choose_ports(None, None, options.listen_ports()) == (spare, spare + 1)
