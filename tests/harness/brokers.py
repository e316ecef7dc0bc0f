"""Real broker processes for tests: ``kafscale broker`` started on free loopback ports.

``broker_cluster`` gives a factory bound to one etcd cluster prefix and one S3 bucket; each
``start()`` launches a broker process configured through environment variables (the way the
Kubernetes manifests configure it) and waits for its ``/readyz``. Processes are SIGKILLed at
teardown if a test left them running, so a failing test never leaks a broker.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.s3 import S3Endpoint, unique_bucket
from kafscale.broker.admin_http import admin_request
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd, free_port
from kafscale.broker.metadata.etcd import Etcd

KAFSCALE = str(Path(sys.executable).with_name("kafscale"))


@dataclass
class BrokerProcess:
    env: dict[str, str]
    log_path: Path
    port: int
    admin_port: int
    process: subprocess.Popen[bytes] | None = None
    node_id: int = -1

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def start(self, timeout_s: float = 20.0) -> BrokerProcess:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [KAFSCALE, "broker"], env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        self.wait_ready(timeout_s)
        self.node_id = int(self.status()["node_id"])
        return self

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"broker exited with {self.process.returncode}:\n{self.tail()}")
            try:
                if self.http("GET", "/readyz", timeout_s=1)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"broker not ready in {timeout_s}s:\n{self.tail()}")

    def http(self, method: str, path: str, timeout_s: float = 10) -> tuple[int, Any]:
        return admin_request(self.admin_url, method, path, timeout_s)

    def status(self) -> dict[str, Any]:
        return dict(self.http("GET", "/status")[1])

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait: the graceful handoff path."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout_s)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class BrokerCluster:
    """Brokers sharing one etcd prefix and one bucket."""

    etcd_url: str
    s3: S3Endpoint
    bucket: str
    cluster: str
    workdir: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    brokers: list[BrokerProcess] = field(default_factory=list)

    def env(self, port: int, admin_port: int, **overrides: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
        env.update(
            {
                "KAFSCALE_CLUSTER": self.cluster,
                "KAFSCALE_ETCD__ENDPOINTS": json.dumps([self.etcd_url]),
                "KAFSCALE_ETCD__SESSION_TTL_S": "4",
                "KAFSCALE_STORAGE__KIND": "s3",
                "KAFSCALE_STORAGE__BUCKET": self.bucket,
                "KAFSCALE_STORAGE__ENDPOINT": self.s3.url,
                "KAFSCALE_STORAGE__REGION": self.s3.region,
                "KAFSCALE_STORAGE__ACCESS_KEY_ID": self.s3.access_key_id,
                "KAFSCALE_STORAGE__SECRET_ACCESS_KEY": self.s3.secret_access_key,
                "KAFSCALE_LISTENER__HOST": "127.0.0.1",
                "KAFSCALE_LISTENER__PORT": str(port),
                "KAFSCALE_LISTENER__ADMIN_PORT": str(admin_port),
                "KAFSCALE_LOG__FLUSH_INTERVAL_MS": "50",
                "KAFSCALE_LIMITS__SHUTDOWN_GRACE_S": "5",
                "KAFSCALE_LOG_LEVEL": "INFO",
            }
        )
        env.update(self.extra_env)
        env.update(overrides)
        return env

    def start(self, port: int | None = None, **overrides: str) -> BrokerProcess:
        """A new broker (or a restart on ``port`` to keep its address)."""
        port = port or free_port()
        admin_port = free_port()
        index = len(self.brokers)
        broker = BrokerProcess(
            env=self.env(port, admin_port, **overrides),
            log_path=self.workdir / f"broker-{index}.log",
            port=port,
            admin_port=admin_port,
        )
        self.brokers.append(broker)
        return broker.start()

    def object_keys(self, prefix: str) -> list[str]:
        """The keys in the cluster's bucket under ``prefix`` (up to 1000)."""
        listed = self.s3.client().list_objects_v2(Bucket=self.bucket, Prefix=prefix)
        return [o["Key"] for o in listed.get("Contents", [])]

    def etcd_keys(self, under: str) -> list[str]:
        """The etcd keys under ``/kafscale/<cluster>/<under>``."""

        async def read() -> list[str]:
            etcd = await Etcd.connect([self.etcd_url], timeout_s=5)
            try:
                entries = await etcd.get_prefix(keys.cluster_prefix(self.cluster) + under)
                return [entry.key for entry in entries]
            finally:
                await etcd.close()

        return asyncio.run(read())

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers if b.process and b.process.poll() is None)

    def stop_all(self) -> None:
        for broker in self.brokers:
            if broker.process is not None and broker.process.poll() is None:
                broker.process.send_signal(signal.SIGCONT)
                broker.kill()


@pytest.fixture
def broker_cluster(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, cluster_name: str, tmp_path: Path
) -> Iterator[BrokerCluster]:
    bucket = unique_bucket("b")
    _create_bucket(s3_server, bucket)
    cluster = BrokerCluster(etcd_server.client_url, s3_server, bucket, cluster_name, tmp_path)
    try:
        yield cluster
    finally:
        cluster.stop_all()


def _create_bucket(s3: S3Endpoint, bucket: str) -> None:
    s3.client().create_bucket(Bucket=bucket)


@pytest.fixture
def broker(broker_cluster: BrokerCluster) -> BrokerProcess:
    """One running broker on S3 (moto) and etcd."""
    return broker_cluster.start()
