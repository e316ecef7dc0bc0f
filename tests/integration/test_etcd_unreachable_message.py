"""An etcd that cannot be reached is named, with what happened, in one line.

``kafscale status`` (and the other etcd commands) and a starting broker connect to etcd through
``connect_etcd``; when no endpoint can be used the user reads one line saying, per endpoint,
what went wrong: the connection was refused, nothing answered within the timeout, the host name
did not resolve. Before, every failure read "no etcd endpoint answered within 5 s", a refusal
that came at once too, followed by gRPC's own text; and ``status`` printed each retry first.
Real CLI processes against real loopback ports: one nothing listens on, one that accepts
connections and never speaks.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import children
from harness.children import child_env
from harness.ports import closed_port

from kafscale.broker.child_process import KAFSCALE

pytestmark = pytest.mark.integration


def run_kafscale(args: list[str], home: Path) -> tuple[int, list[str]]:
    """``kafscale ARGS`` without any KAFSCALE_* or AWS_* variable: exit status, stderr lines."""
    env = child_env(
        {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "KAFSCALE_"))}
    )
    env["HOME"] = str(home)
    done = children.run(
        [KAFSCALE, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    return done.returncode, [line for line in done.stderr.splitlines() if line.strip()]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts connections (the kernel's backlog does) and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield int(listener.getsockname()[1])


def test_status_says_the_connection_was_refused_in_one_line(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    code, lines = run_kafscale(["status", "--etcd-endpoints", endpoint], tmp_path)
    assert code == 1
    assert lines == [f"kafscale status: etcd is not reachable: {endpoint}: connection refused"]


def test_status_says_nothing_answered_within_the_timeout(tmp_path: Path, silent_port: int) -> None:
    endpoint = f"http://127.0.0.1:{silent_port}"
    args = ["status", "--etcd-endpoints", endpoint, "--etcd-timeout-s", "1"]
    code, lines = run_kafscale(args, tmp_path)
    assert code == 1
    assert lines == [f"kafscale status: etcd is not reachable: {endpoint}: no answer within 1 s"]


def test_status_names_each_endpoint_with_its_own_failure(tmp_path: Path, silent_port: int) -> None:
    refused = f"http://127.0.0.1:{closed_port()}"
    silent = f"http://127.0.0.1:{silent_port}"
    args = ["status", "--etcd-endpoints", f"{refused},{silent}", "--etcd-timeout-s", "1"]
    code, lines = run_kafscale(args, tmp_path)
    assert code == 1
    assert lines == [
        f"kafscale status: etcd is not reachable: {refused}: connection refused; "
        f"{silent}: no answer within 1 s"
    ]


def test_a_broker_that_cannot_start_says_the_connection_was_refused(tmp_path: Path) -> None:
    """The broker logs each retry (a server's log keeps them), then ends with the one line."""
    endpoint = f"http://127.0.0.1:{closed_port()}"
    args = ["broker", "--etcd-endpoints", endpoint, "--storage-kind", "local"]
    args += ["--storage-local-dir", str(tmp_path / "data")]
    code, lines = run_kafscale(args, tmp_path)
    assert code != 0
    assert (
        lines[-1]
        == f"kafscale: cannot start: etcd is not reachable: {endpoint}: connection refused"
    )
    assert not [line for line in lines if "Traceback" in line or "answered within" in line]
