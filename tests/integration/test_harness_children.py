"""Broker and proxy processes the harness starts run without Hypothesis (``harness.children``):
kio imports it whenever it can, at ~0.1 s of CPU per child, and the suite starts hundreds. So do
those a bench started by hand starts (``bench/_cluster.py``, through the same
``kafscale.broker.child_process``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness.brokers import BrokerCluster
from harness.children import NO_HYPOTHESIS, child_env
from harness.proxy import start_proxy

pytestmark = pytest.mark.integration

PROFILE_IMPORTS = {"PYTHONPROFILEIMPORTTIME": "1"}  # each import, one line on stderr (the log)


def imported(log: Path) -> set[str]:
    """The modules a child imported (or tried to), from its ``-X importtime`` lines."""
    lines = log.read_text(errors="replace").splitlines()
    return {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")}


def hypothesis_modules(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] == "hypothesis"}


def test_harness_started_brokers_and_proxies_do_not_import_hypothesis(
    broker_cluster: BrokerCluster,
) -> None:
    broker = broker_cluster.start(**PROFILE_IMPORTS)
    proxy = start_proxy(broker_cluster, **PROFILE_IMPORTS)
    for child in (broker, proxy):
        modules = imported(child.log_path)
        assert "kio" in modules and "kafscale.broker.protocol.codec" in modules
        # kio's attempt fails at the stand-in: nothing of the real package is loaded
        assert hypothesis_modules(modules) <= {"hypothesis", "hypothesis.strategies"}


def test_the_stand_in_goes_first_and_keeps_the_given_path() -> None:
    env = child_env({"PYTHONPATH": "/somewhere", "OTHER": "x"})
    assert env["PYTHONPATH"] == os.pathsep.join([str(NO_HYPOTHESIS), "/somewhere"])
    assert env["OTHER"] == "x"
    assert child_env({})["PYTHONPATH"] == str(NO_HYPOTHESIS)


# A script the tests run (bench/chaos.py) that starts brokers itself, the way bench/_cluster.py
# does: their environment is the script's own, minus its KAFSCALE_* settings.
SCRIPT_AND_CHILD = """
import os, subprocess, sys
import kafscale.broker.protocol.codec

role = sys.argv[1]
print(role, sorted(m for m in sys.modules if m.split(".")[0] == "hypothesis"), flush=True)
if role == "script":
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
    subprocess.run([sys.executable, __file__, "child"], env=env, check=True)
"""


def test_a_script_run_with_the_child_env_and_the_brokers_it_starts_go_without_hypothesis(
    tmp_path: Path,
) -> None:
    """How test_chaos runs bench/chaos.py (and test_etcd_failover, test_ownership and
    test_proxy_local their ``kafscale`` commands): kio goes without Hypothesis in the script
    and in what it starts, while the same script run with the test's own environment loads it
    in both."""
    script = tmp_path / "script.py"
    script.write_text(SCRIPT_AND_CHILD)
    command = [sys.executable, str(script), "script"]
    plain = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    lines = plain.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["script", "child"], plain.stdout
    assert all("'hypothesis'" in line for line in lines), plain.stdout
    routed = subprocess.run(
        command, env=child_env(os.environ), capture_output=True, text=True, timeout=120, check=True
    )
    assert routed.stdout.splitlines() == ["script []", "child []"], routed.stdout


# A bench run by hand, from a shell whose environment knows nothing of the stand-in: its stack
# starts a broker whose log records each import (``-X importtime``).
BENCH_STACK = """
import json, sys
sys.path.insert(0, sys.argv[1])
from _cluster import Stack
with Stack(broker_env={"PYTHONPROFILEIMPORTTIME": "1"}) as stack:
    broker = stack.start_broker()
    lines = broker.log_path.read_text(errors="replace").splitlines()
    print(json.dumps([l.rsplit("|", 1)[1].strip() for l in lines if l.startswith("import time:")]))
"""


def test_the_brokers_a_bench_starts_do_not_import_hypothesis() -> None:
    bench = Path(__file__).resolve().parents[2] / "bench"
    plain = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ran = subprocess.run(
        [sys.executable, "-c", BENCH_STACK, str(bench)],
        env=plain,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    modules = set(json.loads(ran.stdout.strip().splitlines()[-1]))
    assert "kio" in modules and "kafscale.broker.protocol.codec" in modules
    assert hypothesis_modules(modules) <= {"hypothesis", "hypothesis.strategies"}


def test_the_stand_in_is_put_first_once() -> None:
    once = child_env({"PYTHONPATH": "/somewhere"})
    assert child_env(once) == once
