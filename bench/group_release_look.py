"""CPU of one look of the coordinator's group release loop over many coordinated groups.

The loop (``GroupCoordinator._let_go_of_unused``) looks every few seconds (``idle_release_ms``
/ 2, at most ``vacant_release_ms`` / 2) for groups to let go, on the event loop. This builds
``--groups`` runtimes of ``--offsets`` committed offsets each (no etcd: the runtimes are never
written; the coordinator is built without its etcd side, only what ``release_due`` reads), all
asked for just now, as groups in use are, and prints the CPU of ``release_due`` per look: what
every look stalls the event loop for. Compare versions by running it with ``PYTHONPATH`` at
another tree's ``src``::

    .venv/bin/python bench/group_release_look.py --groups 2000 --offsets 100
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from kafscale.broker.groups.coordinator import GroupCoordinator
from kafscale.broker.groups.model import GroupConfig
from kafscale.broker.groups.runtime import GroupRuntime
from kafscale.broker.groups.store import CommittedOffset, LoadedGroup


def _coordinator(config: GroupConfig, groups: int, offsets: int) -> GroupCoordinator:
    coordinator = GroupCoordinator.__new__(GroupCoordinator)  # no etcd, no tasks
    coordinator.config = config
    coordinator._runtimes, coordinator._used_at = {}, {}
    committed = {("t", p): CommittedOffset(5, commit_timestamp_ms=1) for p in range(offsets)}
    now_s = time.monotonic()
    for index in range(groups):
        group_id = f"g{index}"
        loaded = LoadedGroup(None, dict(committed))
        runtime = GroupRuntime(group_id, None, None, config, loaded, lambda *_: None)  # type: ignore[arg-type]
        coordinator._runtimes[group_id] = runtime
        coordinator._used_at[group_id] = now_s
    return coordinator


async def _measure(groups: int, offsets: int, looks: int) -> None:
    coordinator = _coordinator(GroupConfig(), groups, offsets)
    costs = []
    for _ in range(looks):
        started = time.process_time()
        coordinator.release_due(time.monotonic())
        costs.append(time.process_time() - started)
    print(
        f"{groups} groups x {offsets} offsets, all in use: one look "
        f"{1000 * statistics.median(costs):.2f} ms CPU (median of {looks}), "
        f"max {1000 * max(costs):.2f} ms"
    )
    for runtime in coordinator._runtimes.values():
        for task in runtime.unload():
            task.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=2000)
    parser.add_argument("--offsets", type=int, default=100, help="committed offsets per group")
    parser.add_argument("--looks", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(_measure(args.groups, args.offsets, args.looks))


if __name__ == "__main__":
    main()
