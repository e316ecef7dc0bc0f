"""Broker and proxy processes the harness starts run without Hypothesis (``harness.children``):
kio imports it whenever it can, at ~0.1 s of CPU per child, and the suite starts hundreds. So do
those a bench started by hand starts (``bench/_cluster.py``, through the same
``kafscale.broker.child_process``). And every child the harness starts dies with the pytest
process that started it, even when that process is SIGKILLed and runs no teardown."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from harness import children
from harness.brokers import BrokerCluster
from harness.children import NO_HYPOTHESIS, child_env
from harness.etcd import running_etcd
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
    plain = children.run(command, capture_output=True, text=True, timeout=120, check=True)
    lines = plain.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["script", "child"], plain.stdout
    assert all("'hypothesis'" in line for line in lines), plain.stdout
    routed = children.run(
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
    ran = children.run(
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


# --- children die with the test process -------------------------------------------------------

TESTS = Path(__file__).resolve().parents[1]

# A stand-in for a pytest process: it starts children through the harness, prints "ready" and
# sleeps until the test SIGKILLs it, the way a CI timeout or ``pkill -9 pytest`` ends a run.
PARENT_PROLOGUE = f"""
import sys, threading, time
from pathlib import Path
sys.path.insert(0, {str(TESTS)!r})
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
"""
PARENT_EPILOGUE = """
    print("ready", flush=True)
    time.sleep(600)
"""

THROUGH_THE_HARNESS = """
import tempfile
from harness import children
from harness.etcd import running_etcd
from harness.tls_etcd import start_etcd_process

children.spawn(SLEEPER)
# from a thread that ends at once (asyncio.to_thread, a pool's worker): the child must outlive
# the thread, which is the "parent" PR_SET_PDEATHSIG knows, and still die with the process
worker = threading.Thread(target=children.spawn, args=(SLEEPER,))
worker.start()
worker.join()
threading.Thread(target=children.run, args=(SLEEPER,), daemon=True).start()
start_etcd_process(Path(tempfile.mkdtemp()))
with running_etcd():
"""

KUBE_CONTROL_PLANE = """
from harness.kube_apiserver import running_kube_cluster
with running_kube_cluster():
"""


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of ``pid``, or None when there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text.rsplit(")", 1)[1].split()  # after "pid (comm)", which may hold spaces
    return fields[0], int(fields[1])


def _running(pid: int) -> bool:
    """A zombie is gone too: it runs nothing, and only waits for its new parent to reap it."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def _children_of(parent: int) -> dict[int, list[str]]:
    """The running children of ``parent``: pid -> command line."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) and stat[1] == parent:
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().decode().split("\0")
                if _running(int(entry.name)):
                    found[int(entry.name)] = argv
    return found


def _remove_etcd_data(commands: Iterable[list[str]], tmp_path: Path) -> None:
    """Remove the data of the etcd servers among ``commands`` (~120 MB each; those of
    ``running_etcd`` in /dev/shm, in memory), which the killed stand-in could not."""
    for argv in commands:
        for arg in argv:
            if not arg.startswith("--data-dir="):
                continue
            data = Path(arg.removeprefix("--data-dir="))
            if data.parent.name.startswith("kafscale-etcd-"):  # running_etcd's scratch
                shutil.rmtree(data.parent, ignore_errors=True)
            elif data.is_relative_to(tmp_path):
                shutil.rmtree(data, ignore_errors=True)


def _kill_parent_and_wait(body: str, expected: list[str], timeout_s: float, tmp_path: Path) -> None:
    """Run ``body`` in a stand-in for pytest; once it is ready, SIGKILL it: every child it
    started must be gone well within ``timeout_s``. Its temporary files go under
    ``tmp_path``."""
    script = PARENT_PROLOGUE + body + PARENT_EPILOGUE
    parent = children.spawn(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env({**os.environ, "TMPDIR": str(tmp_path)}),
    )
    left: dict[int, list[str]] = {}
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline().strip() == "ready", f"exited {parent.wait()}"
        left = _children_of(parent.pid)
        names = {pid: Path(argv[0]).name for pid, argv in left.items()}
        assert sorted(names.values()) == sorted(expected), names
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + timeout_s
        while any(_running(pid) for pid in left) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = {pid: name for pid, name in names.items() if _running(pid)}
        assert not survivors, f"still running after their parent was killed: {survivors}"
    finally:
        parent.kill()
        parent.wait()
        for pid in left:  # on failure, do not leave them behind for the rest of the run
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _remove_etcd_data(left.values(), tmp_path)


def test_what_the_harness_starts_dies_with_a_killed_test_run(tmp_path: Path) -> None:
    """etcd (the fixtures' and ``tls_etcd``'s), and any child started through
    ``harness.children`` from the main thread, from a thread that has ended, or by ``run``:
    none survives a SIGKILLed pytest."""
    python = Path(sys.executable).name
    expected = [python, python, python, "etcd", "etcd"]
    _kill_parent_and_wait(THROUGH_THE_HARNESS, expected, timeout_s=60, tmp_path=tmp_path)


# Four threads writing to stdout as fast as they can: work that shows while it goes on.
BUSY_WRITERS = """
import os, threading
def write():
    while True:
        os.write(1, b"x")
threads = [threading.Thread(target=write) for _ in range(4)]
for t in threads:
    t.start()
"""


def test_a_frozen_process_does_nothing_more_once_freeze_returns() -> None:
    """``children.freeze`` returns only when every thread of the process has stopped: nothing
    it writes arrives after. ``os.kill(pid, SIGSTOP)`` alone returns before; on a loaded
    machine an etcd "paused" that way answered a broker's read (docs/testing.md)."""
    busy = children.spawn([sys.executable, "-c", BUSY_WRITERS], stdout=subprocess.PIPE)
    try:
        assert busy.stdout is not None
        out = busy.stdout.fileno()
        os.set_blocking(out, False)
        assert _read_some(out), "the writers did not start"
        children.freeze(busy.pid)
        _drain(out)  # what it wrote before it stopped
        assert set(children.thread_states(busy.pid)) <= {"T", "t"}
        time.sleep(0.2)  # time for a thread still running to write again
        assert _drain(out) == 0
    finally:
        busy.kill()
        busy.wait()


def _read_some(fd: int, timeout_s: float = 30.0) -> bool:
    """Whether ``fd`` gives bytes within ``timeout_s`` (the writers have started)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(BlockingIOError):
            if os.read(fd, 1 << 16):
                return True
        time.sleep(0.01)
    return False


def _drain(fd: int) -> int:
    """Read what the pipe holds without waiting; the number of bytes."""
    total = 0
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return total
        if not chunk:
            return total
        total += len(chunk)


@pytest.mark.kubeapi
def test_the_kube_control_plane_dies_with_a_killed_test_run(tmp_path: Path) -> None:
    """The session's kube-apiserver, controller manager and their etcd do not outlive a
    SIGKILLed pytest (they used to run on, ~500 MB, re-parented to init)."""
    expected = ["etcd", "kube-apiserver", "kube-controller-manager"]
    _kill_parent_and_wait(KUBE_CONTROL_PLANE, expected, timeout_s=60, tmp_path=tmp_path)


# --- the etcd data a killed run leaves behind goes with the next run --------------------------

# A stand-in for a run holding a ``running_etcd`` (the fixtures'): it prints the server's
# scratch directory (in /dev/shm, ~120 MB of memory with a session's data) and sleeps.
HOLDS_AN_ETCD = (
    PARENT_PROLOGUE
    + """
from harness.etcd import running_etcd
with running_etcd() as server:
    (server.data_dir / "written").write_bytes(b"x" * 1_000_000)
    print(server.data_dir, flush=True)
    time.sleep(600)
"""
)


def _wait_gone(pids: Iterable[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if _running(pid)], "a killed run's etcd still runs"


def test_the_etcd_data_of_a_killed_run_is_removed_by_the_next_run() -> None:
    """Three runs hold an etcd each; two are SIGKILLed (one reaped, one still a zombie, as
    before its parent waits for it): their etcd dies with them, and a run starting an etcd
    after that removes their data directories, not the live run's, nor a directory whose owner
    it cannot know (an older harness's)."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm: running_etcd keeps its data in the temporary directory")
    runs = [
        children.spawn(
            [sys.executable, "-c", HOLDS_AN_ETCD],
            stdout=subprocess.PIPE,
            text=True,
            env=child_env(os.environ),
        )
        for _ in range(3)
    ]
    unknown_owner = Path(tempfile.mkdtemp(prefix="kafscale-etcd-", dir=shm))
    dirs: list[Path] = []
    try:
        for run in runs:
            assert run.stdout is not None
            dirs.append(Path(run.stdout.readline().strip()))
        for path in dirs:
            assert path.name.startswith("kafscale-etcd-of-"), path
            assert (path / "etcd").is_dir(), f"no etcd data in {path}"
        reaped, zombie, alive = runs
        etcds = [pid for run in (reaped, zombie) for pid in _children_of(run.pid)]
        assert len(etcds) == 2, etcds
        reaped.kill()
        reaped.wait()
        zombie.kill()
        deadline = time.monotonic() + 60
        while (_stat(zombie.pid) or ("?",))[0] != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (_stat(zombie.pid) or ("?",))[0] == "Z"
        _wait_gone(etcds, timeout_s=60)

        with running_etcd():  # the next run
            assert not dirs[0].exists() and not dirs[1].exists(), "a killed run's data stayed"
            assert (dirs[2] / "etcd").is_dir() and (dirs[2] / "written").is_file()
            assert unknown_owner.is_dir()
        assert alive.poll() is None
    finally:
        for run in runs:
            run.kill()
            run.wait()
        for path in [*dirs, unknown_owner]:
            shutil.rmtree(path, ignore_errors=True)


# --- a killed kube build stops its go build ---------------------------------------------------

BUILD_KUBE = TESTS / "harness" / "build_kube.sh"

# tests/harness/build_kube.sh's own functions (sourced, it runs nothing), around a stand-in for
# `go build`: a program that forks a compiler, the way go build runs compile and link, and waits
# (the real build takes minutes). Each writes its pid into the step's directory.
BUILD_STEP = """
set -euo pipefail
source "$1"
trap_signals
bound_in "$2" bash -c 'sleep 600 & echo "$!" > compiler; echo "$$" > go; wait'
"""


def _pid_in(path: Path, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while not (path.is_file() and path.read_text().endswith("\n")):
        assert time.monotonic() < deadline, f"{path.name} never started"
        time.sleep(0.1)
    return int(path.read_text())


@pytest.mark.parametrize(
    "sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda sig: sig.name
)
def test_a_killed_kube_build_stops_its_go_build(tmp_path: Path, sig: signal.Signals) -> None:
    """However the build script ends (SIGKILL: pytest died, and its children with it; SIGTERM;
    Ctrl-C), its go build and the compiler that go build started end too. Under bash a killed
    script's foreground child used to run on, re-parented to init, for minutes."""
    script = tmp_path / "build_step.sh"
    script.write_text(BUILD_STEP)
    # SIGINT as at a terminal: a process started in the background of a non-interactive shell
    # (a CI step, nohup ... &) inherits it ignored, and bash cannot trap what it started ignoring
    default_int = ["env", "--default-signal=INT"]
    build = children.spawn([*default_int, "bash", str(script), str(BUILD_KUBE), str(tmp_path)])
    pids: list[int] = []
    try:
        pids = [_pid_in(tmp_path / name, timeout_s=60) for name in ("go", "compiler")]
        assert all(_running(pid) for pid in pids)
        build.send_signal(sig)
        build.wait(60)
        deadline = time.monotonic() + 60
        while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in pids if _running(pid)], "the build's children still run"
    finally:
        build.kill()
        build.wait()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_kube_build_removes_the_tree_a_killed_build_left(tmp_path: Path) -> None:
    """A SIGKILLed build runs no trap and leaves its tree and Go cache (~2 GB); the next run of
    the script (here with the binaries cached, so it builds nothing) removes it."""
    text = BUILD_KUBE.read_text()
    version = re.search(r"^DEB_SOURCE_VERSION=(\S+)", text, re.MULTILINE)
    recipe = re.search(r"^RECIPE=(\d+)", text, re.MULTILINE)
    assert version and recipe
    key = tmp_path / f"{version.group(1)}-r{recipe.group(1)}"
    (key / "bin").mkdir(parents=True)
    for name in ("kube-apiserver", "kube-controller-manager", "kubectl"):
        (key / "bin" / name).write_text("#!/bin/sh\n")
        (key / "bin" / name).chmod(0o755)
    left = [key / "build.4242" / "gopath", tmp_path / "older-r2" / "build.17"]
    for path in left:
        path.mkdir(parents=True)
    env = {**os.environ, "KAFSCALE_KUBE_CACHE": str(tmp_path)}
    check = children.run(["bash", str(BUILD_KUBE), "--check"], env=env, timeout=60)
    assert check.returncode == 0, "the fake binaries are not where the script looks"
    done = children.run(
        ["bash", str(BUILD_KUBE)], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == str(key / "bin")
    assert not (key / "build.4242").exists() and not left[1].exists(), done.stderr
    assert (key / "bin" / "kubectl").is_file()
