"""Running the suite on two pytest-xdist workers (``make test``: ``-n 2 --dist loadgroup``).

The suite waits (for brokers, etcd, Spark, the kube-apiserver) more than it computes, so two
workers on two cores finish it in much less wall time. What makes that safe:

* Work units. Every test gets an ``xdist_group``: its module, so module-scoped clusters start
  once, except that tests using one of the expensive session servers (one SparkSession, the
  kube-apiserver, Ceph radosgw) all share one group per server, so only one worker starts it.
  Those groups go first: they are the longest units, and a long unit last would leave the other
  worker idle at the end.
* Ports. Each worker picks free ports from its own slice of the range below the ephemeral
  ports (``KAFSCALE_PORT_SLICE``, see ``kafscale.broker.free_ports.port_slice``), so one
  cannot pick a port the other has probed and not bound yet.
* Everything else a test starts is its own already: etcd and moto per session (per worker),
  unique cluster names and buckets, ``tmp_path`` under the worker's own base directory.

Without ``-n`` (a plain ``pytest tests/...``) none of this does anything.
"""

from __future__ import annotations

import os

import pytest

from kafscale.broker.free_ports import PORT_SLICE_ENV

# Session fixtures that cost seconds to start and hundreds of MB to keep: one worker owns each.
SHARED_SERVERS = {"kube_cluster": "kube-apiserver", "spark": "spark", "radosgw_server": "radosgw"}
# Tests that reach one of them through ``request.getfixturevalue`` carry the server's marker.
SHARED_SERVER_MARKERS = {"radosgw": "radosgw"}


def group_of(module: str, fixturenames: list[str], markers: list[str]) -> tuple[int, str]:
    """(rank, group) of a test: the shared server it uses, if any (rank 0: scheduled first),
    else its module (rank 1)."""
    for fixture, group in SHARED_SERVERS.items():
        if fixture in fixturenames:
            return 0, group
    for marker, group in SHARED_SERVER_MARKERS.items():
        if marker in markers:
            return 0, group
    return 1, module


def worker_slice(worker_id: str, worker_count: int) -> str:
    """``i/n`` for worker ``gw<i>`` of ``n``."""
    return f"{int(worker_id.removeprefix('gw'))}/{worker_count}"


def pytest_configure(config: pytest.Config) -> None:
    worker_id = os.environ.get("PYTEST_XDIST_WORKER")
    worker_count = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if worker_id and worker_count:
        os.environ[PORT_SLICE_ENV] = worker_slice(worker_id, int(worker_count))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group and order the tests for ``--dist loadgroup`` (before xdist reads the groups)."""
    if config.getoption("dist", "no") != "loadgroup":
        return
    ranked = []
    for index, item in enumerate(items):
        fixtures = list(getattr(item, "fixturenames", []))
        markers = [mark.name for mark in item.iter_markers()]
        rank, group = group_of(item.nodeid.split("::")[0], fixtures, markers)
        item.add_marker(pytest.mark.xdist_group(group))
        ranked.append((rank, index, item))
    items[:] = [item for _, _, item in sorted(ranked, key=lambda r: (r[0], r[1]))]
