"""The Java AdminClient's offset and log-dir calls (``java/OffsetsAdmin.java``) for tests:
``deleteConsumerGroupOffsets`` (kafka-consumer-groups.sh --delete-offsets),
``describeLogDirs`` (kafka-log-dirs.sh --describe) and ``alterReplicaLogDirs``, compiled once per
source version against the jars ``java_client`` installs."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.java_client import CACHE, _cache_locked, _jars

SOURCE = Path(__file__).with_name("java") / "OffsetsAdmin.java"


def java_offsets_admin() -> list[str]:
    """The command running ``OffsetsAdmin`` (compiled on first use)."""
    if shutil.which("java") is None or shutil.which("javac") is None:
        pytest.fail("Java 17 (java, javac) is needed for the Java client test", pytrace=False)
    with _cache_locked():
        jars = _jars()
        digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
        classes = CACHE / f"offsets-admin-classes-{digest}"
        if not (classes / "OffsetsAdmin.class").exists():
            classes.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                ["javac", "-cp", f"{jars}/*", "-d", str(classes), str(SOURCE)],
                check=True,
                capture_output=True,
                timeout=300,
            )
    return ["java", "-cp", f"{classes}:{jars}/*", "OffsetsAdmin"]


def java_lines(*args: str) -> list[list[str]]:
    """``OffsetsAdmin args``' output, split into words per line (fails on a non-zero exit)."""
    done = subprocess.run(
        [*java_offsets_admin(), *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return [line.split() for line in done.stdout.splitlines()]
