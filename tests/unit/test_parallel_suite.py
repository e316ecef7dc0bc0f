"""The suite on two pytest-xdist workers (``harness.workers``): which files form one unit of work
and are handed out first, when a session server stops, and which ports each worker may hand to
its children (overlapping port slices let the two workers pick the same port before either
child binds it), and that a crashed worker fails its test instead of hanging the run."""

from __future__ import annotations

import os
import socket
import sys
import textwrap
from pathlib import Path

import pytest
from harness import children
from harness.workers import (
    SERVER_GROUPS,
    drop_finished_units,
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


def test_a_crashed_workers_finished_units_are_not_handed_out_again() -> None:
    workload = {"a.py": {"a.py::t1": True, "a.py::t2": True}, "c.py": {"c.py::t": False}}
    drop_finished_units(workload)
    assert workload == {"c.py": {"c.py::t": False}}


CRASHING_SUITE = {
    "conftest.py": 'pytest_plugins = ["harness.workers"]\n',
    "test_a.py": "def test_a1(): pass\ndef test_a2(): pass\n",
    "test_b.py": "def test_b1(): pass\ndef test_b2(): pass\n",
    # The worker running c has finished a or b; the other worker has run out of work and been
    # told to shut down by the time c's worker dies.
    "test_c.py": """
        import os, signal, time
        from pathlib import Path

        def test_c1(): pass

        def test_c2():
            mark = Path(__file__).with_name("crashed")
            if not mark.exists():
                mark.write_text("")
                time.sleep(2)
                os.kill(os.getpid(), signal.SIGKILL)

        def test_c3(): pass
    """,
}


def test_a_crashed_worker_fails_its_test_and_the_run_ends(tmp_path: Path) -> None:
    """Fails on the old scheduler (xdist 3.8.0's): the replacement worker was handed a finished
    unit, ran nothing, and the run never ended (CI sat idle after an OOM kill until killed)."""
    for name, text in CRASHING_SUITE.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    tests_dir = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests_dir), str(tmp_path)])}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_XDIST_WORKER_COUNT", None)
    env.pop("PYTEST_ADDOPTS", None)
    make_test = ["-n", "2", "--dist", "loadfile", "--no-loadscope-reorder"]  # as the Makefile
    command = [sys.executable, "-m", "pytest", *make_test, "-p", "no:cacheprovider"]
    run = children.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert "worker 'gw" in run.stdout and "crashed while running 'test_c.py::test_c2'" in run.stdout
    # Six tests, the crashed one failed once and run again (xdist's way) on the new worker.
    assert " 1 failed, 7 passed in " in run.stdout.rstrip().splitlines()[-1], run.stdout


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
