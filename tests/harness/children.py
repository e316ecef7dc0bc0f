"""The environment of the ``kafscale`` processes the harness starts (brokers, proxies, the CLI,
``kafscale local``): the one place that decides what a child inherits from the test process.

Hypothesis is installed in the dev venv for the property tests; kio imports it when present and
registers a strategy for each of its types, which cost every child process ~0.1 s of CPU (a suite
run starts several hundred). The children get a ``PYTHONPATH`` entry first whose ``hypothesis``
package refuses to import, so they start as they would from a production install.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

NO_HYPOTHESIS = Path(__file__).resolve().with_name("no_hypothesis")


def child_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with ``NO_HYPOTHESIS`` first on the child's ``PYTHONPATH``."""
    paths = [str(NO_HYPOTHESIS), *filter(None, [base.get("PYTHONPATH")])]
    return {**base, "PYTHONPATH": os.pathsep.join(paths)}


def settings_free_env() -> dict[str, str]:
    """This process's environment without its ``KAFSCALE_*`` settings (a child gets its own),
    for a kafscale child."""
    return child_env({k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")})
