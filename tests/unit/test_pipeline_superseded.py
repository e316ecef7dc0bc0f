"""A Spark task whose planned objects a compaction pass superseded while the query ran: the
kept records moved to the new pass's objects. The task finds the newer pass by one LIST of the
partition's cleaned prefix, only when an object is missing, and never skips the moved records
as loss. A task of a compacted topic then re-locates the rest of its range from the partition's
current state (``relocated_task`` here; end to end in ``tests/pipeline/
test_compacted_relocate.py``); a task without the etcd settings for that (its topic was not
compacted when planned) fails with "run the query again". And the gaps compaction leaves are
never loss, with start and end offsets inside them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness.batches import make_batch

from kafscale.broker.config import StorageSettings
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.partition_state import AbortedTxn
from kafscale.broker.storage.segments import encode_segment
from kafscale.pipeline.fetch import read_task
from kafscale.pipeline.options import TaskReading, parse_read_options
from kafscale.pipeline.planning import (
    DataLoss,
    PartitionView,
    ReadTask,
    SegmentObject,
    relocated_task,
)
from kafscale.pipeline.readers import _partitions
from kafscale.pipeline.source import TaskPartition

pytestmark = pytest.mark.unit


def _put(root: Path, key: str, base: int, values: list[bytes]) -> int:
    segment = encode_segment([make_batch(base, values)], 0, 4096).segment
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(segment)
    return len(segment)


def _read(root: Path, fail_on_data_loss: bool, generation: int = -1) -> list[bytes]:
    """Plan: plain segments at 0 (now gone) and 2; read [0, 4)."""
    size = _put(root, keys.segment_object_key("c", "t", "id", 0, 2, 1), 2, [b"c", b"d"])
    planned = (SegmentObject(0, 1, size), SegmentObject(2, 1, size))
    task = ReadTask("t", "id", 0, 0, 4, planned, (), 0, generation)
    reading = TaskReading(
        "c", StorageSettings(kind="local", local_dir=root), False, fail_on_data_loss
    )
    return [v for rows in read_task(reading, task) for v in rows.column("value").to_pylist()]


@pytest.mark.parametrize("fail_on_data_loss", [False, True])
def test_a_plain_segment_superseded_by_a_newer_pass_fails_the_task(
    tmp_path: Path, fail_on_data_loss: bool
) -> None:
    prefix = keys.cleaned_pass_prefix("c", "t", "id", 0, 0, 1)
    _put(tmp_path, keys.cleaned_object_key(prefix, 0), 1, [b"b"])  # the kept record of 0..1
    with pytest.raises(RuntimeError, match=r"superseded by a compaction pass.*run the query again"):
        _read(tmp_path, fail_on_data_loss)


def test_a_plain_segment_deleted_without_a_newer_pass_is_still_loss(tmp_path: Path) -> None:
    prefix = keys.cleaned_pass_prefix("c", "t", "id", 0, 0, 1)
    _put(tmp_path, keys.cleaned_object_key(prefix, 0), 1, [b"b"])  # the planned generation
    assert _read(tmp_path, False, generation=0) == [b"c", b"d"]  # skipped, as before
    with pytest.raises(DataLoss):
        _read(tmp_path, True, generation=0)
    assert _read(tmp_path / "never-cleaned", False) == [b"c", b"d"]


@pytest.mark.parametrize("fail_on_data_loss", [False, True])
def test_start_and_end_offsets_inside_cleaned_gaps_are_not_loss(
    tmp_path: Path, fail_on_data_loss: bool
) -> None:
    """Generation 0 kept offsets 1 and 6 of [0, 8); plain data from 8 on. A task from 2 (in a
    gap) to 5 (in a gap) reads nothing and reports no loss; from 3 to 9 it reads 6 and 8."""
    prefix = keys.cleaned_pass_prefix("c", "t", "id", 0, 0, 1)
    segment = encode_segment(
        [make_batch(1, [b"one"]), make_batch(6, [b"six"])], 0, 4096, base_offsets=[1, 6]
    ).segment
    path = tmp_path / keys.cleaned_object_key(prefix, 0)
    path.parent.mkdir(parents=True)
    path.write_bytes(segment)
    plain = _put(tmp_path, keys.segment_object_key("c", "t", "id", 0, 8, 1), 8, [b"eight"])
    objects = (SegmentObject(0, 1, len(segment), 0), SegmentObject(8, 1, plain))
    storage = StorageSettings(kind="local", local_dir=tmp_path)
    reading = TaskReading("c", storage, False, fail_on_data_loss)

    def values(start: int, end: int) -> list[bytes]:
        task = ReadTask("t", "id", 0, start, end, objects, (), 8, 0)
        return [v for rows in read_task(reading, task) for v in rows.column("value").to_pylist()]

    assert values(2, 5) == []
    assert values(3, 9) == [b"six", b"eight"]
    assert values(0, 8) == [b"one", b"six"]


def test_a_relocated_task_keeps_its_planned_bounds_and_aborted_transactions() -> None:
    """Rows below 7 were returned; generation 3 now tiles [0, 40) and plain data follows. The
    rest, [7, 20), comes from the objects holding it, with the plan's end and aborted
    transactions (a superset of the state's now), and gaps below 40 count as compaction."""
    aborted = (AbortedTxn(producer_id=5, first_offset=8, last_offset=9),)
    planned = (SegmentObject(0, 1, 100), SegmentObject(10, 1, 100))
    task = ReadTask("t", "id", 0, 2, 20, planned, aborted, 0, -1, True)
    view = PartitionView("t", "id", 0, 0, 60, (), 40, 3, True)
    current = [SegmentObject(0, 2, 50, 3), SegmentObject(25, 2, 50, 3), SegmentObject(40, 2, 90)]

    relocated, lost = relocated_task(task, 7, view, current)

    assert lost is None
    assert (relocated.start, relocated.end, relocated.aborted) == (7, 20, aborted)
    assert relocated.segments == (SegmentObject(0, 2, 50, 3),)
    assert (relocated.cleaned_upto, relocated.cleaned_generation) == (40, 3)


def test_offsets_below_the_current_log_start_are_lost_not_relocated() -> None:
    task = ReadTask("t", "id", 0, 2, 20, (SegmentObject(0, 1, 100),), (), 0, -1, True)
    segments = [SegmentObject(12, 2, 50, 3)]

    moved, lost = relocated_task(task, 5, PartitionView("t", "id", 0, 12, 60, (), 30, 3), segments)
    assert (lost, moved.start, moved.segments) == ((5, 12), 12, (SegmentObject(12, 2, 50, 3),))

    gone, lost = relocated_task(task, 5, PartitionView("t", "id", 0, 25, 60, (), 30, 3), [])
    assert (lost, gone.start, gone.segments) == ((5, 20), 20, ())


def test_only_compacted_topics_tasks_carry_the_etcd_settings() -> None:
    options = parse_read_options(
        {
            "etcd.endpoints": "http://etcd:2379",
            "etcd.username": "spark",  # a password alone is refused, as by the broker
            "etcd.password": "pw",
            "subscribe": "a,b",
        },
        streaming=False,
    )
    compacted = ReadTask("a", "id", 0, 0, 5, (), compacted=True)
    plain = ReadTask("b", "id", 0, 0, 5, ())
    first, second = _partitions(options, [compacted, plain])
    assert isinstance(first, TaskPartition) and isinstance(second, TaskPartition)
    assert first.etcd is not None and first.etcd.endpoints == ("http://etcd:2379",)
    assert second.etcd is None
