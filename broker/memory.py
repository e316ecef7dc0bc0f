"""Keep the broker's resident memory near what it holds: cache + data in flight.

The broker's big buffers (segments of a few MiB, fetched objects, request frames) are allocated
in boto3's worker threads and in the event loop, kept in the segment cache for a while, and
freed in the order they were cached. glibc's defaults serve that pattern badly: every thread gets
its own malloc arena, and after the first large buffer is freed the mmap threshold rises so
later ones come from the arenas' heaps, where freed holes between live buffers are never given
back. A 256 MiB cache then showed as 750 MB of RSS while consumers read older data. With large
buffers always mapped on their own (returned to the system when freed) and two arenas, the same
run peaks at 470 MB. The price is page faults: a fresh 4 MiB mapping costs about 2 ms to fill
on the 2-core VM; over a 586 MiB produce the broker used 3.2-3.4 CPU seconds with these
settings and 2.9-3.2 with buffers from the heap (which peaked at 618 MB). See bench/README.md.
New segments avoid most of that price by reusing the buffers of evicted ones (see
``buffer_pool``).

Settings made through glibc's own environment variables (``MALLOC_ARENA_MAX``,
``MALLOC_MMAP_THRESHOLD_``) win; elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import gc
import os

M_MMAP_THRESHOLD = -3  # from glibc's malloc.h
M_ARENA_MAX = -8
LARGE_BUFFER_BYTES = 1024 * 1024
ARENAS = 2


def tune_allocator() -> bool:
    """Apply the settings above; True if glibc took them. Call before threads start."""
    if os.uname().sysname != "Linux":
        return False
    # Imported here: only a starting broker calls this; every other ``kafscale`` command
    # (``drain``, a pod's preStop hook, among them) imports this module for nothing else.
    import ctypes

    try:
        # The process's own symbols, libc's among them: ``ctypes.util.find_library("c")``
        # ran ``ldconfig -p`` in a child process at every start to find the same library.
        libc = ctypes.CDLL(None)
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # not glibc (musl's mallopt does nothing)
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    settings = (
        ("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, LARGE_BUFFER_BYTES),
        ("MALLOC_ARENA_MAX", M_ARENA_MAX, ARENAS),
    )
    results = [mallopt(option, value) for env, option, value in settings if env not in os.environ]
    return all(result == 1 for result in results)


def freeze_startup_objects() -> int:
    """Exclude everything alive after start-up from the cyclic garbage collector's full passes.

    A started broker holds ~110k long-lived objects (botocore's service models, gRPC, kio's
    schema classes); a full collection walks all of them and stopped the event loop for 50-60
    ms on the 2-core VM, showing up as produce-latency tails and consume stalls. They live as
    long as the process, so collecting them gains nothing. Returns how many were frozen.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
