"""The Java AdminClient's offset and log-dir calls (``java/OffsetsAdmin.java``) for tests:
``deleteConsumerGroupOffsets`` (kafka-consumer-groups.sh --delete-offsets),
``describeLogDirs`` (kafka-log-dirs.sh --describe) and ``alterReplicaLogDirs``, compiled once per
source version against the jars ``java_client`` installs."""

from __future__ import annotations

from pathlib import Path

from harness import children
from harness.java_client import java_program

SOURCE = Path(__file__).with_name("java") / "OffsetsAdmin.java"


def java_offsets_admin() -> list[str]:
    """The command running ``OffsetsAdmin`` (compiled on first use)."""
    return java_program(SOURCE, "OffsetsAdmin")


def java_lines(*args: str) -> list[list[str]]:
    """``OffsetsAdmin args``' output, split into words per line (fails on a non-zero exit)."""
    done = children.run([*java_offsets_admin(), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return [line.split() for line in done.stdout.splitlines()]
