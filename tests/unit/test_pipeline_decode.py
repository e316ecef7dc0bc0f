"""The data source's decoder: v2 record batches of every codec to Spark's Kafka columns."""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

import cramjam
import crc32c
import pytest
from harness import children
from harness.batches import make_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from kafscale.pipeline import kernels
from kafscale.pipeline.decode import CorruptRecords, decode_records

pytestmark = pytest.mark.unit

CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def xerial(data: bytes) -> bytes:
    """Snappy as Kafka's Java client frames it (xerial): magic, versions, sized raw blocks."""
    out = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    for i in range(0, len(data), 1000):
        block = bytes(cramjam.snappy.compress_raw(data[i : i + 1000]))
        out += struct.pack(">i", len(block)) + block
    return out


def compressed(batch: bytes, codec: str) -> bytes:
    """``batch`` with its records compressed by ``codec`` (attributes and CRC updated)."""
    records = batch[61:]
    packed = {
        "gzip": lambda d: bytes(cramjam.gzip.compress(d)),
        "snappy": lambda d: bytes(cramjam.snappy.compress_raw(d)),
        "xerial": xerial,
        "lz4": lambda d: bytes(cramjam.lz4.compress(d)),
        "zstd": lambda d: bytes(cramjam.zstd.compress(d)),
    }[codec](records)
    (attributes,) = struct.unpack_from(">h", batch, 21)
    attributes |= CODECS["snappy" if codec == "xerial" else codec]
    after_crc = struct.pack(">h", attributes) + batch[23:61] + packed
    head = struct.pack(
        ">qiib",
        *struct.unpack_from(">qiib", batch, 0)[:1],
        4 + 1 + 4 + len(after_crc),
        *struct.unpack_from(">ib", batch, 12),
    )
    return head + struct.pack(">I", crc32c.crc32c(after_crc)) + after_crc


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "xerial", "lz4", "zstd"])
def test_every_codec_decodes_to_the_same_rows(codec: str) -> None:
    values = [f"value-{i}".encode() * 5 for i in range(40)]
    keys = [None if i % 3 == 0 else f"k{i}".encode() for i in range(40)]
    batch = make_batch(100, values, keys=keys, headers=[("h", b"x"), ("empty", None)])
    if codec != "none":
        batch = compressed(batch, codec)
    rows = decode_records(batch, "t", 1, 0, 1000, include_headers=True).to_pylist()
    assert [r["offset"] for r in rows] == list(range(100, 140))
    assert [r["value"] for r in rows] == values
    assert [r["key"] for r in rows] == keys
    assert rows[0]["headers"] == [{"key": "h", "value": b"x"}, {"key": "empty", "value": None}]
    assert {(r["topic"], r["partition"], r["timestampType"]) for r in rows} == {("t", 1, 0)}
    assert rows[5]["timestamp"].timestamp() * 1000 == pytest.approx(1_700_000_000_005)


def test_offsets_outside_the_range_and_control_batches_are_left_out() -> None:
    data = (
        make_batch(0, [b"a", b"b", b"c"])
        + make_batch(3, [b"\x00\x00\x00\x00"], attributes=0x20 | 0x10)
        + make_batch(4, [b"d", b"e", b"f"])
    )
    rows = decode_records(data, "t", 0, 1, 6, include_headers=False)
    assert rows is not None
    assert rows.column("offset").to_pylist() == [1, 2, 4, 5]
    assert rows.column("value").to_pylist() == [b"b", b"c", b"d", b"e"]
    assert rows.schema.names == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
    ]
    assert decode_records(data, "t", 0, 6, 6, include_headers=False) is None


def test_log_append_time_batches_give_every_record_the_append_time() -> None:
    batch = bytearray(make_batch(0, [b"a", b"b"], attributes=0x08))
    struct.pack_into(">q", batch, 35, 1_800_000_000_000)  # max timestamp = append time
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    rows = decode_records(bytes(batch), "t", 0, 0, 10, include_headers=False).to_pylist()
    assert {r["timestampType"] for r in rows} == {1}
    assert {r["timestamp"].timestamp() for r in rows} == {1_800_000_000.0}


def test_damaged_records_are_an_error_not_a_crash() -> None:
    batch = bytearray(make_batch(0, [b"value"] * 3))
    batch[61] = 0x7E  # the first record's length now runs past the batch
    with pytest.raises(CorruptRecords):
        decode_records(bytes(batch), "t", 0, 0, 10, include_headers=False)
    bomb = compressed(make_batch(0, [b"x" * 100]), "zstd")
    bomb = bomb[:61] + b"\x00\x01\x02\x03" + bomb[65:]  # not a zstd frame any more
    with pytest.raises(CorruptRecords):
        decode_records(bomb, "t", 0, 0, 10, include_headers=False)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.binary(max_size=40)),
            st.one_of(st.none(), st.binary(max_size=300)),
            st.lists(
                st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))),
                max_size=3,
            ),
        ),
        min_size=1,
        max_size=30,
    ),
    st.integers(0, 40),
    st.integers(0, 40),
)
def test_decoded_rows_are_the_records_in_range(
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
    low: int,
    span: int,
) -> None:
    data = b"".join(
        make_batch(i, [value], keys=[key], headers=headers)
        for i, (key, value, headers) in enumerate(records)
    )
    rows = decode_records(data, "t", 0, low, low + span, include_headers=True)
    expected = [
        {"offset": i, "key": k, "value": v, "headers": [{"key": n, "value": hv} for n, hv in h]}
        for i, (k, v, h) in enumerate(records)
        if low <= i < low + span
    ]
    got = [] if rows is None else rows.select(["offset", "key", "value", "headers"]).to_pylist()
    assert got == expected


def test_the_kernels_are_compiled_where_numba_is_installed() -> None:
    pytest.importorskip("numba")
    assert kernels.COMPILED


def test_the_plain_python_kernels_give_the_same_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without numba the same loops run as Python: same rows, only slower."""
    data = make_batch(0, [b"a", None, b"c"], keys=[b"k", None, None], headers=[("h", b"v")])
    data += compressed(make_batch(3, [b"d" * 50] * 4), "lz4")
    compiled_rows = decode_records(data, "t", 0, 1, 6, include_headers=True)
    for name in ("parse_records", "gather", "_varint"):
        function = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, getattr(function, "py_func", function))
    plain_rows = decode_records(data, "t", 0, 1, 6, include_headers=True)
    assert plain_rows.to_pylist() == compiled_rows.to_pylist()


def test_an_executor_reads_without_importing_pandas() -> None:
    """``pa.array`` of NumPy data and ``pa.repeat`` import pandas: ~1 s of CPU in every new
    Spark Python worker, before its first row. The executor's path must not touch them."""
    script = """
import sys
from harness.batches import make_batch
from kafscale.pipeline import fetch
from kafscale.pipeline.decode import decode_records
batch = make_batch(0, [b"v"] * 3, keys=[None, b"k", b"k"], headers=[("h", b"x")])
rows = decode_records(batch, "t", 0, 0, 10, include_headers=True)
assert rows.num_rows == 3, rows
print("pandas" in sys.modules)
"""
    tests_dir = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(tests_dir)}
    done = children.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "False"


def test_reading_from_a_local_directory_does_not_import_boto3(tmp_path: Path) -> None:
    """boto3 and botocore cost every new Spark worker (and CLI start) ~0.2 s of CPU to
    import; a task reading a local directory has no use for them."""
    script = f"""
import sys
from pathlib import Path
from harness.batches import make_batch
from kafscale.broker.config import StorageSettings
from kafscale.broker.metadata import keys
from kafscale.broker.storage.segments import encode_segment
from kafscale.pipeline.fetch import read_task
from kafscale.pipeline.options import TaskReading
from kafscale.pipeline.planning import ReadTask, SegmentObject
root = Path({str(tmp_path)!r})
segment = encode_segment([make_batch(0, [b"a", b"b"])], 0, 4096).segment
path = root / keys.segment_object_key("c", "t", "id", 0, 0, 1)
path.parent.mkdir(parents=True)
path.write_bytes(segment)
reading = TaskReading("c", StorageSettings(kind="local", local_dir=root), False, True)
task = ReadTask("t", "id", 0, 0, 2, (SegmentObject(0, 1, len(segment)),))
(rows,) = read_task(reading, task)
assert rows.column("value").to_pylist() == [b"a", b"b"], rows
print("boto3" in sys.modules, "botocore" in sys.modules)
"""
    tests_dir = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(tests_dir)}
    done = children.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "False False"
