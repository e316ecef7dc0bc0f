"""Shared pieces of the benches: etcd, moto's S3 server and broker processes on loopback.

A small copy of what ``tests/harness`` does (benches never import from ``tests/``; broker
processes are driven by ``kafscale.broker.child_process``, which both share):

* :class:`Stack` starts a single-node etcd (``EmbeddedEtcd``, fast and without fsync), or with
  ``etcd_members=3`` a cluster of three (brokers get every member's URL; :func:`etcd_leader`
  names the one leading), and moto's S3 app in a child process (served alone, as
  ``tests/harness/s3.py`` does; a process of its own so that its request threads and the
  bench's client threads do not share one GIL), creates a bucket, and starts ``kafscale broker``
  processes configured through environment variables exactly as the test harness and the
  Kubernetes manifests do. Everything is stopped when the ``with`` block ends,
  also on errors and Ctrl-C.
* :class:`RawKafka` and :func:`make_batch`: a blocking Kafka connection and a v2 record-batch
  builder, for measurements that must bypass a client's routing and retry back-off.
* :class:`Sampler`: a thread that samples a process's RSS (``/proc/<pid>/status``, VmRSS).
* :func:`percentile`, :func:`cpu_seconds`: small statistics helpers.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import SecretStr

from kafscale.broker.child_process import BrokerProcess, free_port_run
from kafscale.broker.config import StorageKind, StorageSettings
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol import codec
from kafscale.broker.protocol.batch_encoder import encode_batch, encode_record

ACCESS_KEY = "bench"
SECRET_KEY = "bench"
REGION = "us-east-1"

_MOTO_SCRIPT = """
import gc, sys, threading
from werkzeug.serving import make_server
from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
gc.set_threshold(700, 10, 1_000_000_000)  # no full collections: see MotoProcess
server = make_server(
    "127.0.0.1", int(sys.argv[1]), create_backend_app("s3"), threaded=True,
    request_handler=MotoRequestHandler,
)
threading.Thread(target=server.serve_forever, daemon=True).start()
print("ready", flush=True)
try:
    sys.stdin.read()  # runs until the parent closes our stdin (or kills us)
finally:
    server.shutdown()
"""


# --- the S3 server ------------------------------------------------------------------------------


class MotoProcess:
    """moto's S3 app in a child process on a free loopback port.

    Served alone rather than through ``ThreadedMotoServer``, whose dispatcher finds the service
    of every request by listing moto's package directory and matching hundreds of URL patterns:
    half of moto's CPU for a 1 KiB PUT (3.0 against 1.4 ms), and a sixth for a 4 MiB one.

    CPython's full (generation 2) garbage collections are switched off in that process: moto
    keeps every stored object on its heap, and once it holds ~100k Python objects each full
    collection stops all request threads for 60-95 ms (measured with ``gc.callbacks``), a pause
    no S3 service has, which landed on one flush round of every latency run. Reference counting
    still frees all that is not in a cycle, and the younger generations still collect cycles."""

    def __init__(self) -> None:
        self.port = free_port_run()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout_s: float = 30.0) -> MotoProcess:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _MOTO_SCRIPT, str(self.port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError("moto's S3 server did not start")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return self
            time.sleep(0.05)
        raise TimeoutError("moto's S3 server is not listening")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(OSError):
            assert self.process.stdin is not None
            self.process.stdin.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


def storage_settings(endpoint: str, bucket: str, max_concurrency: int = 16) -> StorageSettings:
    """The broker's own storage settings for ``bucket`` (for the raw PUT comparison)."""
    return StorageSettings(
        kind=StorageKind.S3,
        bucket=bucket,
        endpoint=endpoint,
        region=REGION,
        access_key_id=SecretStr(ACCESS_KEY),
        secret_access_key=SecretStr(SECRET_KEY),
        max_concurrency=max_concurrency,
    )


# --- broker processes ---------------------------------------------------------------------------


@dataclass
class Stack:
    """etcd + moto S3 + a bucket, and the broker processes started on them."""

    cluster: str = "bench"
    broker_env: dict[str, str] = field(default_factory=dict)
    keep_workdir: bool = False
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="kafscale-bench-")))
    bucket: str = "kafscale-bench"
    etcd_members: int = 1
    etcd: EmbeddedEtcd | None = None  # the only member, or the first of a cluster
    etcd_cluster: list[EmbeddedEtcd] = field(default_factory=list)
    s3: MotoProcess | None = None
    brokers: list[BrokerProcess] = field(default_factory=list)

    def __enter__(self) -> Stack:
        atexit.register(self.close)
        try:
            # Bound to this process, as its brokers are (moto ends when its stdin closes):
            # a bench killed with SIGKILL leaves nothing running.
            if self.etcd_members > 1:
                self.etcd_cluster = start_etcd_cluster(self.workdir, self.etcd_members)
                self.etcd = self.etcd_cluster[0]
            else:
                etcd = EmbeddedEtcd(
                    self.workdir / "etcd", fast=True, no_fsync=True, die_with_parent=True
                )
                self.etcd = etcd.start()
                self.etcd_cluster = [etcd]
            self.s3 = MotoProcess().start()
            self.s3_client().create_bucket(Bucket=self.bucket)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None and not isinstance(exc, KeyboardInterrupt):
            for broker in self.brokers:
                print(f"--- {broker.log_path.name} (tail)\n{broker.tail(20)}", file=sys.stderr)
        self.close()

    def close(self) -> None:
        for broker in self.brokers:
            broker.kill()
        if self.s3 is not None:
            self.s3.stop()
        for member in self.etcd_cluster or ([self.etcd] if self.etcd else []):
            if member.running:
                member.stop()
        if not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def etcd_url(self) -> str:
        assert self.etcd is not None
        return self.etcd.client_url

    @property
    def etcd_urls(self) -> list[str]:
        """Every etcd member's client URL (one for a single node)."""
        return [member.client_url for member in self.etcd_cluster] or [self.etcd_url]

    @property
    def s3_url(self) -> str:
        assert self.s3 is not None
        return self.s3.url

    def s3_client(self, max_concurrency: int = 16) -> Any:
        """A boto3 client built exactly as the broker builds its own."""
        from kafscale.broker.storage.s3 import build_client

        return build_client(storage_settings(self.s3_url, self.bucket, max_concurrency))

    def env(self, port: int, admin_port: int, cluster: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
        env.update(
            {
                "KAFSCALE_CLUSTER": cluster or self.cluster,
                "KAFSCALE_ETCD__ENDPOINTS": json.dumps(self.etcd_urls),
                "KAFSCALE_STORAGE__KIND": "s3",
                "KAFSCALE_STORAGE__BUCKET": self.bucket,
                "KAFSCALE_STORAGE__ENDPOINT": self.s3_url,
                "KAFSCALE_STORAGE__REGION": REGION,
                "KAFSCALE_STORAGE__ACCESS_KEY_ID": ACCESS_KEY,
                "KAFSCALE_STORAGE__SECRET_ACCESS_KEY": SECRET_KEY,
                "KAFSCALE_LISTENER__HOST": "127.0.0.1",
                "KAFSCALE_LISTENER__PORT": str(port),
                "KAFSCALE_LISTENER__ADMIN_PORT": str(admin_port),
                "KAFSCALE_LOG_LEVEL": "WARNING",
            }
        )
        env.update(self.broker_env)
        return env

    def start_broker(
        self, cluster: str | None = None, command: list[str] | None = None, **overrides: str
    ) -> BrokerProcess:
        """A running broker on ports below the ephemeral range (see ``free_port_run``), with
        the stack's ``broker_env`` and then ``overrides`` in its environment."""
        port, admin_port = free_port_run(), free_port_run()
        broker = BrokerProcess(
            env={**self.env(port, admin_port, cluster), **overrides},
            log_path=self.workdir / f"broker-{len(self.brokers)}.log",
            port=port,
            admin_port=admin_port,
        )
        if command is not None:
            broker.command = command
        self.brokers.append(broker)
        return broker.start()

    @property
    def live_brokers(self) -> list[BrokerProcess]:
        """Running brokers that were not asked to stop."""
        return [b for b in self.brokers if b.alive and not b.stopping]

    def etcd_metrics(self) -> dict[str, float]:
        """etcd's Prometheus counters, summed over labels we do not care about."""
        text = urllib.request.urlopen(self.etcd_url + "/metrics", timeout=5).read().decode()
        return parse_metrics(text)


def start_etcd_cluster(workdir: Path, members: int) -> list[EmbeddedEtcd]:
    """``members`` etcd members forming one cluster on loopback, healthy (a leader elected).

    etcd's default timing (100-ms heartbeats, 1-s elections), not the single node's ``fast``
    one: on a loaded machine 50-ms heartbeats make members depose healthy leaders."""
    names = [f"m{i}" for i in range(members)]
    peers = [free_port_run() for _ in names]
    initial = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(names, peers, strict=True))
    cluster = [
        EmbeddedEtcd(
            workdir / f"etcd-{name}",
            name=name,
            peer_port=peer,
            no_fsync=True,
            die_with_parent=True,
            initial_cluster=initial,
            start_timeout_s=120,
        )
        for name, peer in zip(names, peers, strict=True)
    ]
    try:
        for member in cluster:
            member.launch()
        for member in cluster:
            member.wait_healthy()
    except BaseException:
        for member in cluster:
            member.kill()
        raise
    return cluster


def etcd_status(url: str, timeout_s: float = 2.0) -> dict[str, Any]:
    """A member's ``Maintenance.Status`` through etcd's JSON gateway (member id, leader id)."""
    request = urllib.request.Request(url + "/v3/maintenance/status", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return dict(json.loads(response.read()))


def etcd_leader(members: Sequence[EmbeddedEtcd]) -> EmbeddedEtcd | None:
    """The member that leads now, by the members' own word; None while there is no leader
    (an election, or no member answers)."""
    ids: dict[str, EmbeddedEtcd] = {}
    leaders: set[str] = set()
    for member in members:
        if not member.running:
            continue
        with contextlib.suppress(OSError, ValueError):
            status = etcd_status(member.client_url)
            ids[str(status["header"]["member_id"])] = member
            if str(status.get("leader", "0")) != "0":
                leaders.add(str(status["leader"]))
    if len(leaders) != 1:
        return None
    return ids.get(leaders.pop())


def parse_metrics(text: str) -> dict[str, float]:
    """``name{labels} value`` lines into {``name{labels}``: value}."""
    metrics: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            metrics[name] = float(value)
    return metrics


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(30)


def wait_for(predicate: Any, timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if predicate():
                return
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")


# --- a raw Kafka connection ---------------------------------------------------------------------

PRODUCE, METADATA = 0, 3
PRODUCE_VERSION, METADATA_VERSION = 9, 9


class RawKafka:
    """A blocking Kafka connection speaking through the broker's own codec."""

    def __init__(self, bootstrap: str, timeout_s: float = 30.0) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self._sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._correlation = 0

    def close(self) -> None:
        self._sock.close()

    def request(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        self._correlation += 1
        self._sock.sendall(codec.encode_request(api_key, version, self._correlation, body))
        (length,) = struct.unpack(">i", self._recv_exactly(4))
        return codec.decode_response(self._recv_exactly(length), api_key, version)

    def _recv_exactly(self, size: int) -> bytes:
        chunks = []
        while size:
            chunk = self._sock.recv(size)
            if not chunk:
                raise ConnectionError("connection closed")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def produce(self, topic: str, partition: int, batch: bytes) -> tuple[int, int]:
        """(error code, base offset) of an acks=all produce of ``batch``."""
        body = {
            "acks": -1,
            "timeout": 30_000,
            "topic_data": [
                {"name": topic, "partition_data": [{"index": partition, "records": batch}]}
            ],
        }
        response = self.request(PRODUCE, PRODUCE_VERSION, body)
        result = response.responses[0].partition_responses[0]
        return int(result.error_code), int(result.base_offset)

    def leader(self, topic: str, partition: int) -> int:
        """The leader id Metadata names for the partition (-1: none)."""
        body = {"topics": [{"name": topic}], "allow_auto_topic_creation": False}
        response = self.request(METADATA, METADATA_VERSION, body)
        for entry in response.topics:
            if entry.name == topic:
                for p in entry.partitions:
                    if int(p.partition_index) == partition:
                        return int(p.leader_id)
        return -1


def make_batch(values: Sequence[bytes], timestamp_ms: int | None = None) -> bytes:
    """An uncompressed v2 record batch (no key, no headers) with a correct CRC32C, laid out by
    the broker's own batch encoder."""
    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    records = b"".join(encode_record(i, 0, None, value) for i, value in enumerate(values))
    return encode_batch(records, len(values), base_timestamp=ts, max_timestamp=ts)


# --- measuring ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and of its children it has waited for (the
    bench's consumer processes and kcat)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        ticks = sum(int(field) for field in fields[11:15])  # utime stime cutime cstime
        return ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def minor_faults(pid: int) -> int:
    """Minor page faults of a process so far: each is a page touched for the first time, which
    on a VM whose host backs memory lazily costs microseconds (a fresh 4 MiB buffer ~2 ms)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[7])
    except (OSError, IndexError, ValueError):
        return 0


class Sampler(threading.Thread):
    """Samples a process's RSS every ``interval_s`` until stopped; keeps the maximum."""

    def __init__(self, pid: int, interval_s: float = 0.1) -> None:
        super().__init__(daemon=True, name=f"rss-{pid}")
        self.pid = pid
        self.interval_s = interval_s
        self.max_rss = 0
        self.samples = 0
        self.series: list[tuple[float, int]] = []  # (time.monotonic(), RSS bytes)
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            rss = rss_bytes(self.pid)
            self.series.append((time.monotonic(), rss))
            self.max_rss = max(self.max_rss, rss)
            self.samples += 1
            self._stop_event.wait(self.interval_s)

    def max_between(self, t0: float, t1: float) -> int:
        return max((rss for t, rss in self.series if t0 <= t <= t1), default=0)

    def stop(self) -> int:
        self._stop_event.set()
        self.join(2)
        self.max_rss = max(self.max_rss, rss_bytes(self.pid))
        return self.max_rss


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"
