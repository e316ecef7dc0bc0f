"""Scratch directories outside pytest's temporary tree that name the process they belong to, and
the removal of those whose process is gone.

``running_etcd`` keeps each etcd's data in ``/dev/shm`` (memory: etcd fsyncs less there), and a
fixture removes it at teardown. A run that is SIGKILLed (a CI timeout, ``pkill -9 pytest``, the
OOM killer) runs no teardown: its etcd dies with it (``harness.children``), but the data stayed,
~120 MB of memory per server, hundreds of MB for a session's, until the machine rebooted.

So the directory's name records its owner: the process that made it (pid namespace, pid and the
process's start time, so that a pid used again by another process is not taken for the owner),
``<prefix>of-<pidns>-<pid>-<start>-<random>``. Each time one is made, the directories of that
prefix whose owner is no longer running (gone, or a zombie) are removed first. Only names of this
form are touched (nothing another tool made, nor a directory of an older harness without its
owner in the name), and only those of owners in this process's pid namespace (a pid of another
namespace names another process). Where ``/proc`` cannot tell (not Linux) nothing is removed.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_PROC = Path("/proc")


@dataclass(frozen=True)
class Owner:
    """A process, as a directory's name records it."""

    pid_namespace: int
    pid: int
    start_ticks: int  # /proc/<pid>/stat field 22: when it started, in clock ticks since boot


@dataclass(frozen=True)
class Running:
    """What /proc says of a pid now."""

    state: str  # R, S, D, Z (zombie), X (dead), ...
    start_ticks: int


def owned_prefix(prefix: str, owner: Owner) -> str:
    """The start of the names of the directories ``owner`` makes with ``prefix``."""
    return f"{prefix}of-{owner.pid_namespace}-{owner.pid}-{owner.start_ticks}-"


def owner_of(name: str, prefix: str) -> Owner | None:
    """The owner recorded in a directory's ``name``; None when the name is not one of ours."""
    match = re.fullmatch(re.escape(prefix) + r"of-(\d+)-(\d+)-(\d+)-[^/]+", name)
    if match is None:
        return None
    pid_namespace, pid, start_ticks = (int(group) for group in match.groups())
    return Owner(pid_namespace, pid, start_ticks)


def is_abandoned(owner: Owner, pid_namespace: int, now: Running | None) -> bool:
    """Whether ``owner``'s directory may go: its process is in our pid namespace and is no
    longer running (``now``: what /proc says of its pid; None: no such process). A pid that
    started at another time is another process; a zombie runs nothing any more."""
    if owner.pid_namespace != pid_namespace:
        return False  # its pid names a process we cannot see
    return now is None or now.start_ticks != owner.start_ticks or now.state in ("Z", "X")


def _running(pid: int | str) -> Running | None:
    """What /proc says of ``pid`` (or ``"self"``), None when there is no such process."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text.rsplit(")", 1)[1].split()  # after "pid (comm)": comm may hold spaces
    return Running(state=fields[0], start_ticks=int(fields[19]))


def _pid_namespace() -> int | None:
    """The inode of this process's pid namespace, None where /proc does not tell."""
    try:
        link = os.readlink(_PROC / "self" / "ns" / "pid")  # "pid:[4026531836]"
    except OSError:
        return None
    match = re.fullmatch(r"pid:\[(\d+)\]", link)
    return int(match.group(1)) if match else None


def this_process() -> Owner | None:
    """This process as an owner; None where /proc cannot tell (then nothing is reclaimed)."""
    pid_namespace = _pid_namespace()
    me = _running("self") if pid_namespace is not None else None
    if pid_namespace is None or me is None:
        return None
    return Owner(pid_namespace, os.getpid(), me.start_ticks)


def reclaim(base: Path, prefix: str) -> list[Path]:
    """Remove the directories under ``base`` named with ``prefix`` whose owner is gone; return
    them."""
    me = this_process()
    if me is None:
        return []
    removed = []
    for entry in base.glob(f"{glob.escape(prefix)}of-*"):
        owner = owner_of(entry.name, prefix)
        if owner is None or not entry.is_dir() or entry.is_symlink():
            continue
        if is_abandoned(owner, me.pid_namespace, _running(owner.pid)):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def make_owned_dir(prefix: str, base: Path | None = None) -> Path:
    """A new directory under ``base`` (the system's temporary directory when None) whose name
    records this process, made after removing the abandoned ones of ``prefix`` there. The
    caller removes it."""
    parent = Path(base if base is not None else tempfile.gettempdir())
    me = this_process()
    if me is not None:
        reclaim(parent, prefix)
    name_prefix = owned_prefix(prefix, me) if me is not None else prefix
    return Path(tempfile.mkdtemp(prefix=name_prefix, dir=parent))


@contextmanager
def owned_scratch_dir(prefix: str, base: Path | None = None) -> Iterator[Path]:
    """``make_owned_dir``, removed on exit."""
    path = make_owned_dir(prefix, base)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
