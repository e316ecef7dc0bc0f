"""The proxy does not load the broker's request handlers or its wiring.

The proxy forwards requests; what it needs of the brokers' protocol knowledge lives in modules
with no handler in them: the APIs and versions served (``api/served.py``, what ApiVersions
answers) and each API's error body (``api/error_bodies.py``). Checked in a fresh interpreter
that imports the proxy's entry module (what ``kafscale proxy`` runs), whose ``sys.modules``
nothing else filled.

A few broker API modules remain, for pure functions the proxy applies to its own view
(``SHARED``: the SASL login steps, ListConfigResources' answer, the reassignment and log-dir
checks; the proxy answers those APIs itself, as ``docs/proxy.md`` says). Moving those
functions out of their handler modules shrinks ``SHARED``; this test then asks for the list to
be cut down with it.
"""

from __future__ import annotations

import json
import sys

import pytest
from harness import children

pytestmark = pytest.mark.unit

ENTRY = "kafscale.broker.proxy.app"
API = "kafscale.broker.api."
SHARED = {"config_resources", "log_dirs", "replicas", "sasl"}
"""Handler modules the proxy still imports for pure functions (see the module docstring)."""
NEVER = {
    "kafscale.broker.app",  # the broker's wiring: storage, coordinators, the handler table
    API + "table",
    API + "versions",
    "kafscale.broker.groups.coordinator",
    "kafscale.broker.storage.log_manager",
    "kafscale.broker.transactions.coordinator",
}

_PROBE = f"""
import json, sys
import {ENTRY}
handlers = sorted(
    name[len({API!r}):]
    for name, module in list(sys.modules.items())
    if name.startswith({API!r}) and any(k.startswith("handle_") for k in vars(module))
)
print(json.dumps({{"modules": sorted(sys.modules), "handlers": handlers}}))
"""


@pytest.fixture(scope="module")
def loaded() -> dict[str, list[str]]:
    out = children.run(
        [sys.executable, "-c", _PROBE], check=True, capture_output=True, text=True, timeout=120
    ).stdout
    result: dict[str, list[str]] = json.loads(out)
    return result


def test_the_proxy_loads_neither_the_handler_table_nor_the_brokers_wiring(
    loaded: dict[str, list[str]],
) -> None:
    assert NEVER.isdisjoint(loaded["modules"])


def test_the_proxy_loads_no_handler_module_beyond_the_shared_ones(
    loaded: dict[str, list[str]],
) -> None:
    """Handler modules: those under ``kafscale.broker.api`` with a ``handle_*`` function."""
    assert set(loaded["handlers"]) == SHARED
