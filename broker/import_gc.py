"""The cyclic garbage collector, paused while a ``kafscale`` process imports its modules.

Importing the CLI and the broker creates ~60k objects that live as long as the process (classes,
functions, kio's and pydantic's schemas) and ~1k that are garbage. With the collector running,
those allocations trigger about a hundred collections that walk what was imported so far, to
free ~1k objects (collector CPU per broker start, median of 8 alternating pairs: 0.099 s
running, 0.081 s paused; small, and below what ``bench/startup.py`` resolves). Paused, one
collection afterwards (``memory.freeze_startup_objects``, or the first one the collector runs by
itself) frees the same garbage. An import is bounded work, so the garbage it may leave
uncollected meanwhile is bounded too; the collector's previous state is restored
even when the import fails.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collection_paused() -> Iterator[None]:
    """Run the body with the cyclic collector off; then as it was before (on, unless a caller
    had turned it off)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
