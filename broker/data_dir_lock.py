"""One ``kafscale local`` per data directory.

A second ``kafscale local`` on a directory a running one uses (``make local`` typed again in
another terminal) used to take the running cluster's etcd for one left over from a dead run
and stop it, then fail on the taken port: the first cluster lost its etcd and stayed broken.
So a run holds an exclusive ``flock`` on ``<data-dir>/local.lock`` for as long as it lives,
and a second is refused before it touches anything. The kernel drops the lock when its holder
dies, however it dies (``kill -9`` included), so an etcd left behind by a dead run is still
found and stopped as before (``EmbeddedEtcd.stop_stale``). The holder's pid is written into
the file for the refusal's message only; the lock, not the pid, decides.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from kafscale.broker.startup_error import StartupError

LOCK_FILE = "local.lock"


def in_use_message(data_dir: Path, holder: str) -> str:
    """The one line a refused start prints (``holder``: the running one's pid, or "")."""
    who = f"another kafscale local (pid {holder})" if holder else "another kafscale local"
    return (
        f"{who} is running on data directory {data_dir}: stop it first (Ctrl-C in its "
        f"terminal), or give this one another --data-dir"
    )


@contextlib.contextmanager
def data_dir_claimed(data_dir: Path) -> Iterator[None]:
    """Hold ``data_dir`` for this process while the block runs; ``StartupError`` at once if
    another process holds it. The descriptor is not inherited (Python's default), so the
    etcd and brokers started meanwhile never keep the lock past this process."""
    path = data_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StartupError(f"cannot use data directory {data_dir}: {exc}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            raise StartupError(in_use_message(data_dir, holder)) from None
        except OSError as exc:  # a file system without locks
            raise StartupError(f"cannot lock data directory {data_dir}: {exc}") from exc
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
