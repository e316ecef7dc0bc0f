"""What a ``kafscale broker`` process imports before it serves (``bench/startup.py`` measures it).

Every pod restart, scale-out and test broker pays for each module the CLI imports. The modules
below serve only some configurations or commands (mTLS, the proxy, ``kafscale local`` and its
PKI, ``status``, clients sending versions Kafka 4 dropped), and were imported by every broker,
~0.4 s of CPU on a busy machine; and every CLI command imported the whole broker. They are
imported where used; this keeps them there.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from harness import children

from kafscale.broker.child_process import child_env

pytestmark = pytest.mark.unit

NOT_FOR_A_PLAIN_BROKER = [
    "cryptography",
    "kafscale.broker.local",
    "kafscale.broker.observability.status",
    "kafscale.broker.protocol.legacy_schemas",
    "kafscale.broker.proxy.app",
    "kafscale.broker.proxy.config",
    "kafscale.broker.security.local_pki",
]

# First what the CLI imports for a command that starts no broker (``drain`` is a pod's preStop
# hook: its import time delays the handoff), then what ``kafscale broker`` imports before it
# serves, and a first answer of the newest Produce and ApiVersions and a Fetch v16 request (the
# versions today's clients send).
_SCRIPT = """
import contextlib, io, json, sys
from kafscale.broker import cli
with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
    cli.main(["drain", "--help"])
drain = sorted(sys.modules)
from kafscale.broker import app  # what ``kafscale broker`` imports when it starts one
from kafscale.broker import memory
memory.tune_allocator()  # as ``kafscale broker`` does before it starts one
from kafscale.broker.protocol import codec
with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
    cli.main(["broker", "--help"])  # the command line parsed as ``kafscale broker`` parses it
with contextlib.redirect_stderr(io.StringIO()):  # its settings read and checked, as at a start
    cli._load_settings(cli._parser("broker").parse_args(["broker"]))
codec.encode_response(18, 3, 1, {"error_code": 0, "api_keys": []})
codec.encode_response(0, 12, 2, {"responses": [], "throttle_time": 0})
codec.request_schema(1, 16)
print(json.dumps({"drain": drain, "broker": sorted(sys.modules)}))
"""


def _imported() -> dict[str, set[str]]:
    done = children.run(
        [sys.executable, "-c", _SCRIPT],
        env=child_env(os.environ),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return {name: set(modules) for name, modules in json.loads(done.stdout).items()}


def test_cli_commands_and_a_plain_broker_import_only_what_they_use() -> None:
    imported = _imported()
    assert "kafscale.broker.drain_hook" in imported["drain"]
    assert "kafscale.broker.app" not in imported["drain"]  # nor the API table behind it
    assert "kafscale.broker.api.table" not in imported["drain"]
    assert "kafscale.broker.app" in imported["broker"]  # the script did import the broker
    assert "ctypes" not in imported["drain"]  # only a starting broker tunes its allocator
    assert "ctypes" in imported["broker"]
    assert "ctypes.util" not in imported["broker"]  # its find_library ran ``ldconfig -p``
    unused = sorted(name for name in NOT_FOR_A_PLAIN_BROKER if name in imported["broker"])
    assert unused == []


def test_the_proxy_command_still_finds_its_settings() -> None:
    """The proxy's flags are built for ``kafscale proxy`` (the settings model is imported for
    that command only)."""
    from kafscale.broker import cli

    args = cli._parser("proxy").parse_args(["proxy", "--cluster", "c1"])
    assert args.command == "proxy"
    assert getattr(args, "setting:cluster") == "c1"
    broker_only = cli._parser("broker")
    with pytest.raises(SystemExit):  # the proxy's flags are not built for another command
        broker_only.parse_args(["proxy", "--cluster", "c1"])


# ``kafscale drain --help`` through the console script's entry point, counting the cyclic
# garbage collector's runs.
_COLLECTIONS_SCRIPT = """
import contextlib, gc, io, json, sys
runs = []
gc.callbacks.append(lambda phase, info: phase == "start" and runs.append(info["generation"]))
from kafscale import entry
sys.argv = ["kafscale", "drain", "--help"]
with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
    entry.main()
cli = "kafscale.broker.cli" in sys.modules
print(json.dumps({"runs": len(runs), "enabled": gc.isenabled(), "cli": cli}))
"""


def test_the_garbage_collector_waits_while_the_cli_is_imported_and_runs_afterwards() -> None:
    """Importing the CLI made the collector run ~100 times (~60k objects created, ~1k of them
    garbage); paused, only the command's own work may trigger one (argparse: a few). And a
    process that serves must have it running again."""
    done = children.run(
        [sys.executable, "-c", _COLLECTIONS_SCRIPT],
        env=child_env(os.environ),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    seen = json.loads(done.stdout)
    assert seen["cli"]  # the entry point did import the CLI
    assert seen["runs"] < 20, seen
    assert seen["enabled"]
