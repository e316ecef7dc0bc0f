"""A real Prometheus server (Debian's ``prometheus`` package) scraping test processes.

``prometheus_server(targets)`` writes a scrape config for the given ``host:port`` admin
endpoints (scraped every second), starts Prometheus on a free loopback port with its TSDB in the
test's temp dir, waits for ``/-/ready`` and gives a client for PromQL queries over the HTTP API
(instant and range); ``drop_target`` stops scraping one, as when its pod is deleted.
``per_target`` labels tell targets apart (a ``pod`` each, as Kubernetes discovery does);
``rule_groups`` (e.g. the chart's PrometheusRule groups) are evaluated every second. The
process is killed at teardown. Tests skip only where the binary is not installed (``make
system-deps`` installs it; ``.ci/system-packages.txt`` lists it).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import children
from harness.k8s_tools import run_helm
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

    def query_range(
        self, promql: str, start_s: float, end_s: float, step_s: float
    ) -> list[dict[str, Any]]:
        """The range vector ``promql`` evaluates to at every step from ``start_s`` to ``end_s``
        (Unix seconds), as a rule evaluated at those instants would see it."""
        params = {"query": promql, "start": start_s, "end": end_s, "step": step_s}
        url = f"{self.url}/api/v1/query_range?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=30) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def drop_target(self, target: str) -> None:
        """Stop scraping ``target``, as Kubernetes discovery does when its pod is deleted: its
        series, ``up`` included, end (marked stale). The config is reloaded (``/-/reload``)."""
        path = self.log_path.parent / "prometheus.yml"
        config = json.loads(path.read_text())
        for job in config["scrape_configs"]:
            job["static_configs"] = [
                static for static in job["static_configs"] if target not in static["targets"]
            ]
        path.write_text(json.dumps(config))
        request = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200

    def targets(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10) as response:
            return list(json.loads(response.read())["data"]["activeTargets"])


def _config(
    targets: list[str],
    labels: dict[str, str],
    per_target: dict[str, dict[str, str]],
    rule_files: list[str],
) -> str:
    return json.dumps(
        {
            "global": {
                "scrape_interval": f"{SCRAPE_INTERVAL_S}s",
                "scrape_timeout": f"{SCRAPE_INTERVAL_S}s",
                "evaluation_interval": f"{SCRAPE_INTERVAL_S}s",
            },
            "rule_files": rule_files,
            "scrape_configs": [
                {
                    "job_name": "kafscale",
                    "static_configs": [
                        {"targets": [target], "labels": {**labels, **per_target.get(target, {})}}
                        for target in targets
                    ],
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

    def start(
        targets: list[str],
        labels: dict[str, str] | None = None,
        *,
        per_target: dict[str, dict[str, str]] | None = None,
        rule_groups: list[dict[str, Any]] | None = None,
    ) -> Prometheus:
        """Prometheus scraping ``targets``, each sample carrying ``labels`` (as Kubernetes
        service discovery adds ``namespace`` and ``pod``) and its own ``per_target`` ones (a
        ``pod`` each), evaluating ``rule_groups`` (a rule file's groups) every second."""
        workdir = tmp_path / f"prometheus-{len(started)}"
        workdir.mkdir()
        rule_files = []
        if rule_groups is not None:
            (workdir / "rules.yml").write_text(json.dumps({"groups": rule_groups}))
            rule_files.append(str(workdir / "rules.yml"))
        config = _config(targets, labels or {}, per_target or {}, rule_files)
        (workdir / "prometheus.yml").write_text(config)
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


def serve_metrics(page: Callable[[], bytes | None]) -> ThreadingHTTPServer:
    """A /metrics endpoint on a free loopback port, served from a thread, for a Prometheus to
    scrape what a test writes (503 while ``page`` gives None: a failed scrape)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page()
            if body is None:
                self.send_error(503)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


CHART = Path(__file__).resolve().parents[2] / "charts" / "kafscale"


def chart_rule_groups(*values: str) -> list[dict[str, Any]]:
    """The rule groups of the chart's PrometheusRule, rendered with helm and ``--set values``
    (tests shorten the chart's windows so a timeline fits in a minute)."""
    result = run_helm(
        "template", "kafscale", str(CHART), "--namespace", "ops",
        "--set", "monitoring.prometheusRule.enabled=true",
        *[arg for value in values for arg in ("--set", value)],
        "--api-versions=monitoring.coreos.com/v1/PrometheusRule",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    docs = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    groups: list[dict[str, Any]] = next(d for d in docs if d["kind"] == "PrometheusRule")["spec"][
        "groups"
    ]
    return groups
