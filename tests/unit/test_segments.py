"""Properties of the segment and index codec (DESIGN §5)."""

from __future__ import annotations

import struct

import crc32c
import pytest
from harness.batches import make_batch, with_base_offset
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.records.readers import read_batch

from kafscale.broker.config import LogSettings
from kafscale.broker.storage.reader import WHOLE_READ_MAX_BYTES
from kafscale.broker.storage.segments import (
    SEGMENT_FOOTER_SIZE,
    SEGMENT_HEADER_SIZE,
    SegmentCorrupt,
    decode_index,
    decode_segment,
    decode_segment_header,
    encode_index,
    encode_segment,
    iter_batches,
    position_for_offset,
    read_batch_info,
)

pytestmark = pytest.mark.unit

CREATED_MS = 1_731_000_000_123


@st.composite
def batch_lists(draw: st.DrawFn) -> list[bytes]:
    """1-12 batches of 1-5 records at increasing (not always dense) offsets."""
    offset = draw(st.integers(0, 2**40))
    batches = []
    for _ in range(draw(st.integers(1, 12))):
        values = draw(st.lists(st.binary(max_size=300), min_size=1, max_size=5))
        batches.append(make_batch(offset, values))
        offset += len(values) + draw(st.sampled_from([0, 0, 0, 1, 7]))
    return batches


def _batch_starts(batches: list[bytes]) -> list[int]:
    starts, position = [], SEGMENT_HEADER_SIZE
    for batch in batches:
        starts.append(position)
        position += len(batch)
    return starts


def test_harness_batches_parse_with_kio() -> None:
    batch = make_batch(42, [b"a", None, b"ccc"], keys=[b"k", b"k2", None], headers=[("h", b"v")])
    parsed, size = read_batch(batch, 0)  # verifies kio's idea of CRC and lengths
    assert size == len(batch)
    assert parsed.base_offset == 42
    assert [r.offset for r in parsed.records] == [42, 43, 44]
    assert [r.value for r in parsed.records] == [b"a", None, b"ccc"]
    info = read_batch_info(batch)
    assert (info.base_offset, info.last_offset, info.record_count) == (42, 44, 3)
    assert read_batch(with_base_offset(batch, 7), 0)[0].records[0].offset == 7


@given(batches=batch_lists(), interval=st.integers(1, 2000))
@settings(max_examples=150, deadline=None)
def test_encode_decode_round_trip(batches: list[bytes], interval: int) -> None:
    encoded = encode_segment(batches, CREATED_MS, interval)
    decoded = decode_segment(encoded.segment)
    assert bytes(decoded.body) == b"".join(batches)
    assert decoded.base_offset == encoded.base_offset == read_batch_info(batches[0]).base_offset
    assert decoded.last_offset == encoded.last_offset == read_batch_info(batches[-1]).last_offset
    records = sum(read_batch_info(b).record_count for b in batches)
    assert decoded.record_count == encoded.record_count == records
    assert decoded.created_at_ms == CREATED_MS
    assert decoded.header.flags == 0
    assert [bytes(view) for _, _, view in iter_batches(decoded.body)] == batches


@given(batches=batch_lists(), epoch=st.integers(0, 2**31 - 1))
@settings(max_examples=100, deadline=None)
def test_stamping_while_encoding_assigns_offsets_and_epoch(
    batches: list[bytes], epoch: int
) -> None:
    """The broker hands over the producer's batches (base offset 0) with the offsets it
    assigned; the segment must hold them exactly as if each batch had been stamped first."""
    assigned = [read_batch_info(b).base_offset for b in batches]
    as_sent = [with_base_offset(b, 0) for b in batches]
    encoded = encode_segment(as_sent, CREATED_MS, 64, base_offsets=assigned, leader_epoch=epoch)
    decoded = decode_segment(encoded.segment)  # checks the body CRC over the stamped bytes
    stamped = []
    for batch in batches:
        copy = bytearray(batch)
        struct.pack_into(">i", copy, 12, epoch)
        stamped.append(bytes(copy))
    assert bytes(decoded.body) == b"".join(stamped)
    assert (decoded.base_offset, decoded.last_offset) == (
        assigned[0],
        read_batch_info(batches[-1]).last_offset,
    )
    index = decode_index(encoded.index)
    assert set(index.base_offsets) <= set(assigned)
    for view, batch in zip(iter_batches(decoded.body), stamped, strict=True):
        parsed, _ = read_batch(bytes(view[2]), 0)  # kio checks the untouched batch CRC
        assert parsed.base_offset == read_batch_info(batch).base_offset
    assert as_sent == [with_base_offset(b, 0) for b in batches]  # inputs left alone


@given(batches=batch_lists(), interval=st.integers(1, 2000))
@settings(max_examples=150, deadline=None)
def test_index_entries_are_batch_starts_spaced_by_interval(
    batches: list[bytes], interval: int
) -> None:
    encoded = encode_segment(batches, CREATED_MS, interval)
    index = decode_index(encoded.index)
    starts = _batch_starts(batches)
    bases = [read_batch_info(b).base_offset for b in batches]
    assert index.interval == interval
    assert index.positions[0] == SEGMENT_HEADER_SIZE
    assert index.base_offsets[0] == bases[0]
    for offset, position in zip(index.base_offsets, index.positions, strict=True):
        i = starts.index(position)  # every entry points at a batch start ...
        assert bases[i] == offset  # ... and names that batch's base offset
        assert read_batch_info(encoded.segment, position).base_offset == offset
    gaps = [b - a for a, b in zip(index.positions, index.positions[1:], strict=False)]
    assert all(gap >= interval for gap in gaps)
    # No batch that should have started a new entry was skipped.
    entry_at = set(index.positions)
    last = SEGMENT_HEADER_SIZE
    for start in starts:
        if start - last >= interval:
            assert start in entry_at
        if start in entry_at:
            last = start


@given(batches=batch_lists(), interval=st.integers(1, 600), data=st.data())
@settings(max_examples=150, deadline=None)
def test_position_for_offset_finds_the_batch(
    batches: list[bytes], interval: int, data: st.DataObject
) -> None:
    """Reading forward from the position reaches the first batch ending at or after ``offset``."""
    encoded = encode_segment(batches, CREATED_MS, interval)
    index = decode_index(encoded.index)
    offset = data.draw(st.integers(encoded.base_offset - 3, encoded.last_offset + 3))
    position = position_for_offset(index, offset)
    starts = _batch_starts(batches)
    infos = [read_batch_info(b) for b in batches]
    assert position in starts
    start_info = infos[starts.index(position)]
    assert start_info.base_offset <= max(offset, encoded.base_offset)
    # The closest indexed batch at or before offset: no later entry would also do.
    later = [o for o in index.base_offsets if start_info.base_offset < o <= offset]
    assert later == []
    wanted = next((i for i in infos if i.last_offset >= offset), None)
    body = encoded.segment[: len(encoded.segment) - SEGMENT_FOOTER_SIZE]
    reached = [(base, last) for base, last, _ in iter_batches(body, position)]
    if wanted is not None:
        assert (wanted.base_offset, wanted.last_offset) in reached


def test_position_for_offset_empty_index_is_first_batch() -> None:
    index = decode_index(encode_index([], 4096))
    assert position_for_offset(index, 123) == SEGMENT_HEADER_SIZE


def test_iter_batches_stops_at_truncated_tail() -> None:
    batches = [make_batch(0, [b"x" * 50]), make_batch(1, [b"y" * 50, b"z"])]
    body = b"".join(batches)
    for cut in range(len(body) + 1):
        found = [bytes(view) for _, _, view in iter_batches(body[:cut])]
        complete = [b for i, b in enumerate(batches) if sum(map(len, batches[: i + 1])) <= cut]
        assert found == complete


def test_iter_batches_ignores_a_trailing_footer() -> None:
    encoded = encode_segment([make_batch(5, [b"a"])], CREATED_MS, 1)
    found = list(iter_batches(encoded.segment, SEGMENT_HEADER_SIZE))
    assert [(base, last) for base, last, _ in found] == [(5, 5)]


def test_iter_batches_rejects_a_misaligned_start() -> None:
    body = make_batch(0, [b"v" * 100]) * 2
    with pytest.raises(SegmentCorrupt):
        list(iter_batches(body, 3))


def _segment() -> bytes:
    batches = [make_batch(10, [b"one", b"two"]), make_batch(12, [b"three"])]
    return encode_segment(batches, CREATED_MS, 1).segment


@pytest.mark.parametrize("position", [SEGMENT_HEADER_SIZE, SEGMENT_HEADER_SIZE + 40, -1 - 16])
def test_flipped_body_byte_fails_crc(position: int) -> None:
    data = bytearray(_segment())
    data[position] ^= 0x01
    with pytest.raises(SegmentCorrupt, match="CRC32C"):
        decode_segment(bytes(data))


def test_wrong_footer_crc_detected() -> None:
    data = bytearray(_segment())
    footer_at = len(data) - SEGMENT_FOOTER_SIZE
    struct.pack_into(">I", data, footer_at, crc32c.crc32c(b"other"))
    with pytest.raises(SegmentCorrupt, match="CRC32C"):
        decode_segment(bytes(data))


@pytest.mark.parametrize(
    ("at", "replacement", "message"),
    [(0, b"KAFZ", "segment magic"), (-4, b"END?", "footer magic"), (4, b"\x00\x02", "version")],
)
def test_bad_magic_or_version_detected(at: int, replacement: bytes, message: str) -> None:
    data = bytearray(_segment())
    at = at % len(data)
    data[at : at + len(replacement)] = replacement
    with pytest.raises(SegmentCorrupt, match=message):
        decode_segment(bytes(data))


@pytest.mark.parametrize("cut", [0, 10, SEGMENT_HEADER_SIZE, SEGMENT_HEADER_SIZE + 20, -1])
def test_truncated_segment_detected(cut: int) -> None:
    with pytest.raises(SegmentCorrupt):
        decode_segment(_segment()[:cut])


def test_header_alone_decodes() -> None:
    header = decode_segment_header(_segment()[:SEGMENT_HEADER_SIZE])
    assert (header.base_offset, header.record_count, header.created_at_ms) == (10, 3, CREATED_MS)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b"IDX\x01" + b[4:],
        lambda b: b[:4] + b"\x00\x09" + b[6:],
        lambda b: b[:-1],
        lambda b: b[:8],
        lambda b: b + b"\x00" * 12,
    ],
)
def test_corrupt_index_detected(mutate: object) -> None:
    batches = [make_batch(o, [b"v" * 20]) for o in range(4)]
    index = encode_segment(batches, CREATED_MS, 1).index
    with pytest.raises(SegmentCorrupt):
        decode_index(mutate(index))  # type: ignore[operator]


def test_unordered_index_detected() -> None:
    with pytest.raises(SegmentCorrupt, match="ascending"):
        decode_index(encode_index([(5, 32), (3, 100)], 1))


@pytest.mark.parametrize(
    "batches",
    [
        [],
        [make_batch(5, [b"a", b"b"]), make_batch(6, [b"c"])],  # overlaps
        [make_batch(0, [b"a"]) + b"extra"],  # length field disagrees
        [make_batch(0, [b"a"])[:40]],  # shorter than a batch header
        [make_batch(0, [b"a"])[:16] + b"\x01" + make_batch(0, [b"a"])[17:]],  # magic 1
    ],
)
def test_encode_rejects_bad_input(batches: list[bytes]) -> None:
    with pytest.raises(ValueError):
        encode_segment(batches, CREATED_MS, 4096)


def test_by_default_only_segments_read_by_ranges_get_an_index() -> None:
    """An index object is a PUT per segment; readers GET segments up to WHOLE_READ_MAX_BYTES
    whole and never read their index, so by default only larger segments get one."""
    assert LogSettings().index_min_segment_bytes == WHOLE_READ_MAX_BYTES
