"""The broker's resident memory follows what it holds (cache + buffers in flight).

A cache of large buffers fetched in worker threads and evicted oldest-first is the broker's
read path; with glibc's defaults its RSS grew to about twice the cache (see broker/memory.py).
"""

from __future__ import annotations

import os
import sys

import pytest
from harness import children

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc allocator settings"),
]

CACHE_MIB = 64

# Buffers of 1-4 MiB made in eight worker threads (as boto3 reads objects), kept in a FIFO cache
# of CACHE_MIB and dropped from the main thread; prints the peak RSS growth in MiB.
SCRIPT = f"""
import collections, random, sys
from concurrent.futures import ThreadPoolExecutor
from kafscale.broker.memory import tune_allocator

if sys.argv[1] == "tuned" and not tune_allocator():
    sys.exit("glibc refused the settings")

def rss():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

rng = random.Random(7)
base, peak, cached = rss(), 0, 0
cache = collections.deque()
with ThreadPoolExecutor(8) as pool:
    for _ in range(40):
        sizes = [rng.randint(1 << 20, 4 << 20) for _ in range(8)]
        for body in pool.map(lambda size: b"\\x01" * size, sizes):
            cache.append(body)
            cached += len(body)
            while cached > {CACHE_MIB} << 20:
                cached -= len(cache.popleft())
        peak = max(peak, rss() - base)
print(peak >> 20)
"""


def _peak_growth_mib(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = children.run(
        [sys.executable, "-c", SCRIPT, mode],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=env,
    )
    return int(done.stdout)


def test_tuned_allocator_keeps_rss_near_the_cache_size() -> None:
    # With glibc's defaults the same script grew by 104-117 MiB here (mode "plain").
    assert _peak_growth_mib("tuned") <= CACHE_MIB + 16


def test_a_started_broker_leaves_its_startup_objects_out_of_full_collections() -> None:
    """Full garbage collections walk every tracked object; after start-up the broker's tens of
    thousands of long-lived ones (botocore models, gRPC, kio) are frozen out of them."""
    script = (
        "import gc, kafscale.broker.app\n"
        "from kafscale.broker.memory import freeze_startup_objects\n"
        "before = len(gc.get_objects())\n"
        "frozen = freeze_startup_objects()\n"
        "print(before, frozen, len(gc.get_objects()))\n"
    )
    out = children.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    before, frozen, walked = (int(n) for n in out)
    assert before > 10_000
    assert frozen >= before * 0.9
    assert walked < 1_000
