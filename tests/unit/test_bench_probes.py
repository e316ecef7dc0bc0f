"""The benches' timing probes wrap broker internals by name; a refactor must not silently
break ``bench/produce_consume.py --timings`` (it once did)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_timing_probes_install_on_the_current_broker_code(tmp_path: Path) -> None:
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import _timed_broker as t; "
        "t.install(sys.argv[2]); t.emit('probe', ok=True)"
    )
    out = tmp_path / "timings.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", script, str(BENCH), str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert out.read_text() == '{"kind": "probe", "ok": true}\n'
