"""The operator's own Kubernetes client sends its bearer token.

kubernetes 36.0.0 dropped it (kubernetes-client/python#2582): its ``auth_settings()`` looked only
at ``api_key['BearerToken']`` while the kubeconfig and in-cluster loaders set
``api_key['authorization']``, so every request went out anonymous and a real API server refused
it. Here a loopback HTTP server records what the client really sends; the real API server tests
(``test_real_api.py``) catch it again end to end.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import kubernetes.client
import pytest
import yaml
from kubernetes.config.incluster_config import InClusterConfigLoader

from kafscale.operator.kube import Kube, connection_of, load_configuration
from kafscale.operator.settings import OperatorSettings

pytestmark = pytest.mark.operator

TOKEN = "kafscale-test-token"


class _Recorder(BaseHTTPRequestHandler):
    seen: list[str | None]

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Authorization"))
        body = json.dumps({"kind": "ConfigMap", "metadata": {"name": "x"}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[str | None]]]:
    seen: list[str | None] = []
    handler = type("Recorder", (_Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def write_kubeconfig(path: Path, server: str, token: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


async def test_requests_from_a_kubeconfig_carry_its_bearer_token(
    tmp_path: Path, recorder: tuple[str, list[str | None]]
) -> None:
    url, seen = recorder
    settings = OperatorSettings(kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", url, TOKEN))
    kube = Kube(load_configuration(settings), timeout_s=5.0)
    try:
        assert await kube.get("v1", "ConfigMap", "default", "x") is not None
    finally:
        kube.close()
    assert seen == [f"Bearer {TOKEN}"]
    assert kube.connection.token == TOKEN  # what kopf's login gets


def test_the_in_cluster_loader_token_reaches_the_request_headers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_file, ca_file = tmp_path / "token", tmp_path / "ca.crt"
    token_file.write_text(TOKEN)
    ca_file.write_text("not read until a TLS connection is made")
    environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"}
    config = kubernetes.client.Configuration()
    InClusterConfigLoader(str(token_file), str(ca_file), environ=environ).load_and_set(config)
    headers: dict[str, str] = {}
    kubernetes.client.ApiClient(config).update_params_for_auth(headers, [], ["BearerToken"])
    scheme, _, token = headers["authorization"].partition(" ")
    assert (scheme.lower(), token) == ("bearer", TOKEN)  # the scheme is case-insensitive
    assert connection_of(config).token == TOKEN
