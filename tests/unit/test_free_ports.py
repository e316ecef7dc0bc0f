"""Ports handed to broker children (tests and benches) and to ``kafscale local``'s etcd: free,
consecutive, and below the kernel's ephemeral range, where no other process's port-0 socket can
be given one before the child binds it (a port-0 probe once lost that race: "address already in
use"); explicit ports are kept; etcd keeps off every port promised to ``kafscale local``'s
brokers and proxy or given by the user."""

from __future__ import annotations

import socket
from collections.abc import Collection
from pathlib import Path

import pytest
from harness.ports import ephemeral_low

from kafscale.broker import free_ports, local
from kafscale.broker.app import StartupError
from kafscale.broker.config import BrokerSettings
from kafscale.broker.free_ports import free_port_run
from kafscale.broker.local import LocalOptions, promised_ports
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


def _given_ports(port: int) -> BrokerSettings:
    """``kafscale local --listener-port P+10 --listener-admin-port P+20 --listeners
    PLAINTEXT://...:P+30,EXTERNAL://...:P+31``: none of them listens before etcd starts."""
    return BrokerSettings(
        listener={"port": port + 10, "admin_port": port + 20},
        listeners=f"PLAINTEXT://127.0.0.1:{port + 30},EXTERNAL://127.0.0.1:{port + 31}",
        listener_security_protocol_map="PLAINTEXT:PLAINTEXT,EXTERNAL:PLAINTEXT",
    )


@pytest.mark.parametrize("proxy", [False, True])
def test_local_etcd_keeps_off_every_port_the_user_gave(
    monkeypatch: pytest.MonkeyPatch, proxy: bool
) -> None:
    spare = free_port_run(2)
    port = spare + 100
    options = LocalOptions(Path("/data"), brokers=2, port=port, host="127.0.0.1", proxy=proxy)
    kafka = {port, port + 1, port + 2} if proxy else {port, port + 1}
    given = {port + 10, port + 20, port + 21, port + 30, port + 31}  # admin: one per broker
    promised = promised_ports(_given_ports(port), options)
    assert promised == kafka | given
    # each run of two etcd could take overlaps one of them but the last
    picks = iter([*(p - 1 for p in sorted(given)), spare])
    monkeypatch.setattr(free_ports.random, "randrange", lambda *_: next(picks))
    assert choose_ports(None, None, promised) == (spare, spare + 1)


def test_the_default_admin_port_is_no_promise_in_local_mode() -> None:
    """Local brokers take admin ports the kernel picks unless one is given (8080 is not used:
    it would be one port for several brokers)."""
    options = LocalOptions(Path("/data"), brokers=2, port=19092, host="127.0.0.1")
    assert promised_ports(BrokerSettings(), options) == {19092, 19093, 9092}


async def test_kafscale_local_starts_etcd_away_from_the_promised_ports(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``run_local`` hands etcd every promised port (it once passed only the Kafka ports)."""
    avoided: list[Collection[int]] = []

    async def start_etcd(
        _data_dir: Path, avoid_ports: Collection[int] = (), _binary: Path | None = None
    ) -> None:
        avoided.append(avoid_ports)
        raise StartupError("stopped here")

    monkeypatch.setattr(local, "start_etcd", start_etcd)
    base = _given_ports(30000)
    options = LocalOptions(tmp_path, brokers=1, port=30000, host="127.0.0.1")
    with pytest.raises(StartupError, match="stopped here"):
        await local.run_local(base, options)
    assert avoided == [promised_ports(base, options)]
    assert {30010, 30020, 30030, 30031} <= set(avoided[0])
