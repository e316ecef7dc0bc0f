"""The benches' timing probes wrap broker internals by name; a refactor must not silently
break ``bench/produce_consume.py --timings`` (it once did)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from harness import children

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_timing_probes_install_on_the_current_broker_code(tmp_path: Path) -> None:
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import _timed_broker as t; "
        "t.install(sys.argv[2]); t.emit('probe', ok=True); import gc; gc.collect()"
    )
    out = tmp_path / "timings.jsonl"
    done = children.run(
        [sys.executable, "-c", script, str(BENCH), str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in out.read_text().splitlines()]
    assert {"kind": "probe", "ok": True} in events
    # the full collection after the probe is logged with its generation and how long it took
    full = [e for e in events if e["kind"] == "gc" and e["generation"] == 2]
    assert full and full[-1]["end"] >= full[-1]["start"] > 0


def test_timing_probes_pass_on_what_the_wrapped_methods_return(tmp_path: Path) -> None:
    """A probe that dropped ``FlushCommitter._commit``'s result once delayed every ack by a flush
    tick in ``--timings`` runs: the wrappers must hand back what the broker's methods return."""
    script = """
import asyncio, sys
sys.path.insert(0, sys.argv[1])
from kafscale.broker.storage.flush_commit import FlushCommitter
from kafscale.broker.storage.flush_upload import SegmentUploader
from kafscale.broker.storage.flusher import Flusher

async def _commit(self, commits):
    return ["committed"]

async def _round(self, works, previous, committed, handed_off):
    return "round result"

async def upload(self, work, reservations):
    return "uploaded"

class Work:
    batches = []

FlushCommitter._commit, Flusher._round, SegmentUploader.upload = _commit, _round, upload
import _timed_broker as t
t.install(sys.argv[2])
assert asyncio.run(FlushCommitter._commit(None, [])) == ["committed"]
assert asyncio.run(Flusher._round(None, [], None, None, None)) == "round result"
assert asyncio.run(SegmentUploader.upload(None, Work(), [])) == "uploaded"
"""
    done = children.run(
        [sys.executable, "-c", script, str(BENCH), str(tmp_path / "timings.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
