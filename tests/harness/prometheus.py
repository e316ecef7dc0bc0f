"""A real Prometheus server (Debian's ``prometheus`` package) scraping test processes.

``prometheus_server(targets)`` writes a scrape config for the given ``host:port`` admin
endpoints (scraped every second), starts Prometheus on a free loopback port with its TSDB in the
test's temp dir, waits for ``/-/ready`` and gives a client for PromQL queries over the HTTP API.
The process is killed at teardown. Tests skip only where the binary is not installed (``make
system-deps`` installs it; ``.ci/system-packages.txt`` lists it).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness import children
from kafscale.broker.child_process import free_port_run

SCRAPE_INTERVAL_S = 1


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector ``promql`` evaluates to now (``result`` of the HTTP API)."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def value(self, promql: str) -> float | None:
        """The single sample ``promql`` gives, or None while it gives none."""
        result = self.query(promql)
        if not result:
            return None
        assert len(result) == 1, result
        return float(result[0]["value"][1])

    def wait_value(
        self, promql: str, accept: Callable[[float], bool], timeout_s: float = 30
    ) -> float:
        """Poll ``promql`` until its value is accepted; fails with the last value seen."""
        deadline = time.monotonic() + timeout_s
        last: float | None = None
        while time.monotonic() < deadline:
            last = self.value(promql)
            if last is not None and accept(last):
                return last
            time.sleep(0.25)
        raise AssertionError(f"{promql} = {last} after {timeout_s}s\n{self.targets()}")

    def wait_scraping(self, timeout_s: float = 30) -> None:
        """Until every target has been scraped (Prometheus hands new targets to its scrapers
        only after its discovery manager's first update, a few seconds after start)."""
        self.wait_value("min(up)", lambda value: value == 1, timeout_s)

    def targets(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10) as response:
            return list(json.loads(response.read())["data"]["activeTargets"])


def _config(targets: list[str], labels: dict[str, str]) -> str:
    return json.dumps(
        {
            "global": {
                "scrape_interval": f"{SCRAPE_INTERVAL_S}s",
                "scrape_timeout": f"{SCRAPE_INTERVAL_S}s",
            },
            "scrape_configs": [
                {
                    "job_name": "kafscale",
                    "static_configs": [{"targets": targets, "labels": labels}],
                }
            ],
        }
    )  # JSON is YAML


@pytest.fixture
def prometheus_server(tmp_path: Path) -> Iterator[Callable[..., Prometheus]]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("Debian's prometheus is not installed (make system-deps)")
    started: list[Prometheus] = []

    def start(targets: list[str], labels: dict[str, str] | None = None) -> Prometheus:
        """Prometheus scraping ``targets``, each sample carrying ``labels`` (as Kubernetes
        service discovery adds ``namespace`` and ``pod``)."""
        workdir = tmp_path / f"prometheus-{len(started)}"
        workdir.mkdir()
        (workdir / "prometheus.yml").write_text(_config(targets, labels or {}))
        port = free_port_run()
        log_path = workdir / "prometheus.log"
        with log_path.open("wb") as log:
            process = children.spawn(
                [
                    binary,
                    f"--config.file={workdir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--web.enable-lifecycle",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        server = Prometheus(f"http://127.0.0.1:{port}", process, log_path)
        started.append(server)
        _wait_ready(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.process.kill()
            server.process.wait()


def _wait_ready(server: Prometheus, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"prometheus exited:\n{server.log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"prometheus not ready:\n{server.log_path.read_text()[-3000:]}")
