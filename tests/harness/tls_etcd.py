"""A real etcd serving ``https://`` with client-certificate authentication, or plain HTTP with
username/password authentication, for tests of the parts that connect to a secured etcd
(brokers, the Spark source).

The certificates come from ``harness.tls.make_pki``: etcd's is the PKI's server certificate
(127.0.0.1/localhost), clients present ``alice`` (trusted) or ``stranger`` (another CA).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness import children
from harness.brokers import BrokerCluster
from harness.s3 import S3Endpoint, unique_bucket
from harness.tls import TestPki, make_pki
from kafscale.broker.child_process import free_port_run
from kafscale.broker.metadata.embedded_etcd import find_etcd_binary
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_channel import EtcdTls
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable


@dataclass(frozen=True)
class TlsEtcd:
    url: str
    pki: TestPki

    @property
    def client_tls(self) -> EtcdTls:
        return EtcdTls(self.pki.ca.cert_path, self.pki.alice.cert, self.pki.alice.key)

    def broker_env(self) -> dict[str, str]:
        """What a broker needs in its environment to use this etcd."""
        return {
            "KAFSCALE_ETCD__ENDPOINTS": json.dumps([self.url]),
            "KAFSCALE_ETCD__CA_FILE": str(self.pki.ca.cert_path),
            "KAFSCALE_ETCD__CERT_FILE": str(self.pki.alice.cert),
            "KAFSCALE_ETCD__KEY_FILE": str(self.pki.alice.key),
        }


def start_etcd_process(
    directory: Path, *flags: str, scheme: str = "http"
) -> tuple[subprocess.Popen[bytes], str]:
    """One etcd member on free loopback ports with ``flags`` added (its TLS or nothing), not
    waited for: the caller knows how to reach it (TLS, auth) and kills it."""
    client = free_port_run()
    peer = free_port_run(avoid=[client])  # two probes could return one port
    url = f"{scheme}://127.0.0.1:{client}"
    process = children.spawn(
        [
            str(find_etcd_binary()),
            f"--data-dir={directory / 'etcd'}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}",
            "--heartbeat-interval=10",
            "--election-timeout=100",
            "--unsafe-no-fsync",
            *flags,
        ],
        stdout=(directory / "etcd.log").open("ab"),
        stderr=subprocess.STDOUT,
    )
    return process, url


@contextmanager
def running_tls_etcd(directory: Path) -> Iterator[TlsEtcd]:
    """etcd with ``--client-cert-auth`` on free loopback ports, serving when yielded."""
    pki = make_pki(directory / "pki")
    process, url = start_etcd_process(
        directory,
        f"--cert-file={pki.server.cert}",
        f"--key-file={pki.server.key}",
        f"--trusted-ca-file={pki.ca.cert_path}",
        "--client-cert-auth",
        scheme="https",
    )
    try:
        server = TlsEtcd(url, pki)
        asyncio.run(_wait_until_serving(server))
        yield server
    finally:
        process.kill()
        process.wait(10)


async def _wait_until_serving(server: TlsEtcd, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            etcd = await Etcd.connect([server.url], 2.0, tls=server.client_tls)
        except MetadataUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
            continue
        await etcd.close()
        return


AUTH_USER, AUTH_PASSWORD = "kafscale", "etcd-s3cret"


@contextmanager
def running_auth_etcd(directory: Path) -> Iterator[str]:
    """etcd with authentication enabled: ``AUTH_USER`` may read and write ``/kafscale``."""
    with restartable_auth_etcd(directory) as etcd:
        yield etcd.url


@dataclass
class AuthEtcd:
    """An etcd with authentication on that a test can administer (as root) and restart on
    its ports and data: a restart breaks every watch, so clients create them again and etcd
    checks their permissions then (it checks a watch's only when it is created)."""

    url: str
    process: subprocess.Popen[bytes]
    etcdctl_path: str
    log_path: Path

    def as_root(self, *command: str) -> None:
        _etcdctl(self.etcdctl_path, self.url, ["--user=root:root-pw", *command])

    def refuse_brokers(self) -> None:
        """The brokers' role loses every permission on ``/kafscale`` (a role changed by hand)."""
        self.as_root("role", "revoke-permission", "kafscale", "--prefix=true", "/kafscale")

    def allow_brokers(self, permission: str = "readwrite") -> None:
        """The brokers' role may ``permission`` (read, write, readwrite) ``/kafscale``."""
        self.as_root(
            "role", "grant-permission", "kafscale", "--prefix=true", permission, "/kafscale"
        )

    def restart(self) -> None:
        self.process.kill()
        self.process.wait(10)
        self.process = children.spawn(
            list(self.process.args),  # type: ignore[arg-type]
            stdout=self.log_path.open("ab"),
            stderr=subprocess.STDOUT,
        )


@contextmanager
def restartable_auth_etcd(directory: Path) -> Iterator[AuthEtcd]:
    """``running_auth_etcd``, as an ``AuthEtcd``."""
    directory.mkdir(parents=True, exist_ok=True)
    binary = find_etcd_binary()
    process, url = start_etcd_process(directory)
    etcd = AuthEtcd(url, process, str(binary.with_name("etcdctl")), directory / "etcd.log")
    try:
        for command in (
            ["user", "add", "root:root-pw"],
            ["user", "add", f"{AUTH_USER}:{AUTH_PASSWORD}"],
            ["role", "add", "kafscale"],
            ["role", "grant-permission", "kafscale", "--prefix=true", "readwrite", "/kafscale"],
            ["user", "grant-role", AUTH_USER, "kafscale"],
            ["auth", "enable"],
        ):
            _etcdctl(etcd.etcdctl_path, url, command)
        yield etcd
    finally:
        etcd.process.kill()
        etcd.process.wait(10)


@pytest.fixture
def auth_etcd(tmp_path: Path) -> Iterator[AuthEtcd]:
    with restartable_auth_etcd(tmp_path / "etcd-auth") as etcd:
        yield etcd


@contextmanager
def brokers_on_auth_etcd(
    etcd: AuthEtcd, s3: S3Endpoint, cluster: str, directory: Path, **env: str
) -> Iterator[BrokerCluster]:
    """Brokers of ``cluster`` logging in to ``etcd`` as ``AUTH_USER``, with ``env`` set."""
    bucket = unique_bucket("b")
    s3.client().create_bucket(Bucket=bucket)
    login = {"KAFSCALE_ETCD__USERNAME": AUTH_USER, "KAFSCALE_ETCD__PASSWORD": AUTH_PASSWORD}
    brokers = BrokerCluster(etcd.url, s3, bucket, cluster, directory, extra_env=login | env)
    try:
        yield brokers
    finally:
        brokers.stop_all()


def _etcdctl(etcdctl: str, url: str, command: list[str], timeout_s: float = 30) -> None:
    """Runs one etcdctl command, retried while etcd is still starting."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = children.run(
            [etcdctl, f"--endpoints={url}", "--dial-timeout=1s", *command],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"etcdctl {' '.join(command)}: {done.stderr}")
        time.sleep(0.2)
