"""The suite on two pytest-xdist workers (``harness.workers``): which files form one unit of work
and are handed out first, when a session server stops, and which ports each worker may hand to
its children (overlapping port slices let the two workers pick the same port before either
child binds it)."""

from __future__ import annotations

import socket

import pytest
from harness.workers import (
    SERVER_GROUPS,
    file_groups,
    group_of,
    grouped_order,
    servers_by_file,
    servers_of,
    servers_to_stop,
    work_unit,
    worker_slice,
)

from kafscale.broker import free_ports
from kafscale.broker.free_ports import PORT_SLICE_ENV, free_port_run, port_slice

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("fixtures", "markers", "servers"),
    [
        (["spark", "broker_cluster"], ["pipeline"], {"spark"}),
        (["kube_cluster", "kafscale_chart"], ["kubeapi"], {"kube_cluster"}),
        (["radosgw_server"], [], {"radosgw_server"}),
        (["backend", "request"], ["radosgw", "integration"], {"radosgw_server"}),
        (["broker_cluster", "etcd_server"], ["integration"], set()),
    ],
)
def test_a_test_uses_the_servers_it_names_or_marks(
    fixtures: list[str], markers: list[str], servers: set[str]
) -> None:
    assert servers_of(fixtures, markers) == servers


def test_a_file_joins_the_group_of_its_first_server_in_hand_out_order() -> None:
    tests = [
        ("a.py", frozenset()),
        ("b.py", frozenset({"radosgw_server"})),
        ("b.py", frozenset({"spark"})),
        ("c.py", frozenset({"kube_cluster"})),
        ("c.py", frozenset()),
    ]
    by_file = servers_by_file(tests)
    assert by_file["b.py"] == {"spark", "radosgw_server"}
    assert file_groups(by_file) == {"b.py": "spark", "c.py": "kube_cluster"}
    assert group_of([]) is None


def test_each_groups_files_come_together_groups_first_otherwise_in_order() -> None:
    files = ["a", "r", "k1", "s", "k2", "b", "k1"]
    groups = {"r": "radosgw_server", "k1": "kube_cluster", "k2": "kube_cluster", "s": "spark"}
    order = grouped_order(files, groups)
    assert [files[i] for i in order] == ["s", "k1", "k2", "k1", "r", "a", "b"]
    assert order == [3, 2, 4, 6, 1, 0, 5]


def test_a_groups_tests_are_one_unit_of_work_other_files_each_their_own() -> None:
    groups = {"tests/pipeline/test_x.py": "spark", "tests/pipeline/test_y.py": "spark"}
    assert work_unit("tests/pipeline/test_x.py::test_a[p]", groups) == "group:spark"
    assert work_unit("tests/pipeline/test_y.py::T::test_b", groups) == "group:spark"
    assert work_unit("tests/unit/test_z.py::test_c", groups) == "tests/unit/test_z.py"


def test_servers_stop_when_the_next_file_does_not_use_them() -> None:
    assert servers_to_stop(SERVER_GROUPS, frozenset({"spark"})) == [
        "kube_cluster",
        "radosgw_server",
    ]
    assert servers_to_stop(["spark"], frozenset({"spark", "radosgw_server"})) == []


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
