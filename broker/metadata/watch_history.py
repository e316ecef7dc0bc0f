"""Whether etcd still holds the history a watch followed, checked each time the watch is created.

A watch resumes after an etcd restart from the last revision it delivered + 1. That is right
only while etcd's history is the one the watch followed. It is not after a restore from a backup
or snapshot (an operator's ordinary recovery), nor after the bundled etcd 3.5.1 skipped WAL
entries when restarted after a SIGKILL (etcd-io/etcd#13766): etcd then comes back at a lower
revision and gives the revisions after it to new writes. A watch resumed at last + 1 waited
silently until the new writes reached that revision and went on from there: every write in
between was never delivered, and a view kept stale keys (a proxy kept routing to a broker that
had deregistered).

So, before each (re-)creation, the adapter reads etcd's cluster id, its current revision and,
when the watch has delivered a write, that key as it was at the write's revision
(``Etcd.history_probe``), and ``history_lost`` decides from what it knew (``WatchMark``). Any
of three signs means the history is gone and the watch says RESYNC (reload) instead:

* the cluster id changed: a different etcd (a snapshot restored with a new cluster token, an
  endpoint pointed elsewhere). A restore with the same member name, peer URL and token, or a
  copied data directory, keeps the id, so this alone is not enough;
* the current revision is lower than the last one the watch saw: history went back;
* the last write the watch delivered is not at its revision any more (a different value there,
  or no key where a put was, or a key where a delete was): history went back and new writes
  have since passed the old revision (writers outpaced the watch's reconnect backoff).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafscale.broker.metadata.etcd_txn import KeyValue


@dataclass(frozen=True, slots=True)
class LastWrite:
    """The last change a watch delivered: a put of ``value`` (``deleted`` False) or a delete."""

    key: str
    mod_revision: int
    value: bytes
    deleted: bool


@dataclass(frozen=True, slots=True)
class WatchMark:
    """What a watch knows of the history it follows."""

    seen_revision: int
    """Every change up to this revision was delivered (or was in the caller's read)."""
    cluster_id: int | None = None
    """etcd's cluster id when the watch was last created; None before the first creation."""
    last_write: LastWrite | None = None


@dataclass(frozen=True, slots=True)
class HistoryProbe:
    """What etcd says now (``Etcd.history_probe``)."""

    cluster_id: int
    current_revision: int
    checked: bool = False
    """Whether ``at_last_write`` was read: False when there is no last write, its revision is
    beyond the current one or was compacted away (then nothing can be told from it)."""
    at_last_write: KeyValue | None = None
    """The last write's key as etcd holds it at the write's revision (None: absent there)."""


def history_lost(mark: WatchMark, probe: HistoryProbe) -> str | None:
    """Why etcd's history is no longer the one ``mark`` followed, or None when it still is
    (the watch may resume at ``mark.seen_revision + 1``)."""
    if mark.cluster_id is not None and probe.cluster_id != mark.cluster_id:
        return f"etcd's cluster id changed from {mark.cluster_id:x} to {probe.cluster_id:x}"
    if probe.current_revision < mark.seen_revision:
        return f"etcd's revision went back from {mark.seen_revision} to {probe.current_revision}"
    last = mark.last_write
    if last is not None and probe.checked and not _still_there(last, probe.at_last_write):
        return f"etcd no longer holds the change of {last.key} at revision {last.mod_revision}"
    return None


def _still_there(last: LastWrite, found: KeyValue | None) -> bool:
    if last.deleted:
        return found is None
    return (
        found is not None and found.mod_revision == last.mod_revision and found.value == last.value
    )
