"""Running the suite on two pytest-xdist workers (``make test``: ``-n 2 --dist loadfile``).

The suite is CPU-bound on two cores (brokers, JVMs, etcd, Spark and the kube-apiserver all
compete), so what it saves is processes and seconds of CPU. What this plugin does:

* **Work units.** A file is a unit (``--dist loadfile``: a module-scoped cluster starts once),
  except that every file using one expensive session server (the SparkSession, the
  kube-apiserver, Ceph radosgw) joins that server's **group**, and a group is a single unit:
  one worker runs all of it, so the server starts once per run instead of once per worker.
  Groups are handed out first (they are the longest units). The workers know which file uses
  which server (pytest resolved their fixtures); the controller, which schedules, does not: each
  worker writes the file-to-group map to a path the controller gave it (``GROUPS_ENV``), and the
  controller's scheduler (``ServerGroupScheduling``) reads it once all workers have collected.
  (``--dist loadgroup`` would do this with markers, but does nothing with pytest 9.2 and
  pytest-xdist 3.8.0: xdist renames ``item._nodeid``, which pytest 9.2 no longer reads.)
* **Early stop.** A session server is stopped as soon as the worker's next test is in a file
  that does not use it, instead of idling (a kube-apiserver with its etcd and controller
  manager, or a Spark JVM, costs ~5 % of a core doing nothing) until the session ends. Should a
  later file need it after all, pytest starts it again: the map only saves time, it is never
  needed for a test to pass.
* **Ports.** Each worker picks free ports from its own slice of the range below the ephemeral
  ports (``KAFSCALE_PORT_SLICE``, see ``kafscale.broker.free_ports.port_slice``), so one
  cannot pick a port the other has probed and not bound yet.
* Everything else a test starts is its own already: etcd and moto per session (per worker),
  unique cluster names and buckets, ``tmp_path`` under the worker's own base directory.
* **A crashed worker** (the kernel's OOM killer, a segfault) fails its test and is replaced, as
  xdist does; its unfinished units go to the other workers (see ``remove_node`` below: without
  it the run hangs).

Without ``-n`` (a plain ``pytest tests/...``) only the ordering and the early stop apply.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from kafscale.broker.free_ports import PORT_SLICE_ENV

# Session fixtures that cost seconds to start and CPU to keep, in the order their groups are
# handed out (longest first).
SERVER_GROUPS: tuple[str, ...] = ("spark", "kube_cluster", "radosgw_server")
# Tests that reach a server through ``request.getfixturevalue`` carry a marker naming it.
SERVER_MARKERS: Mapping[str, str] = {"radosgw": "radosgw_server"}
GROUPS_ENV = "KAFSCALE_XDIST_GROUPS"
FILE_SERVERS = pytest.StashKey[dict[str, frozenset[str]]]()


def servers_of(fixturenames: Iterable[str], markers: Iterable[str]) -> frozenset[str]:
    """The session servers a test uses."""
    used = set(SERVER_GROUPS).intersection(fixturenames)
    used.update(SERVER_MARKERS[m] for m in markers if m in SERVER_MARKERS)
    return frozenset(used)


def group_of(servers: Iterable[str]) -> str | None:
    """The group of a file using ``servers``: the first of them in ``SERVER_GROUPS``."""
    used = set(servers)
    return next((server for server in SERVER_GROUPS if server in used), None)


def servers_by_file(tests: Sequence[tuple[str, frozenset[str]]]) -> dict[str, frozenset[str]]:
    """Every file's servers: the union over its ``(file, servers)`` tests."""
    by_file: dict[str, frozenset[str]] = {}
    for file, servers in tests:
        by_file[file] = by_file.get(file, frozenset()) | servers
    return by_file


def file_groups(by_file: Mapping[str, frozenset[str]]) -> dict[str, str]:
    """The group of every file that has one."""
    return {file: group for file, servers in by_file.items() if (group := group_of(servers))}


def grouped_order(files: Sequence[str], groups: Mapping[str, str]) -> list[int]:
    """Indices of the tests (given by file, in collection order) reordered so that each group's
    files come together, groups first in ``SERVER_GROUPS`` order; order is kept otherwise."""

    def rank(i: int) -> int:
        group = groups.get(files[i])
        return SERVER_GROUPS.index(group) if group else len(SERVER_GROUPS)

    return sorted(range(len(files)), key=rank)


def work_unit(nodeid: str, groups: Mapping[str, str]) -> str:
    """The unit of work a test belongs to: its file's group, else its file."""
    file = nodeid.split("::", 1)[0]
    group = groups.get(file)
    return f"group:{group}" if group else file


def servers_to_stop(running: Iterable[str], next_file_servers: frozenset[str]) -> list[str]:
    """The running servers the next test's file does not use."""
    return [server for server in running if server not in next_file_servers]


def drop_finished_units(workload: dict[str, dict[str, bool]]) -> None:
    """Remove from a worker's ``{unit: {test: finished}}`` the units whose every test finished."""
    for unit in [unit for unit, tests in workload.items() if all(tests.values())]:
        del workload[unit]


def worker_slice(worker_id: str, worker_count: int) -> str:
    """``i/n`` for worker ``gw<i>`` of ``n``."""
    return f"{int(worker_id.removeprefix('gw'))}/{worker_count}"


# --- the pytest and xdist shells ------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    worker_id = os.environ.get("PYTEST_XDIST_WORKER")
    worker_count = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if worker_id and worker_count:
        os.environ[PORT_SLICE_ENV] = worker_slice(worker_id, int(worker_count))
    elif _schedules_by_group(config):
        # The controller: its workers inherit the environment, and write the map there.
        handle, path = tempfile.mkstemp(prefix="kafscale-xdist-groups-", suffix=".json")
        os.close(handle)
        os.environ[GROUPS_ENV] = path


def pytest_unconfigure(config: pytest.Config) -> None:
    if _schedules_by_group(config) and not os.environ.get("PYTEST_XDIST_WORKER"):
        Path(os.environ.pop(GROUPS_ENV, "")).unlink(missing_ok=True)


def _schedules_by_group(config: pytest.Config) -> bool:
    return str(getattr(config.option, "dist", "no")) == "loadfile"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each group's files together and first; the map of files to groups for the controller."""
    tests = [
        (
            item.nodeid.split("::", 1)[0],
            servers_of(
                getattr(item, "fixturenames", []), [mark.name for mark in item.iter_markers()]
            ),
        )
        for item in items
    ]
    by_file = servers_by_file(tests)
    config.stash[FILE_SERVERS] = by_file
    groups = file_groups(by_file)
    items[:] = [items[i] for i in grouped_order([file for file, _ in tests], groups)]
    path = os.environ.get(GROUPS_ENV)
    if path and os.environ.get("PYTEST_XDIST_WORKER"):
        # Every worker collects the same tests and writes the same map: a rename keeps a
        # reader from seeing half of one.
        scratch = f"{path}.{os.environ['PYTEST_XDIST_WORKER']}"
        Path(scratch).write_text(json.dumps(groups))
        os.replace(scratch, path)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """After the test's own teardown: stop the session servers the next file does not use."""
    result = yield
    by_file = item.config.stash.get(FILE_SERVERS, {})
    if nextitem is not None:
        next_servers = by_file.get(nextitem.nodeid.split("::", 1)[0], frozenset())
        for server in servers_to_stop(SERVER_GROUPS, next_servers):
            _stop_if_running(item, server)
    return result


def _stop_if_running(item: pytest.Item, fixture: str) -> None:
    manager = item.session._fixturemanager
    for definition in manager.getfixturedefs(fixture, item) or ():
        if definition.cached_result is not None:
            # FixtureDef.finish runs the fixture's teardown (and its dependents') and forgets
            # its value: a later request starts the server again.
            definition.finish(item._request)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` with each server's group as one unit (see the module's docstring)."""
    if not _schedules_by_group(config):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ServerGroupScheduling(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # read once, after every worker has collected
                path = os.environ.get(GROUPS_ENV, "")
                text = Path(path).read_text() if path and Path(path).is_file() else ""
                self.groups = json.loads(text) if text else {}
            return work_unit(nodeid, self.groups)

        def remove_node(self, node: Any) -> str | None:
            # xdist (3.8.0) puts every unit of a crashed worker back in the queue, finished
            # ones too. Handed out, a finished unit sends its worker no test; with no test to
            # finish, that worker is never given the rest: the run hung after an OOM kill.
            drop_finished_units(self.assigned_work.get(node, {}))
            return super().remove_node(node)  # type: ignore[no-any-return]

    return ServerGroupScheduling(config, log)
