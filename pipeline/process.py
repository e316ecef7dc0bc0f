"""Once-per-process set-up of the Python processes Spark runs the data source in.

Spark keeps its Python workers (executors) and planner processes (driver) alive across tasks
and queries. By their first call into the data source they hold everything their imports left
alive (pyspark, pyarrow, numba's compiled kernels, gRPC: 100k+ objects), for as long as they
live. The cyclic garbage collector's full passes walked all of them again and again while rows
were read: ``perf`` on the workers of a 1M-row query put 45 % of their CPU in the collector,
and it was most of the planner's. Freezing them (``freeze_startup_objects``, as the broker
does at start-up) takes them out of those passes; objects made later are collected as before.
"""

from __future__ import annotations

from kafscale.broker.memory import freeze_startup_objects

_frozen = False


def freeze_imports_once() -> None:
    """Call at the data source's entry points in Spark's processes; only the first call works."""
    global _frozen
    if not _frozen:
        _frozen = True
        freeze_startup_objects()
