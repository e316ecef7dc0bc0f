"""A real PostgreSQL server (Debian's ``postgresql`` package) for the Debezium tests.

``initdb`` into a fresh directory, then ``postgres`` on a free loopback port with
``wal_level=logical`` (what Debezium's ``pgoutput`` decoding needs), fsync off. PostgreSQL
refuses to run as root, so under root both run as the package's ``postgres`` user, in a
directory of their own outside pytest's private temp tree. SQL goes through ``psql``. A test
that needs it fails, not skips, when the package is missing (``make system-deps`` installs it).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness import children
from harness.scratch import make_owned_dir
from kafscale.broker.child_process import free_port_run

START_TIMEOUT_S = 30.0


def _bin_dir() -> Path:
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
    if not versions or shutil.which("psql") is None:
        pytest.fail("PostgreSQL (Debian's postgresql, psql) is needed", pytrace=False)
    return versions[-1].parent


def _as_postgres() -> dict[str, Any]:
    """Popen's arguments that run a command as the ``postgres`` user when we are root
    (PostgreSQL refuses root). Not through ``runuser``: it forks the command and waits, so
    killing it (the harness's children die with pytest) would leave PostgreSQL running."""
    if os.geteuid() != 0:
        return {}
    user = pwd.getpwnam("postgres")
    env = {**os.environ, "HOME": user.pw_dir, "USER": "postgres", "LOGNAME": "postgres"}
    groups = os.getgrouplist("postgres", user.pw_gid)
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": groups, "env": env}


@dataclass
class PostgresServer:
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def sql(self, statements: str) -> str:
        """Run ``statements`` (stop at the first error); psql's output."""
        return children.run(
            [
                *("psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"),
                *("-v", "ON_ERROR_STOP=1", "-qAt", "-c", statements),
            ],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout


def _wait_ready(server: PostgresServer) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        assert server.process.poll() is None, server.log.read_text(errors="replace")
        probe = ["pg_isready", "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres"]
        if children.run(probe, capture_output=True, timeout=10).returncode == 0:
            return
        assert time.monotonic() < deadline, server.log.read_text(errors="replace")
        time.sleep(0.1)


def _initdb(bin_dir: Path, data: Path) -> None:
    done = children.run(
        [str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "-N"],
        capture_output=True,
        text=True,
        timeout=120,
        **_as_postgres(),
    )
    if done.returncode != 0:
        pytest.fail(f"initdb failed:\n{done.stdout}{done.stderr}", pytrace=False)


def _start(bin_dir: Path, root: Path) -> PostgresServer:
    port = free_port_run()
    log = root / "postgres.log"
    settings = {
        "listen_addresses": "127.0.0.1",
        "unix_socket_directories": str(root),
        "wal_level": "logical",
        "max_wal_senders": "4",
        "max_replication_slots": "4",
        "fsync": "off",
    }
    command = [str(bin_dir / "postgres"), "-D", str(root / "data"), "-p", str(port)]
    for name, value in settings.items():
        command += ["-c", f"{name}={value}"]
    with log.open("ab") as out:
        process = children.spawn(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **_as_postgres(),
        )
    return PostgresServer(port, process, log)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)  # fast shutdown: ends sessions
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


@pytest.fixture
def postgres_server() -> Iterator[PostgresServer]:
    """A running PostgreSQL with logical decoding on, trusted loopback login as postgres. Its
    directory (outside pytest's temp tree, for the postgres user) goes whatever fails."""
    bin_dir = _bin_dir()
    root = make_owned_dir("kafscale-pg-")  # a killed run's is removed by the next
    server = None
    try:
        if os.geteuid() == 0:
            shutil.chown(root, "postgres")
        _initdb(bin_dir, root / "data")
        server = _start(bin_dir, root)
        _wait_ready(server)
        yield server
    finally:
        if server is not None:
            _stop(server.process)
        shutil.rmtree(root, ignore_errors=True)
