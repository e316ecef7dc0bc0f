"""A program that plays ``kafscale local`` for its etcd: run as a child by
``test_etcd_parent_death.py``.

    python etcd_parent.py DATA_DIR PUTS CONCURRENCY

It starts ``EmbeddedEtcd(DATA_DIR, die_with_parent=True)`` as ``kafscale local`` does (fsync on),
prints one JSON line with the etcd's ports and pid, then puts distinct keys
``/test/k/<i>`` (``CONCURRENCY`` in flight, as a broker's flush rounds keep etcd applying; each
writer's keys bound to a lease of its own, as partition leases are to a broker's session) and,
the moment ``PUTS`` of them have been answered, prints the answered ``i`` as a JSON line and
SIGKILLs itself, the other puts still in flight: the kernel then signals its etcd
(``PR_SET_PDEATHSIG``). With ``PUTS`` 0 it only waits to be killed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import aetcd

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

KEY_PREFIX = b"/test/k/"


def _say(message: object) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


async def _put_until_killed(client_url: str, puts: int, concurrency: int) -> None:
    host, port = client_url.removeprefix("http://").rsplit(":", 1)
    answered: list[int] = []
    async with aetcd.Client(host=host, port=int(port), timeout=60) as client:

        async def writer(first: int) -> None:
            lease = await client.lease(60)  # as brokers bind partition leases to a session
            i = first
            while True:
                await client.put(KEY_PREFIX + b"%d" % i, b"v", lease=lease)
                answered.append(i)
                if len(answered) >= puts:
                    _say({"answered": answered})
                    os.kill(os.getpid(), signal.SIGKILL)
                i += concurrency

        await asyncio.gather(*(writer(w) for w in range(concurrency)))


def main() -> None:
    data_dir, puts, concurrency = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    etcd = EmbeddedEtcd(data_dir, die_with_parent=True, start_timeout_s=60).start()
    _say({"client": etcd.client_port, "peer": etcd.peer_port, "pid": etcd.pid})
    if puts == 0:
        while True:
            time.sleep(60)
    asyncio.run(_put_until_killed(etcd.client_url, puts, concurrency))


if __name__ == "__main__":
    main()
