"""The preStop drain hook, run as the pod runs it, against a real broker process."""

from __future__ import annotations

import sys

import pytest
from harness import children
from harness.brokers import BrokerCluster

from kafscale.operator import manifest_brokers

pytestmark = pytest.mark.integration

HEAVY = ("kafscale.broker.app", "aetcd", "boto3", "kio", "uvloop")


def test_the_hook_drains_the_broker_and_imports_nothing_heavy(
    broker_cluster: BrokerCluster,
) -> None:
    broker = broker_cluster.start()
    command = manifest_brokers.drain_command(30)
    assert command[:3] == ["python", "-m", "kafscale.broker.drain_hook"]
    args = [*command[3:]]
    args[args.index("--admin-url") + 1] = broker.admin_url
    probe = (
        "import sys, runpy\n"
        f"sys.argv = ['drain_hook', *{args!r}]\n"
        "try:\n"
        "    runpy.run_module('kafscale.broker.drain_hook', run_name='__main__')\n"
        "except SystemExit as exit:\n"
        "    code = exit.code\n"
        f"print('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
        "sys.exit(code)\n"
    )
    result = children.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stdout, result.stdout
    status = broker.status()
    assert status["draining"] and status["owned"] == []
