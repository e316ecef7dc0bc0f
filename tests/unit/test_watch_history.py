"""``history_lost``: when a watch must not resume at its last revision + 1 (etcd's history went
back: a restore from a backup, writes etcd 3.5.1 lost on a crash)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.metadata.etcd_txn import KeyValue
from kafscale.broker.metadata.watch_history import (
    HistoryProbe,
    LastWrite,
    WatchMark,
    history_lost,
)

CLUSTER = 0xC1
KEY = "/kafscale/c/brokers/1"


def _kv(mod_revision: int, value: bytes = b"v") -> KeyValue:
    return KeyValue(KEY, value, create_revision=1, mod_revision=mod_revision, version=1, lease=0)


def _put(mod_revision: int, value: bytes = b"v") -> LastWrite:
    return LastWrite(KEY, mod_revision, value, deleted=False)


def test_the_same_history_resumes() -> None:
    mark = WatchMark(100, CLUSTER, _put(100))
    assert history_lost(mark, HistoryProbe(CLUSTER, 100, True, _kv(100))) is None
    assert history_lost(mark, HistoryProbe(CLUSTER, 250, True, _kv(100))) is None


def test_a_first_creation_knows_no_cluster_id_yet() -> None:
    assert history_lost(WatchMark(100), HistoryProbe(CLUSTER, 100)) is None


def test_a_lower_current_revision_is_history_gone() -> None:
    reason = history_lost(WatchMark(100, CLUSTER), HistoryProbe(CLUSTER, 60))
    assert reason is not None and "went back from 100 to 60" in reason


def test_a_watch_never_created_sees_its_callers_read_undone() -> None:
    """The caller read at 100 and watches from 101; etcd was restored before the creation."""
    assert history_lost(WatchMark(100), HistoryProbe(CLUSTER, 60)) is not None


def test_another_cluster_id_is_another_etcd() -> None:
    reason = history_lost(WatchMark(100, CLUSTER), HistoryProbe(0xD2, 500))
    assert reason is not None and "cluster id" in reason


def test_a_revision_reused_by_another_write_is_history_gone() -> None:
    """Writes after the restore passed the old revision before the watch came back: the
    revision number alone cannot tell, the write held at it can."""
    mark = WatchMark(100, CLUSTER, _put(100, b"old"))
    assert history_lost(mark, HistoryProbe(CLUSTER, 140, True, _kv(100, b"new"))) is not None
    assert history_lost(mark, HistoryProbe(CLUSTER, 140, True, _kv(97, b"old"))) is not None
    assert history_lost(mark, HistoryProbe(CLUSTER, 140, True, None)) is not None


def test_a_delete_is_still_there_when_the_key_is_absent_at_its_revision() -> None:
    mark = WatchMark(100, CLUSTER, LastWrite(KEY, 100, b"", deleted=True))
    assert history_lost(mark, HistoryProbe(CLUSTER, 140, True, None)) is None
    assert history_lost(mark, HistoryProbe(CLUSTER, 140, True, _kv(90))) is not None


def test_an_unchecked_last_write_tells_nothing() -> None:
    """Compacted away (or not read): the creation itself says RESYNC if it must."""
    mark = WatchMark(100, CLUSTER, _put(100))
    assert history_lost(mark, HistoryProbe(CLUSTER, 140, False, None)) is None


@given(
    seen=st.integers(0, 10**6),
    current=st.integers(0, 10**6),
    same_cluster=st.booleans(),
)
def test_lost_exactly_when_the_revision_went_back_or_the_cluster_changed(
    seen: int, current: int, same_cluster: bool
) -> None:
    probe = HistoryProbe(CLUSTER if same_cluster else CLUSTER + 1, current)
    lost = history_lost(WatchMark(seen, CLUSTER), probe)
    assert (lost is not None) == (current < seen or not same_cluster)
