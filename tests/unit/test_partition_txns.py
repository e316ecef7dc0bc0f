"""Transactions on one partition: open transactions, markers, LSO, aborted transactions.

The pure bookkeeping (``partition_txns``), its round trip through the etcd document, the owner's
decisions at append (``OwnedPartition``) and the control batch it writes.
"""

from __future__ import annotations

import pytest
from harness.batches import make_batch, with_base_offset
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.metadata.partition_state import (
    AbortedTxn,
    PartitionState,
    ProducerState,
    advance_log_start,
)
from kafscale.broker.metadata.partition_txns import (
    MarkerDone,
    MarkerRejected,
    TxnBegin,
    TxnEnd,
    WriteMarker,
    aborted_in_range,
    apply_txn_events,
    decide_marker,
    last_stable_offset,
)
from kafscale.broker.protocol import control_batch
from kafscale.broker.protocol.errors import ErrorCode, KafkaError
from kafscale.broker.protocol.record_batch import (
    BatchHeader,
    batches_below,
    next_offset_after,
    read_header,
    split_batches,
)
from kafscale.broker.storage.partition_log import OwnedPartition

PID = 7


def test_the_lso_is_the_oldest_open_transaction_or_the_high_watermark() -> None:
    state = PartitionState(high_watermark=50)
    assert last_stable_offset(state) == 50
    state = apply_txn_events(state, [TxnBegin(PID, 20), TxnBegin(8, 10), TxnBegin(PID, 30)])
    assert state.open_txns == {PID: 20, 8: 10}  # a later batch does not move the start
    assert last_stable_offset(state) == 10
    state = apply_txn_events(state, [TxnEnd(8, commit=True, offset=40, coordinator_epoch=1)])
    assert last_stable_offset(state) == 20
    assert state.aborted_txns == ()
    state = apply_txn_events(state, [TxnEnd(PID, commit=False, offset=45, coordinator_epoch=1)])
    assert last_stable_offset(state) == 50
    assert state.aborted_txns == (AbortedTxn(PID, 20, 45),)
    assert state.coordinator_epochs == {8: 1, PID: 1}


def test_aborted_transactions_go_once_below_the_log_start() -> None:
    state = PartitionState(
        high_watermark=100,
        aborted_txns=(AbortedTxn(1, 0, 10), AbortedTxn(2, 5, 30), AbortedTxn(3, 40, 60)),
    )
    assert [t.producer_id for t in advance_log_start(state, 31).aborted_txns] == [3]
    assert [t.producer_id for t in advance_log_start(state, 30).aborted_txns] == [2, 3]


def test_a_fetch_lists_the_aborted_transactions_overlapping_its_range() -> None:
    state = PartitionState(
        high_watermark=100, aborted_txns=(AbortedTxn(1, 0, 10), AbortedTxn(2, 20, 30))
    )
    assert aborted_in_range(state, 0, 5) == [AbortedTxn(1, 0, 10)]
    assert aborted_in_range(state, 11, 20) == []
    assert aborted_in_range(state, 10, 21) == [AbortedTxn(1, 0, 10), AbortedTxn(2, 20, 30)]
    assert aborted_in_range(state, 31, 100) == []


@given(
    open_txns=st.dictionaries(st.integers(0, 2**40), st.integers(0, 2**40), max_size=5),
    aborted=st.lists(st.tuples(*[st.integers(0, 2**40)] * 3), max_size=5),
    epochs=st.dictionaries(st.integers(0, 2**40), st.integers(0, 2**31 - 1), max_size=5),
)
def test_the_transaction_fields_survive_the_etcd_document(
    open_txns: dict[int, int], aborted: list[tuple[int, int, int]], epochs: dict[int, int]
) -> None:
    state = PartitionState(
        high_watermark=5,
        open_txns=open_txns,
        aborted_txns=tuple(AbortedTxn(*t) for t in aborted),
        coordinator_epochs=epochs,
    )
    assert PartitionState.from_json(state.to_json()) == state


def test_a_partition_without_transactions_keeps_its_document() -> None:
    assert b"txn" not in PartitionState(high_watermark=3).to_json()
    assert b"coordinator" not in PartitionState(high_watermark=3).to_json()


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (dict(has_open_txn=True, latest_epoch=0, known_coordinator_epoch=None), WriteMarker(False)),
        (dict(has_open_txn=True, latest_epoch=0, known_coordinator_epoch=2), WriteMarker(False)),
        (dict(has_open_txn=False, latest_epoch=0, known_coordinator_epoch=2), MarkerDone()),
        (
            dict(has_open_txn=True, latest_epoch=0, known_coordinator_epoch=3),
            MarkerRejected(ErrorCode.TRANSACTION_COORDINATOR_FENCED),
        ),
        (
            dict(has_open_txn=True, latest_epoch=1, known_coordinator_epoch=None),
            MarkerRejected(ErrorCode.INVALID_PRODUCER_EPOCH),
        ),
    ],
)
def test_marker_decisions(kwargs: dict[str, object], expected: object) -> None:
    """Marker at producer epoch 0, coordinator epoch 2."""
    assert decide_marker(producer_epoch=0, coordinator_epoch=2, **kwargs) == expected  # type: ignore[arg-type]


def test_a_marker_with_a_newer_producer_epoch_bumps_it() -> None:
    decision = decide_marker(
        has_open_txn=True,
        latest_epoch=0,
        known_coordinator_epoch=None,
        producer_epoch=1,
        coordinator_epoch=0,
    )
    assert decision == WriteMarker(epoch_bump=True)


@pytest.mark.parametrize("latest_epoch", [None, 0])
def test_a_newer_epochs_marker_is_written_even_with_nothing_open(latest_epoch: int | None) -> None:
    """It fences the ended transaction's late batch (added here, not landed yet)."""
    decision = decide_marker(
        has_open_txn=False,
        latest_epoch=latest_epoch,
        known_coordinator_epoch=None,
        producer_epoch=1,
        coordinator_epoch=0,
    )
    assert decision == WriteMarker(epoch_bump=True)


def test_the_marker_is_a_control_batch_kafka_clients_read() -> None:
    batch = control_batch.encode_marker(PID, 3, True, 9, 1_700_000_000_000, 4)
    (parsed,) = split_batches(batch)  # CRC, magic, counts as a produced batch would be checked
    header = read_header(parsed)
    assert header.is_control and header.is_transactional
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (PID, 3, -1)
    assert (header.record_count, header.partition_leader_epoch) == (1, 4)
    assert control_batch.marker_type(batch) == control_batch.COMMIT
    abort = control_batch.encode_marker(PID, 3, False, 9, 1_700_000_000_000)
    assert control_batch.marker_type(abort) == control_batch.ABORT
    # value: version 0, coordinator epoch
    assert batch.endswith(b"\x0c\x00\x00\x00\x00\x00\x09\x00")


def test_a_read_committed_fetch_cuts_at_a_batch_boundary() -> None:
    data = b"".join(
        with_base_offset(make_batch(0, [b"x"] * n), base) for base, n in [(0, 2), (2, 1), (3, 3)]
    )
    assert next_offset_after(batches_below(data, 3), 0) == 3
    assert batches_below(data, 2) == batches_below(data, 1)
    assert batches_below(data, 0) == b""
    assert batches_below(data, 6) == data
    assert next_offset_after(b"", 5) == 5


# --- the owner's decisions at append ------------------------------------------------------------


def txn_header(seq: int, records: int = 1, epoch: int = 0) -> tuple[bytes, BatchHeader]:
    batch = make_batch(
        0,
        [b"v"] * records,
        attributes=0x10,
        producer_id=PID,
        producer_epoch=epoch,
        base_sequence=seq,
    )
    return batch, read_header(batch)


async def test_the_owner_opens_a_transaction_at_its_first_batch_and_closes_it_with_a_marker() -> (
    None
):
    owned = OwnedPartition("t", 0, "id", PartitionState(high_watermark=10), 0, 0)
    batch, header = txn_header(0, records=2)
    owned.append(batch, header)
    batch, header = txn_header(2)
    owned.append(batch, header)
    assert owned.open_txns == {PID: 10}
    acked = owned.append_marker(PID, 0, False, 5, 0)
    assert acked is not None and owned.open_txns == {}
    assert owned.append_marker(PID, 0, False, 5, 0) is None  # retried: nothing more to write
    work = owned.take_flush_work(1 << 20)
    assert work is not None
    assert work.txn_events == [TxnBegin(PID, 10), TxnEnd(PID, False, 13, 5)]
    assert work.batches[-1].base_offset == 13


async def test_a_fencing_marker_refuses_the_older_epoch_afterwards() -> None:
    owned = OwnedPartition("t", 0, "id", PartitionState(), 0, 0)
    batch, header = txn_header(0)
    owned.append(batch, header)
    assert owned.append_marker(PID, 1, False, 0, 0) is not None
    batch, header = txn_header(1, epoch=0)
    with pytest.raises(KafkaError) as refused:
        owned.append(batch, header)
    assert refused.value.code == ErrorCode.INVALID_PRODUCER_EPOCH
    batch, header = txn_header(0, epoch=1)
    owned.append(batch, header)  # the new epoch starts at 0
    assert owned.open_txns == {PID: 2}


async def test_the_owner_continues_from_the_committed_transactions() -> None:
    state = PartitionState(
        high_watermark=20,
        producers={PID: (ProducerState(epoch=0, first_seq=0, last_seq=4, offset=12),)},
        open_txns={PID: 12},
        coordinator_epochs={PID: 4},
    )
    owned = OwnedPartition("t", 0, "id", state, 0, 0)
    with pytest.raises(KafkaError) as fenced:
        owned.append_marker(PID, 0, True, 3, 0)
    assert fenced.value.code == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert owned.append_marker(PID, 0, True, 4, 0) is not None
