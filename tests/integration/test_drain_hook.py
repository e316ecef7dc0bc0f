"""The preStop drain hook, run as the pod runs it, against a real broker process."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from harness import children
from harness.brokers import BrokerCluster

from kafscale.broker import drain_hook
from kafscale.operator import manifest_brokers

pytestmark = pytest.mark.integration

HEAVY = ("kafscale.broker.app", "aetcd", "boto3", "kio", "uvloop")


def test_the_hook_drains_the_broker_prints_json_and_imports_nothing_heavy(
    broker_cluster: BrokerCluster,
) -> None:
    broker = broker_cluster.start()
    command = manifest_brokers.drain_command(30)
    assert command[:3] == ["python", "-m", "kafscale.broker.drain_hook"]
    args = [*command[3:]]
    args[args.index("--admin-url") + 1] = broker.admin_url
    probe = (
        "import sys, runpy\n"
        f"sys.argv = ['drain_hook', *{args!r}]\n"
        "try:\n"
        "    runpy.run_module('kafscale.broker.drain_hook', run_name='__main__')\n"
        "except SystemExit as exit:\n"
        "    code = exit.code\n"
        f"print('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
        "sys.exit(code)\n"
    )
    result = children.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    answer, heavy = result.stdout.splitlines()
    assert json.loads(answer) == {"drained": True}, answer  # JSON, as `status --json` prints
    assert heavy == "HEAVY []", result.stdout
    status = broker.status()
    assert status["draining"] and status["owned"] == []


class NotAnAdminPort(BaseHTTPRequestHandler):
    """A web server that is not a broker's admin port: HTML to every POST."""

    def do_POST(self) -> None:
        page = b"<html><body>hello</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def web_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), NotAnAdminPort)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_drain_at_a_port_that_is_no_admin_port_is_one_line_not_a_traceback(
    web_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--admin-url`` pointing at another web server (a wrong port): its answer is no JSON,
    which ended `kafscale drain` with a JSONDecodeError traceback."""
    assert drain_hook.main(["--admin-url", web_server, "--timeout-s", "10"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"kafscale drain: {web_server} is not a broker's admin port: "
        "Expecting value: line 1 column 1 (char 0)"
    ], err
