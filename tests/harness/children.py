"""The environment of the ``kafscale`` processes the harness starts (brokers, proxies, the CLI,
``kafscale local``): the one place that decides what a child inherits from the test process.

Hypothesis is installed in the dev venv for the property tests; kio imports it when present and
registers a strategy for each of its types, which cost every child process ~0.1 s of CPU (a suite
run starts several hundred). The children get a ``PYTHONPATH`` entry first whose ``hypothesis``
package refuses to import, so they start as they would from a production install. Every
``BrokerProcess`` (brokers, proxies) gets it on its own; other children (the CLI, ``kafscale
local``, scripts) get it from ``child_env``.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

# One implementation for the harness and the benches (``bench/`` never imports from tests/);
# the stand-in package itself lives here, beside this module.
from kafscale.broker.child_process import NO_HYPOTHESIS as NO_HYPOTHESIS
from kafscale.broker.child_process import child_env as child_env


def settings_free_env() -> dict[str, str]:
    """This process's environment without its ``KAFSCALE_*`` settings (a child gets its own),
    for a kafscale child."""
    return child_env({k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")})


def end_by_stdin(process: subprocess.Popen[Any], timeout_s: float) -> None:
    """Close ``process``'s stdin (the way the test programs, and PySpark's JVM, are told to
    end) and wait ``timeout_s`` for it to exit; kill it if it does not."""
    assert process.stdin is not None
    process.stdin.close()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
