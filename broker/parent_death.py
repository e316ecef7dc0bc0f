"""Child processes that die with the process that started them, however it dies.

A process killed with SIGKILL (``kill -9``, the OOM killer, a CI job's timeout, ``pkill pytest``)
runs no clean-up: its children are re-parented to init and run on, holding ports, memory and
data directories. ``kafscale local`` must not leave its etcd behind that way, nor may the test
harness leave its brokers, etcd, kube-apiserver or radosgw (nor a bench its brokers).

Linux's ``PR_SET_PDEATHSIG`` asks the kernel to send a signal to a process when its parent dies:
SIGKILL by default, or one the program handles by stopping cleanly (etcd gets SIGTERM: the
bundled etcd 3.5.1, SIGKILLed, can lose writes it has already answered, etcd-io/etcd#13766 and
#14370; see ``metadata/embedded_etcd.py``). ``die_with_parent`` sets it in the child between
fork and exec, so it holds for the program exec'd (unless that program is set-user-ID, or
changes its user id itself: a child meant to run as another user is started with
``Popen(user=...)``, which switches before the hook runs). Two limits, both handled or left
to the caller:

* The "parent" is the *thread* that forked: the signal comes when that thread exits, even if
  the process lives on. ``start_bound`` therefore forks from the main thread, or else from one
  long-lived thread of its own, never from a pool's worker that may exit before the child
  should.
* It is not inherited by the child's own children: a wrapper that forks the real program
  (``runuser``, ``su``, a shell running it without ``exec``) would die alone. Start the real
  program directly.

Elsewhere (not Linux) processes start as they would without it.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_PR_SET_PDEATHSIG = 1

_prctl: Callable[..., int] | None = None
if sys.platform.startswith("linux"):
    # Looked up once here: the hook runs in a forked child of a threaded process, where it
    # should do as little as possible (no dlopen, no imports).
    _prctl = ctypes.CDLL(None, use_errno=True).prctl

_forker: ThreadPoolExecutor | None = None
_forker_lock = threading.Lock()


def die_with_parent(parent_pid: int, signum: signal.Signals = signal.SIGKILL) -> None:
    """Runs in the child before exec: ``signum`` from the kernel when the forking thread ends.

    ``parent_pid`` is the starting process's id: if it died between the fork and this call the
    kernel would never send the signal (the child has a new parent already), so the child sends
    it to itself instead.
    """
    if _prctl is None:
        return
    _prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signum)


def _hook(preexec_fn: Callable[[], Any] | None, signum: signal.Signals) -> Callable[[], None]:
    """``die_with_parent`` for this process, after the caller's own ``preexec_fn`` if any."""
    parent_pid = os.getpid()

    def hook() -> None:
        if preexec_fn is not None:
            preexec_fn()
        die_with_parent(parent_pid, signum)

    return hook


def setpriv_signal_name(signum: signal.Signals) -> str:
    """The name ``setpriv --pdeathsig`` takes for ``signum``: ``KILL`` for SIGKILL."""
    return signum.name.removeprefix("SIG")


@functools.cache
def _setpriv() -> str | None:
    """util-linux's ``setpriv`` (Linux only), if installed."""
    return shutil.which("setpriv") if _prctl is not None else None


def _lasting_thread() -> ThreadPoolExecutor:
    """One worker thread that forks for callers off the main thread; it lives as long as the
    process (a ``ThreadPoolExecutor`` worker never exits before interpreter shutdown)."""
    global _forker
    with _forker_lock:
        if _forker is None:
            _forker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bound-children")
        return _forker


def _findable(args: Sequence[str], popen_kwargs: dict[str, Any]) -> bool:
    """Whether ``args[0]`` names a program ``Popen`` would find (in the child's ``PATH``, or
    relative to its ``cwd``). One it would not is started without ``setpriv``, so that ``Popen``
    raises ``FileNotFoundError`` as usual instead of ``setpriv`` exiting 127."""
    if isinstance(args, str | bytes) or not args:
        return False  # a command line for a shell, or nothing: Popen's own handling
    program = os.fspath(args[0])
    env = popen_kwargs.get("env")
    cwd = popen_kwargs.get("cwd")
    if os.sep in program and cwd is not None:
        program = os.path.join(os.fspath(cwd), program)
    path = (env if env is not None else os.environ).get("PATH", os.defpath)
    return shutil.which(program, path=path) is not None


def start_bound(
    args: Sequence[str],
    *,
    parent_death_signal: signal.Signals = signal.SIGKILL,
    **popen_kwargs: Any,
) -> subprocess.Popen[Any]:
    """``subprocess.Popen(args, **popen_kwargs)`` whose child gets ``parent_death_signal``
    (SIGKILL unless told) when this process dies; a ``preexec_fn`` given still runs (first).
    A signal other than SIGKILL is for a program that exits on it by itself (etcd on SIGTERM);
    one that may not must be stopped by whoever starts it next (``EmbeddedEtcd.stop_stale``).
    Forked from the main thread or from one long-lived thread, so a short-lived calling thread
    cannot take the child with it.

    Without a ``preexec_fn`` of the caller's, the program is started through util-linux's
    ``setpriv --pdeathsig <signal>`` (which sets the signal and execs it, same pid) rather than a
    hook: any ``preexec_fn`` makes ``subprocess`` fork the slow way and run every at-fork
    handler registered in Python, gRPC's included, in the child; with an etcd client's channel
    open in this process such a child has died before its exec (etcd "exited", gRPC's
    ``epoll_wait error: Bad file descriptor`` in its log; 1 run in 18 of a test restarting
    etcd). The one thing setpriv does not do is end a child whose parent died between the fork
    and the signal being set: a window of microseconds."""
    preexec_fn = popen_kwargs.pop("preexec_fn", None)
    setpriv = _setpriv()
    hook: Callable[[], None] | None = None
    command = args
    if setpriv is not None and preexec_fn is None and _findable(args, popen_kwargs):
        command = [setpriv, "--pdeathsig", setpriv_signal_name(parent_death_signal), "--", *args]
    else:
        hook = _hook(preexec_fn, parent_death_signal)

    def start() -> subprocess.Popen[Any]:
        process = subprocess.Popen(command, preexec_fn=hook, **popen_kwargs)
        process.args = args  # what the caller started (its errors and repr name it), not setpriv
        return process

    if threading.current_thread() is threading.main_thread():
        return start()
    return _lasting_thread().submit(start).result()
