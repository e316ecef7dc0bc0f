"""Running the suite on two pytest-xdist workers (``make test``: ``-n 2 --dist loadfile``).

The suite waits (for brokers, etcd, Spark, the kube-apiserver) more than it computes, so two
workers on two cores finish it in much less wall time. What makes that safe and quick:

* Work units are files (``--dist loadfile``): a module-scoped cluster starts once and a
  module's tests run in order on one worker. Files using an expensive session server (the
  SparkSession, the kube-apiserver, Ceph radosgw) are handed out first: they are the longest
  units. (``--dist loadgroup``, which could keep each server on one worker, does nothing with
  pytest 9.2 and pytest-xdist 3.8.0: xdist renames ``item._nodeid``, which pytest 9.2 no
  longer reads, so every test became a unit of its own.) Each worker that needs a server
  starts its own.
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

# Session fixtures that cost seconds to start (the kube-apiserver, the SparkSession, Ceph
# radosgw): the files using them are handed out first.
SHARED_SERVER_FIXTURES = frozenset({"kube_cluster", "spark", "radosgw_server"})
# Tests that reach one of them through ``request.getfixturevalue`` carry the server's marker.
SHARED_SERVER_MARKERS = frozenset({"radosgw"})


def rank_of(fixturenames: list[str], markers: list[str]) -> int:
    """0 for a test that uses a shared server (its file is scheduled first), else 1."""
    uses_one = not SHARED_SERVER_FIXTURES.isdisjoint(fixturenames)
    return 0 if uses_one or not SHARED_SERVER_MARKERS.isdisjoint(markers) else 1


def worker_slice(worker_id: str, worker_count: int) -> str:
    """``i/n`` for worker ``gw<i>`` of ``n``."""
    return f"{int(worker_id.removeprefix('gw'))}/{worker_count}"


def pytest_configure(config: pytest.Config) -> None:
    worker_id = os.environ.get("PYTEST_XDIST_WORKER")
    worker_count = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if worker_id and worker_count:
        os.environ[PORT_SLICE_ENV] = worker_slice(worker_id, int(worker_count))


def first_files(ranked: list[tuple[str, int]]) -> list[int]:
    """Indices of ``(file, rank)`` pairs (one per test, in collection order) reordered so that
    the files holding any rank-0 test come first; order inside a file and among files of one
    rank is kept."""
    early = {file for file, rank in ranked if rank == 0}
    return sorted(range(len(ranked)), key=lambda i: ranked[i][0] not in early)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker: the files of the shared servers' tests first, the longest work units, so
    that neither worker is left with one at the end while the other idles."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    ranked = []
    for item in items:
        file = item.nodeid.split("::")[0]
        markers = [mark.name for mark in item.iter_markers()]
        ranked.append((file, rank_of(list(getattr(item, "fixturenames", [])), markers)))
    items[:] = [items[i] for i in first_files(ranked)]
