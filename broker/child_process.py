"""A ``kafscale broker`` child process, driven from outside: started, probed, signalled, stopped.

The test harness and the benches start real broker processes the way a supervisor would
(configured through environment variables, as the Kubernetes manifests configure them) and need
the same few things from each: wait for ``/readyz``, read ``/status``, send signals (SIGSTOP to
play a hung broker, SIGTERM for the graceful handoff, SIGKILL for a crash) and show the log's
tail when something goes wrong. One class serves both, so a fix to start-up detection or
clean-up reaches tests and benches alike; so do the free ports a child is given to listen on
(``free_ports.free_port_run``, importable from here too), and so does the environment a child
starts with (``child_env``, from ``child_environment``, importable from here too): without
Hypothesis, which kio would otherwise import. A child dies with the process that started it
(``parent_death``, unless ``die_with_parent=False``): a test run or a bench killed with SIGKILL
leaves no broker behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafscale.broker.admin_http import admin_request
from kafscale.broker.child_environment import NO_HYPOTHESIS as NO_HYPOTHESIS
from kafscale.broker.child_environment import child_env as child_env
from kafscale.broker.free_ports import free_port_run as free_port_run  # its first home
from kafscale.broker.parent_death import start_bound
from kafscale.broker.start_progress import Sample, StartProgress

KAFSCALE = str(Path(sys.executable).with_name("kafscale"))
_STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGKILL, signal.SIGINT)
_CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass
class BrokerProcess:
    env: dict[str, str]
    log_path: Path
    port: int
    admin_port: int
    command: list[str] = field(default_factory=lambda: [KAFSCALE, "broker"])
    process: subprocess.Popen[bytes] | None = None
    node_id: int = -1
    stopping: bool = False  # sent SIGTERM or SIGKILL: no longer counted as a cluster member
    admin_token: str | None = None  # sent to the admin port when the broker requires one
    die_with_parent: bool = True  # SIGKILL from the kernel when the starting process dies

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout_s: float = 30.0, max_s: float = 600.0) -> BrokerProcess:
        """Launch and wait until ready (the log goes to ``log_path``); raises with the log's
        tail if the process exits, or makes no progress for ``timeout_s`` (no CPU used, no
        log written: ``start_progress``), or is not ready after ``max_s`` in all."""
        start = start_bound if self.die_with_parent else subprocess.Popen
        with self.log_path.open("ab") as log:
            self.process = start(
                self.command, env=child_env(self.env), stdout=log, stderr=subprocess.STDOUT
            )
        self.stopping = False
        self.wait_ready(timeout_s, max_s)
        self.node_id = int(self.status()["node_id"])
        return self

    def wait_ready(self, timeout_s: float, max_s: float = 600.0) -> None:
        """Poll ``/readyz`` while the process lives and makes progress (see ``start``): a
        loaded machine slows a start down without failing it; a stuck one fails in
        ``timeout_s``."""
        assert self.process is not None
        progress = StartProgress(time.monotonic(), timeout_s, max_s, log_bytes=self._log_bytes())
        last_answer = "none yet"
        while (verdict := progress.verdict(time.monotonic())) is None:
            if self.process.poll() is not None:
                raise RuntimeError(f"broker exited with {self.process.returncode}:\n{self.tail()}")
            try:
                status, body = self.http("GET", "/readyz", timeout_s=1)
                if status == 200:
                    return
                last_answer = f"{status} {body}"
            except OSError as exc:
                last_answer = f"no answer ({exc})"
            time.sleep(0.05)
            progress.observe(Sample(time.monotonic(), cpu_seconds(self.pid), self._log_bytes()))
        raise TimeoutError(
            f"broker {verdict}; {progress.summary()}; last /readyz: {last_answer}; "
            f"log {self.log_path}:\n{self.tail()}"
        )

    def _log_bytes(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def http(self, method: str, path: str, timeout_s: float = 10) -> tuple[int, Any]:
        return admin_request(self.admin_url, method, path, timeout_s, self.admin_token)

    def status(self) -> dict[str, Any]:
        return dict(self.http("GET", "/status")[1])

    def owned(self) -> list[str]:
        return list(self.status()["owned"])

    def signal(self, signum: int) -> None:
        assert self.process is not None
        if signum in _STOPPING_SIGNALS:
            self.stopping = True
        self.process.send_signal(signum)

    def wait(self, timeout_s: float = 30.0) -> int:
        assert self.process is not None
        return self.process.wait(timeout_s)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait: the graceful handoff path. Returns the exit code."""
        if self.alive:
            self.signal(signal.SIGTERM)
        return self.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL (after SIGCONT, in case it was stopped) and reap; nothing if not running."""
        if self.alive:
            assert self.process is not None
            self.stopping = True
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(10)

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process ``pid`` (all its threads), from ``/proc/<pid>/stat``;
    None where that cannot be read (not Linux, or the process is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces
    try:  # fields 14 and 15 of proc(5); the text after ")" starts at field 3
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS_PER_S
    except (IndexError, ValueError):
        return None
