"""ruff (lint and format) and strict mypy stay clean: CI runs them as part of the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from harness import children

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return children.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_is_clean() -> None:
    result = run(str(BIN / "ruff"), "check", "broker", "operator", "pipeline", "tests", "bench")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean() -> None:
    """The code is as ``ruff format`` writes it (``make lint`` checks the same folders): a
    file formatted by hand drifts, and the next edit's diff carries the reformatting."""
    result = run(
        str(BIN / "ruff"), "format", "--check", "broker", "operator", "pipeline", "tests", "bench"
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_is_clean() -> None:
    result = run(str(BIN / "mypy"))
    assert result.returncode == 0, result.stdout + result.stderr
