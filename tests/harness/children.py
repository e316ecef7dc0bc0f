"""The processes the harness starts: how they are started and what they inherit from the test
process.

Every child dies with the pytest process that started it. A run killed with SIGKILL (``pkill
pytest``, a CI timeout, the OOM killer) runs no teardown, and its children used to run on,
re-parented to init: kube-apiservers and controller managers, etcd, radosgw, brokers, Kafka
Connect workers, each holding memory and ports on a shared machine. ``spawn`` (a
``subprocess.Popen``) and ``run`` (a ``subprocess.run``) start a child the kernel kills when
this process dies (``kafscale.broker.parent_death``: Linux's ``PR_SET_PDEATHSIG``, forked from
a thread that lives as long as the process); every spawner in the harness uses them, and so do
``BrokerProcess`` (brokers, proxies) and ``EmbeddedEtcd`` started with ``die_with_parent``.
The signal reaches the program started, not what it forks: start the real program, not a
wrapper that forks it (``runuser``: use ``Popen(user=...)``).

Hypothesis is installed in the dev venv for the property tests; kio imports it when present and
registers a strategy for each of its types, which cost every child process ~0.1 s of CPU (a suite
run starts several hundred). The children get a ``PYTHONPATH`` entry first whose ``hypothesis``
package refuses to import, so they start as they would from a production install. Every
``BrokerProcess`` (brokers, proxies) gets it on its own; other children (the CLI, ``kafscale
local``, scripts) get it from ``child_env``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# One implementation for the harness and the benches (``bench/`` never imports from tests/);
# the stand-in package itself lives here, beside this module.
# Not from ``child_process``, which imports the admin client and its metrics: this module must
# stay cheap to import (harness.spark imports it through harness.java_client).
from kafscale.broker.child_environment import NO_HYPOTHESIS as NO_HYPOTHESIS
from kafscale.broker.child_environment import child_env as child_env
from kafscale.broker.parent_death import start_bound

spawn = start_bound
"""``subprocess.Popen`` for the harness: the child dies with this process."""


def run(
    args: Sequence[str],
    *,
    input: Any = None,
    capture_output: bool = False,
    timeout: float | None = None,
    check: bool = False,
    **popen_kwargs: Any,
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` for the harness (same arguments, same result and errors): the child
    dies with this process, so a killed run leaves no helm, kubectl or kcat waiting out its own
    timeout."""
    if capture_output:
        popen_kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if input is not None:
        popen_kwargs["stdin"] = subprocess.PIPE
    with spawn(args, **popen_kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            process.kill()
            exc.stdout, exc.stderr = process.communicate()  # what it wrote, as run() gives
            raise
        except BaseException:
            process.kill()  # the test interrupted: do not leave it running (exit waits)
            raise
    code = process.returncode
    if check and code:
        raise subprocess.CalledProcessError(code, process.args, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(process.args, code, stdout, stderr)


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


def freeze(pid: int, timeout_s: float = 30.0) -> None:
    """SIGSTOP ``pid`` and return once every one of its threads has stopped.

    ``kill`` only queues the signal: each thread stops when it next runs, which on a loaded
    machine can be a second later, and meanwhile it goes on answering (an etcd "paused" this
    way served a broker's read after ``kill`` returned, and a test expecting a timeout got
    data). Resume with SIGCONT as usual."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while not all(state in ("T", "t") for state in thread_states(pid)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"pid {pid} not stopped {timeout_s:g} s after SIGSTOP")
        time.sleep(0.01)


def thread_states(pid: int) -> list[str]:
    """Each thread's state letter (``/proc/<pid>/task/<tid>/stat``: R, S, D, T, ...), skipping
    threads that end while being read."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        states.append(stat.rsplit(")", 1)[1].split()[0])
    return states
