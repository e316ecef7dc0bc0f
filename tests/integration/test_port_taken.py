"""A port that is already taken is one line naming it, never a traceback.

The README runs ``kafscale broker`` and then ``kafscale proxy`` beside it: both serve their
admin endpoints on 8080 unless told otherwise, so on one machine the second finds its admin
port taken. A broker said so in one line; the proxy died with asyncio's traceback. Real
``kafscale`` processes against a real etcd, the port held by the test's own socket.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import children
from harness.children import settings_free_env
from harness.ports import free_port_run

from kafscale.broker.child_process import KAFSCALE
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = pytest.mark.integration


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port a listening socket of this test holds (on every interface, as 8080 would be)."""
    with socket.create_server(("0.0.0.0", 0)) as held:
        yield int(held.getsockname()[1])


@pytest.mark.parametrize("command", ["broker", "proxy"])
def test_an_admin_port_in_use_is_one_line_naming_it(
    command: str, etcd_server: EmbeddedEtcd, taken_port: int, tmp_path: Path
) -> None:
    args = [KAFSCALE, command, "--etcd-endpoints", etcd_server.client_url]
    args += ["--cluster", f"port-taken-{command}", "--listener-host", "127.0.0.1"]
    args += ["--listener-port", str(free_port_run()), "--listener-admin-port", str(taken_port)]
    if command == "broker":
        args += ["--storage-kind", "local", "--storage-local-dir", str(tmp_path / "objects")]
    done = children.run(
        args, env=settings_free_env(), capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    last = done.stderr.splitlines()[-1]
    expected = f"kafscale: cannot start: cannot listen on admin port {taken_port}: "
    assert last.startswith(expected), done.stderr
    assert "address already in use" in last, done.stderr
