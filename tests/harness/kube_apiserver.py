"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager.

The binaries are Kubernetes 1.20.2, built once from Debian's source package by
``tests/harness/build_kube.sh`` (``make test`` runs it; this module runs it too when they are
missing, so ``pytest`` alone works). ``KAFSCALE_KUBE_BIN`` points at another directory holding
``kube-apiserver``, ``kube-controller-manager`` and ``kubectl``.

The API server runs with token authentication (a static token for the admin, service-account
tokens for everything else) and RBAC on, exactly what decides whether the chart's RBAC is enough
for the operator. The controller manager runs the controllers a control plane without nodes
needs: garbage collector, namespaces, service accounts and their token secrets, Deployments and
ReplicaSets. There is no scheduler, kubelet or container runtime: pods are created and stay
Pending, unless a test binds them to a node object (``bind_pod``) so that a graceful delete
leaves them terminating, as on a real node whose kubelet has not yet confirmed.

Fixture: ``kube_cluster`` (session), a :class:`KubeCluster` with an admin HTTP client, kubectl
and kubeconfig helpers.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from harness import children
from harness.etcd import running_etcd
from harness.scratch import make_owned_dir
from kafscale.broker.child_process import free_port_run

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "tests" / "harness" / "build_kube.sh"
BINARIES = ("kube-apiserver", "kube-controller-manager", "kubectl")
ADMIN_TOKEN = "kafscale-admin-token"
START_TIMEOUT_S = 90.0
# What a control plane without nodes needs; not the node lifecycle or pod GC controllers, which
# would evict or force-delete the pods a test binds to a node that has no kubelet.
CONTROLLERS = (
    "garbagecollector",
    "namespace",
    "serviceaccount",
    "serviceaccount-token",
    "deployment",
    "replicaset",
)


class KubeStartError(RuntimeError):
    """The binaries are missing and could not be built, or a component did not start."""


def kube_binaries() -> Path:
    """The directory of the three binaries, building them first when missing (5-9 minutes)."""
    override = os.environ.get("KAFSCALE_KUBE_BIN")
    if override:
        return Path(override)
    result = children.run(
        ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=3600, check=False
    )
    if result.returncode != 0:
        raise KubeStartError(
            f"{BUILD_SCRIPT.name} failed (exit {result.returncode}):\n{result.stderr[-4000:]}"
        )
    directory = Path(result.stdout.strip().splitlines()[-1])
    missing = [b for b in BINARIES if not (directory / b).exists()]
    if missing:
        raise KubeStartError(f"{directory} lacks {missing}")
    return directory


def write_kubeconfig(path: Path, server: str, ca_path: Path, token: str, namespace: str) -> Path:
    """A kubeconfig of one user authenticating with a bearer token."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "kafscale-test",
                "cluster": {"server": server, "certificate-authority": str(ca_path)},
            }
        ],
        "users": [{"name": "user", "user": {"token": token}}],
        "contexts": [
            {
                "name": "test",
                "context": {"cluster": "kafscale-test", "user": "user", "namespace": namespace},
            }
        ],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(config))
    return path


class ApiError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body


@dataclass
class KubeCluster:
    """A running control plane: its address, credentials and tools."""

    server: str
    ca_path: Path
    bin_dir: Path
    workdir: Path
    admin_kubeconfig: Path
    session: requests.Session = field(default_factory=requests.Session)

    # --- HTTP as the admin ----------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
        token: str = ADMIN_TOKEN,
    ) -> Any:
        """One API call; raises :class:`ApiError` on a status >= 400."""
        response = self.session.request(
            method,
            self.server + path,
            data=None if body is None else json.dumps(body),
            params=params,
            headers={"Authorization": f"Bearer {token}", "Content-Type": content_type},
            verify=str(self.ca_path),
            timeout=30,
        )
        payload = response.json() if response.content else None
        if response.status_code >= 400:
            raise ApiError(response.status_code, payload)
        return payload

    def get(self, path: str) -> Any:
        """The object at ``path``, or None when it does not exist."""
        try:
            return self.request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, path: str, body: dict[str, Any], *, dry_run: bool = False) -> Any:
        """POST ``body``; ``dry_run``: validated, defaulted and answered, but not stored."""
        return self.request("POST", path, body, params={"dryRun": "All"} if dry_run else None)

    def merge_patch(self, path: str, body: dict[str, Any]) -> Any:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            return self.request("DELETE", path, body)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def create_namespace(self, name: str) -> None:
        self.create("/api/v1/namespaces", {"metadata": {"name": name}})

    # --- tools --------------------------------------------------------------------------------

    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        stdin: str | None = None,
        check: bool = True,
        timeout_s: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """The built kubectl 1.20 (it matches the server) as the admin, unless told otherwise."""
        result = children.run(
            [
                str(self.bin_dir / "kubectl"),
                "--kubeconfig",
                str(kubeconfig or self.admin_kubeconfig),
                *args,
            ],
            capture_output=True,
            text=True,
            input=stdin,
            timeout=timeout_s,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed:\n{result.stdout}{result.stderr}"
            )
        return result

    def kubeconfig_for(self, token: str, name: str, namespace: str = "default") -> Path:
        return write_kubeconfig(
            self.workdir / f"{name}.kubeconfig", self.server, self.ca_path, token, namespace
        )

    def service_account_token(self, namespace: str, name: str, timeout_s: float = 30) -> str:
        """The token of a ServiceAccount, from the secret the token controller makes for it."""
        deadline = time.monotonic() + timeout_s
        while True:
            account = self.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}") or {}
            for ref in account.get("secrets") or []:
                secret = self.get(f"/api/v1/namespaces/{namespace}/secrets/{ref['name']}") or {}
                token = (secret.get("data") or {}).get("token")
                if token:
                    return base64.b64decode(token).decode()
            if time.monotonic() > deadline:
                raise AssertionError(f"no token for ServiceAccount {namespace}/{name}")
            time.sleep(0.2)

    def ensure_node(self, name: str = "kubeletless") -> str:
        """A Node object with no kubelet behind it, for pods to be bound to."""
        if self.get(f"/api/v1/nodes/{name}") is None:
            self.create("/api/v1/nodes", {"metadata": {"name": name}})
        return name

    def bind_pod(self, namespace: str, pod: str, node: str) -> None:
        """What the scheduler does: bind ``pod`` to ``node`` (a graceful delete then waits)."""
        self.create(
            f"/api/v1/namespaces/{namespace}/pods/{pod}/binding",
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": pod},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            },
        )


def _generate_service_account_keys(directory: Path) -> tuple[Path, Path]:
    key, pub = directory / "sa.key", directory / "sa.pub"
    children.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True)
    children.run(
        ["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(pub)],
        check=True,
        capture_output=True,
    )
    return key, pub


@contextmanager
def _process(args: list[str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log_path.open("wb") as log:
        process = children.spawn(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _tail(path: Path, size: int = 4000) -> str:
    return path.read_bytes()[-size:].decode(errors="replace") if path.exists() else ""


def _wait_ready(server: str, ca_path: Path, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise KubeStartError(f"kube-apiserver exited {process.returncode}:\n{_tail(log)}")
        if ca_path.exists():
            try:
                response = requests.get(
                    f"{server}/readyz",
                    headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                    verify=str(ca_path),
                    timeout=2,
                )
                if response.status_code == 200:
                    return
            except requests.RequestException:
                pass
        time.sleep(0.2)
    raise KubeStartError(f"kube-apiserver not ready after {START_TIMEOUT_S:g} s:\n{_tail(log)}")


def _apiserver_args(
    bin_dir: Path, etcd_url: str, port: int, work: Path, sa_key: Path, sa_pub: Path
) -> list[str]:
    tokens = work / "tokens.csv"
    tokens.write_text(f'{ADMIN_TOKEN},kafscale-admin,kafscale-admin,"system:masters"\n')
    return [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        "--insecure-port=0",
        f"--cert-dir={work / 'certs'}",
        f"--token-auth-file={tokens}",
        "--authorization-mode=RBAC",
        "--anonymous-auth=false",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={sa_pub}",
        f"--service-account-signing-key-file={sa_key}",
        "--api-audiences=https://kubernetes.default.svc",
        "--service-cluster-ip-range=10.96.0.0/16",
        "--enable-priority-and-fairness=false",
        "--logtostderr=true",
        "--v=1",
    ]


def _controller_manager_args(bin_dir: Path, kubeconfig: Path, sa_key: Path, ca: Path) -> list[str]:
    return [
        str(bin_dir / "kube-controller-manager"),
        f"--kubeconfig={kubeconfig}",
        "--leader-elect=false",
        f"--controllers={','.join(CONTROLLERS)}",
        f"--service-account-private-key-file={sa_key}",
        f"--root-ca-file={ca}",
        "--use-service-account-credentials",
        "--secure-port=0",
        "--port=0",
        "--concurrent-gc-syncs=5",
        "--logtostderr=true",
        "--v=1",
    ]


@contextmanager
def running_kube_cluster() -> Iterator[KubeCluster]:
    """etcd, the API server and the controller manager, stopped and removed afterwards."""
    bin_dir = kube_binaries()
    work = make_owned_dir("kafscale-kube-")  # a killed run's is removed by the next
    try:
        with ExitStack() as stack:
            etcd = stack.enter_context(running_etcd())
            sa_key, sa_pub = _generate_service_account_keys(work)
            port = free_port_run()
            server = f"https://127.0.0.1:{port}"
            ca_path = work / "certs" / "apiserver.crt"  # self-signed by the server, CA included
            apiserver_log = work / "kube-apiserver.log"
            apiserver = stack.enter_context(
                _process(
                    _apiserver_args(bin_dir, etcd.client_url, port, work, sa_key, sa_pub),
                    apiserver_log,
                )
            )
            _wait_ready(server, ca_path, apiserver, apiserver_log)
            admin = write_kubeconfig(
                work / "admin.kubeconfig", server, ca_path, ADMIN_TOKEN, "default"
            )
            stack.enter_context(
                _process(
                    _controller_manager_args(bin_dir, admin, sa_key, ca_path),
                    work / "kube-controller-manager.log",
                )
            )
            cluster = KubeCluster(server, ca_path, bin_dir, work, admin)
            cluster.service_account_token("default", "default", timeout_s=START_TIMEOUT_S)
            yield cluster
            cluster.session.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[KubeCluster]:
    try:
        with running_kube_cluster() as cluster:
            yield cluster
    except KubeStartError as exc:
        pytest.fail(str(exc), pytrace=False)
