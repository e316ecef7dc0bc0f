"""The suite on two pytest-xdist workers (``harness.workers``): which files are handed out first,
and which ports each worker may hand to its children. Overlapping port slices let the two
workers pick the same port before either child binds it."""

from __future__ import annotations

import socket

import pytest
from harness.workers import first_files, rank_of, worker_slice

from kafscale.broker import free_ports
from kafscale.broker.free_ports import PORT_SLICE_ENV, free_port_run, port_slice

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("fixtures", "markers"),
    [
        (["spark", "broker_cluster"], ["pipeline"]),
        (["kube_cluster", "kafscale_chart"], ["kubeapi"]),
        (["radosgw_server"], []),
        (["backend", "request"], ["radosgw", "integration"]),
    ],
)
def test_tests_of_a_shared_server_rank_first(fixtures: list[str], markers: list[str]) -> None:
    assert rank_of(fixtures, markers) == 0


def test_other_tests_rank_after_them() -> None:
    assert rank_of(["broker_cluster", "etcd_server"], ["integration"]) == 1


def test_files_of_shared_servers_go_first_whole_and_in_order() -> None:
    ranked = [("a", 1), ("b", 1), ("b", 0), ("c", 1), ("d", 0), ("d", 1)]
    assert first_files(ranked) == [1, 2, 4, 5, 0, 3]


def test_worker_slices_split_the_range_without_overlap() -> None:
    slices = [port_slice(10000, 32000, worker_slice(f"gw{i}", 2)) for i in range(2)]
    assert slices == [(10000, 21000), (21000, 32000)]


@pytest.mark.parametrize("spec", ["", "x", "2/2", "-1/2", "1/0", "0/1000"])
def test_no_or_an_unusable_slice_is_the_whole_range(spec: str) -> None:
    assert port_slice(10000, 32000, spec) == (10000, 32000)


def test_free_ports_come_from_the_workers_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PORT_SLICE_ENV, raising=False)
    whole = free_ports._below_ephemeral()
    monkeypatch.setenv(PORT_SLICE_ENV, "1/2")
    low, high = free_ports._below_ephemeral()
    assert whole[0] < low < high == whole[0] + 2 * ((whole[1] - whole[0]) // 2)
    for _ in range(20):
        port = free_port_run(2)
        assert low <= port < port + 1 < high
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))
