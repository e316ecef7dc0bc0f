"""Drive Debian's ``kcat`` (librdkafka 2.0 inside) as a subprocess: produce lines, consume JSON.

kcat is a separate client with its own librdkafka, older than confluent-kafka's: it pins older
API versions (Metadata v4, for one), which is exactly why it is worth testing against.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from harness import children

KEY_DELIMITER = "\t"


def kcat_binary() -> str:
    path = shutil.which("kcat") or shutil.which("kafkacat")
    if path is None:
        pytest.fail("kcat is not installed: apt-get install -y kcat", pytrace=False)
    return path


def _settings(config: Mapping[str, str]) -> list[str]:
    args = []
    for name, value in config.items():
        args += ["-X", f"{name}={value}"]
    return args


def kcat_produce(
    bootstrap: str,
    topic: str,
    records: Sequence[tuple[str, str]],
    *,
    partition: int | None = None,
    headers: Sequence[tuple[str, str]] = (),
    config: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
) -> None:
    """Produce ``(key, value)`` lines; every record carries ``headers``. Fails on any error."""
    lines = "".join(f"{key}{KEY_DELIMITER}{value}\n" for key, value in records)
    args = [kcat_binary(), "-P", "-b", bootstrap, "-t", topic, "-K", r"\t", "-m", "20"]
    if partition is not None:
        args += ["-p", str(partition)]
    for name, value in headers:
        args += ["-H", f"{name}={value}"]
    args += _settings(config or {})
    result = children.run(args, input=lines.encode(), capture_output=True, timeout=timeout_s)
    stderr = result.stderr.decode(errors="replace")
    assert result.returncode == 0, f"kcat -P exited {result.returncode}:\n{stderr}"
    assert "ERROR" not in stderr and "failed" not in stderr.lower(), stderr


def kcat_consume(
    bootstrap: str,
    topic: str,
    *,
    partition: int | None = None,
    offset: str = "beginning",
    count: int | None = None,
    config: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
) -> list[dict[str, Any]]:
    """Every message from ``offset`` to the end (``-e``), as kcat's JSON envelopes."""
    args = [kcat_binary(), "-C", "-b", bootstrap, "-t", topic, "-o", offset, "-e", "-J", "-q"]
    args += ["-m", "20"]
    if partition is not None:
        args += ["-p", str(partition)]
    if count is not None:
        args += ["-c", str(count)]
    args += _settings(config or {})
    result = children.run(args, capture_output=True, timeout=timeout_s)
    stderr = result.stderr.decode(errors="replace")
    assert result.returncode == 0, f"kcat -C exited {result.returncode}:\n{stderr}"
    return [json.loads(line) for line in result.stdout.decode().splitlines() if line.strip()]


def kcat_headers(envelope: Mapping[str, Any]) -> list[tuple[str, str]]:
    """kcat's flat ``["name", "value", ...]`` header list as pairs."""
    flat = envelope.get("headers") or []
    return list(zip(flat[0::2], flat[1::2], strict=True))


def kcat_list(bootstrap: str, topic: str | None = None, timeout_s: float = 30.0) -> dict[str, Any]:
    """Cluster metadata as kcat sees it (``-L -J``)."""
    args = [kcat_binary(), "-L", "-J", "-b", bootstrap, "-m", "20"]
    if topic is not None:
        args += ["-t", topic]
    result = children.run(args, capture_output=True, timeout=timeout_s)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return dict(json.loads(result.stdout))
