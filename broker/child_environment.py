"""The environment a ``kafscale`` child process starts with, when a test or a bench starts it.

Apart from ``child_process`` (which also probes a broker's admin port, and imports what that
needs) so that a harness module may use it and stay cheap to import: ``harness.children`` is
imported by modules that processes Spark starts import too (``harness.spark`` through
``harness.java_client``), and ``test_spark_source_imports`` counts what those import.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

NO_HYPOTHESIS = Path(__file__).resolve().parents[1] / "tests" / "harness" / "no_hypothesis"
"""A ``hypothesis`` package that refuses to import. kio imports ``hypothesis.strategies``
whenever it can and registers a strategy for each of its types: ~0.1 s of CPU per process that
imports the broker, which the dev venv (it has Hypothesis for the property tests) would
otherwise cost every broker, proxy and CLI child of the tests and of the benches run by hand.
Absent outside a source checkout (an installed wheel has no Hypothesis either)."""


def child_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with ``NO_HYPOTHESIS`` first on ``PYTHONPATH`` (once: applying it again
    changes nothing), for a child that imports kafscale."""
    if not NO_HYPOTHESIS.is_dir():
        return dict(base)
    shim = str(NO_HYPOTHESIS)
    paths = [p for p in (base.get("PYTHONPATH") or "").split(os.pathsep) if p and p != shim]
    return {**base, "PYTHONPATH": os.pathsep.join([shim, *paths])}
