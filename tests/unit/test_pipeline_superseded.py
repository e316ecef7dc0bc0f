"""A Spark task whose planned objects a compaction pass superseded while the query ran: the
kept records moved to the new pass's objects, so the task fails (Spark's retry, then a new
query, re-plans) instead of skipping them as loss. Executors never talk to etcd: the task
finds the newer pass by one LIST of the partition's cleaned prefix, only when an object is
missing. And the gaps compaction leaves are never loss, with start and end offsets inside them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness.batches import make_batch

from kafscale.broker.config import StorageSettings
from kafscale.broker.metadata import keys
from kafscale.broker.storage.segments import encode_segment
from kafscale.pipeline.fetch import read_task
from kafscale.pipeline.options import TaskReading
from kafscale.pipeline.planning import DataLoss, ReadTask, SegmentObject

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
    with pytest.raises(RuntimeError, match="superseded by a compaction pass"):
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
