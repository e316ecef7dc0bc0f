"""An etcd started with ``die_with_parent`` (``kafscale local``'s) keeps every write it answered
when its parent is SIGKILLed.

The kernel signals such an etcd when its parent dies (``PR_SET_PDEATHSIG``). It used to send
SIGKILL; the bundled etcd 3.5.1 then lost answered writes now and then (etcd-io/etcd#13766: the
consistent index reaches bbolt ahead of the data, and the restart skips those WAL entries;
etcd-io/etcd#14370: a single member answers before its WAL write), which is how ``kafscale
local`` lost 300 acked records in CI. It now sends SIGTERM: etcd stops its server, finishing
the raft Ready it is saving, and closes its backend consistently.

The parent is ``harness/etcd_parent.py``, a real process playing ``kafscale local``: real etcd
(fsync on, as ``kafscale local`` runs it), puts through aetcd as brokers make them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aetcd
import pytest
from harness import children
from harness.etcd_parent import KEY_PREFIX

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd, etcd_pids_on

pytestmark = pytest.mark.integration

PARENT = Path(__file__).resolve().parents[1] / "harness" / "etcd_parent.py"
DEADLINE_S = 120.0  # generous: the machine is shared; nothing here is a timing assertion
KILL_ROUNDS = 5
"""Rounds of the loop. With the SIGKILL of before, 2 bench runs in 137 lost answered writes
(bench/README.md): the loop guards the outcome but cannot show the old bug reliably; the test
that the kernel now sends SIGTERM (below) is the one that fails on the old code every time."""


def start_parent(data_dir: Path, puts: int, concurrency: int = 8) -> subprocess.Popen[str]:
    return children.spawn(
        [sys.executable, str(PARENT), str(data_dir), str(puts), str(concurrency)],
        stdout=subprocess.PIPE,
        text=True,
    )


def read_line(process: subprocess.Popen[str]) -> dict[str, Any]:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, f"etcd_parent.py exited with {process.wait(DEADLINE_S)} before saying anything"
    message: dict[str, Any] = json.loads(line)
    return message


def wait_gone(etcd_dir: Path) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while etcd_pids_on(etcd_dir):
        assert time.monotonic() < deadline, "etcd outlived its parent"
        time.sleep(0.02)


async def keys_in(client_url: str) -> set[int]:
    host, port = client_url.removeprefix("http://").rsplit(":", 1)
    async with aetcd.Client(host=host, port=int(port), timeout=60) as client:
        found = await client.get_prefix(KEY_PREFIX)
    return {int(kv.key.removeprefix(KEY_PREFIX)) for kv in found}


def test_the_kernel_stops_an_orphaned_etcd_with_sigterm(tmp_path: Path) -> None:
    """The parent dies by SIGKILL; its etcd is told to stop (its log says SIGTERM), not killed."""
    data_dir = tmp_path / "etcd"
    parent = start_parent(data_dir, puts=0)
    try:
        read_line(parent)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(DEADLINE_S)
    wait_gone(data_dir / "etcd")  # and not left running
    log = (data_dir / "etcd.log").read_text()
    assert '"msg":"received signal; shutting down","signal":"terminated"' in log, log[-3000:]


def test_every_write_etcd_answered_survives_its_parents_sigkill(tmp_path: Path) -> None:
    """A few rounds of: answered puts, SIGKILL of the parent with more in flight, a restart on
    the same data. Every answered key is there after each restart."""
    for round_ in range(KILL_ROUNDS):
        data_dir = tmp_path / f"etcd-{round_}"  # fresh keys each round: a lost one shows
        parent = start_parent(data_dir, puts=300)
        try:
            started = read_line(parent)
            answered = set(read_line(parent)["answered"])
        finally:
            parent.kill()  # it has SIGKILLed itself already, unless a read above failed
            parent.wait(DEADLINE_S)
        wait_gone(data_dir / "etcd")
        with EmbeddedEtcd(
            data_dir,
            client_port=started["client"],
            peer_port=started["peer"],
            start_timeout_s=DEADLINE_S,
            die_with_parent=True,
        ) as restarted:
            found = asyncio.run(keys_in(restarted.client_url))
        lost = sorted(answered - found)
        assert not lost, f"round {round_}: {len(lost)} answered writes lost, e.g. {lost[:10]}"


def test_an_etcd_frozen_when_its_parent_died_is_stopped_cleanly_by_the_next_start(
    tmp_path: Path,
) -> None:
    """SIGTERM stays pending in a process stopped with SIGSTOP: such an etcd outlives its
    parent. The next start on its directory (``stop_stale``, as ``kafscale local`` does) wakes
    it, and it stops gracefully rather than after a 5-s wait and a SIGKILL."""
    data_dir = tmp_path / "etcd"
    parent = start_parent(data_dir, puts=0)
    try:
        started = read_line(parent)
        # Stopped before the parent dies: the SIGTERM its death sends must find etcd stopped
        # (one still running would handle it and stop by itself: nothing left to prove).
        children.freeze(started["pid"])
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(DEADLINE_S)
    try:
        stale = EmbeddedEtcd(data_dir, start_timeout_s=DEADLINE_S).stop_stale()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(started["pid"], signal.SIGCONT)  # never left frozen, whatever happened
    assert stale == [started["pid"]]
    assert not etcd_pids_on(data_dir / "etcd")
    log = (data_dir / "etcd.log").read_text()
    assert '"msg":"received signal; shutting down","signal":"terminated"' in log, log[-3000:]
