"""KIP-890's pure halves: the coordinator's verification answer, transaction protocol v2's
epoch bump in EndTxn (retries, the last epoch), Produce's error translation, and the partition's
guard that a marker arriving during a verification invalidates."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import pytest
from harness.ports import closed_port
from kafka.record.default_records import DefaultRecordBatchBuilder

from kafscale.broker.api import produce
from kafscale.broker.api.dispatch import RequestContext
from kafscale.broker.authz.store import AclCache
from kafscale.broker.config import BrokerSettings
from kafscale.broker.metadata.cluster import BrokerInfo, TopicInfo
from kafscale.broker.metadata.partition_state import PartitionState
from kafscale.broker.protocol.codec import RequestHeader
from kafscale.broker.protocol.errors import ErrorCode, KafkaError, NotLeader
from kafscale.broker.protocol.record_batch import BatchHeader, read_header
from kafscale.broker.server import Connection
from kafscale.broker.storage.partition_log import OwnedPartition
from kafscale.broker.transactions import state
from kafscale.broker.transactions.inter_broker_client import InterBrokerClient
from kafscale.broker.transactions.state import TxnMetadata, TxnState
from kafscale.broker.transactions.store import decode_metadata, encode_metadata
from kafscale.broker.transactions.verification import PartitionVerifier, produce_error


def _codes(outcomes: dict[Any, Any]) -> dict[Any, Any]:
    """The code each refused partition is answered: an outcome is the code, or the error
    whose reason the broker logs (``produce_refusals``)."""
    return {tp: o.code if isinstance(o, KafkaError) else o for tp, o in outcomes.items()}


pytestmark = pytest.mark.unit

TP, OTHER = ("orders", 0), ("orders", 1)
PID = 7


def ongoing(epoch: int = 3) -> TxnMetadata:
    return TxnMetadata(
        "app", PID, epoch, 1000, TxnState.ONGOING, partitions=frozenset({TP}), start_ms=1
    )


# --- verification (part 1) ------------------------------------------------------------------


def test_only_a_partition_of_the_ongoing_transaction_verifies() -> None:
    codes = state.verification_codes(ongoing(), PID, 3, [TP, OTHER])
    assert codes == {TP: ErrorCode.NONE, OTHER: ErrorCode.INVALID_TXN_STATE}


def test_after_the_abort_nothing_verifies() -> None:
    aborted = dataclasses.replace(ongoing(), state=TxnState.COMPLETE_ABORT, partitions=frozenset())
    assert state.verification_codes(aborted, PID, 3, [TP]) == {TP: ErrorCode.INVALID_TXN_STATE}


def test_a_stale_epoch_or_unknown_producer_does_not_verify() -> None:
    assert state.verification_codes(ongoing(), PID, 2, [TP]) == {TP: ErrorCode.PRODUCER_FENCED}
    assert state.verification_codes(ongoing(), 99, 3, [TP]) == {
        TP: ErrorCode.INVALID_PRODUCER_ID_MAPPING
    }
    assert state.verification_codes(None, PID, 3, [TP]) == {
        TP: ErrorCode.INVALID_PRODUCER_ID_MAPPING
    }


@pytest.mark.parametrize(
    "code",
    [
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.CONCURRENT_TRANSACTIONS,
    ],
)
def test_a_coordinator_that_cannot_answer_is_a_retriable_produce_error(code: ErrorCode) -> None:
    assert produce_error(code) is ErrorCode.NOT_ENOUGH_REPLICAS


def test_produce_errors_keep_their_meaning() -> None:
    assert produce_error(ErrorCode.INVALID_TXN_STATE) is ErrorCode.INVALID_TXN_STATE
    assert produce_error(ErrorCode.PRODUCER_FENCED) is ErrorCode.INVALID_PRODUCER_EPOCH
    # v2 clients know CONCURRENT_TRANSACTIONS on Produce (a commit being completed) and retry.
    assert produce_error(ErrorCode.CONCURRENT_TRANSACTIONS, transaction_v2=True) is (
        ErrorCode.CONCURRENT_TRANSACTIONS
    )


class _RemoteCoordinator:
    """The transactional id is coordinated at another broker (a closed port here)."""

    def __init__(self, port: int) -> None:
        self.broker = BrokerInfo(node_id=2, host="127.0.0.1", port=port)

    def coordinator_for(self, transactional_id: str) -> BrokerInfo | None:
        return self.broker

    async def verify(
        self, transactional_id: str, producer_id: int, epoch: int, partitions: Iterable[object]
    ) -> dict[tuple[str, int], ErrorCode]:
        raise AssertionError("not the coordinator")

    async def add(self, *args: object, **kwargs: object) -> ErrorCode:
        raise AssertionError("not the coordinator")


async def test_an_unreachable_coordinator_never_verifies_a_partition() -> None:
    client = InterBrokerClient(timeout_s=2.0)
    verifier = PartitionVerifier(_RemoteCoordinator(closed_port()), client, node_id=1)
    try:
        codes = await verifier.verify("app", PID, 3, [TP])
        added = await verifier.verify("app", PID, 3, [TP], add=True)
        group = await verifier.add_group("app", PID, 3, "group")
    finally:
        await client.close()
    assert codes == {TP: ErrorCode.NOT_ENOUGH_REPLICAS}
    assert added == {TP: ErrorCode.NOT_ENOUGH_REPLICAS}
    assert group is ErrorCode.COORDINATOR_NOT_AVAILABLE


# --- the partition's guard --------------------------------------------------------------------


def _partition() -> OwnedPartition:
    owned = PartitionState(high_watermark=10, leader_epoch=1, epochs=((1, 10),))
    return OwnedPartition("orders", 0, "id", owned, state_revision=1, lease_revision=1)


def _txn_header() -> BatchHeader:
    return BatchHeader(
        base_offset=0, batch_length=0, partition_leader_epoch=0, magic=2, crc=0,
        attributes=0x10, last_offset_delta=0, base_timestamp=0, max_timestamp=0,
        producer_id=PID, producer_epoch=3, base_sequence=0, record_count=1,
    )  # fmt: skip


async def test_a_verification_holds_until_a_marker_for_the_producer_arrives() -> None:
    owned = _partition()
    guard = owned.begin_verification(PID)
    assert owned.end_verification(PID, guard)
    late = owned.begin_verification(PID)
    owned.append(b"x" * 70, _txn_header())  # the transaction opens here...
    owned.append_marker(PID, 3, commit=False, coordinator_epoch=1, now_ms=0)  # ...and ends
    assert not owned.end_verification(PID, late)  # answered before the abort: refused
    assert owned.verifying == {}


def test_concurrent_verifications_of_one_producer_do_not_cancel_each_other() -> None:
    owned = _partition()
    first, second = owned.begin_verification(PID), owned.begin_verification(PID)
    assert owned.end_verification(PID, first)
    assert owned.end_verification(PID, second)
    assert owned.verifying == {}


# --- transaction protocol v2: EndTxn v5 bumps the epoch ----------------------------------------


def test_a_v2_commit_bumps_the_epoch_and_its_markers_carry_it() -> None:
    outcome = state.end_transaction(ongoing(3), PID, 3, True, 50, bump=True)
    meta = outcome.metadata
    assert outcome.error is ErrorCode.NONE and meta is not None
    assert (meta.state, meta.producer_epoch) == (TxnState.PREPARE_COMMIT, 4)
    assert (meta.previous_producer_id, meta.previous_epoch) == (PID, 3)
    assert state.end_answer(meta) == (PID, 4)
    done = state.completed(meta, 60)
    assert (done.state, done.producer_id, done.producer_epoch) == (TxnState.COMPLETE_COMMIT, PID, 4)


def test_a_v1_commit_keeps_the_epoch() -> None:
    meta = state.end_transaction(ongoing(3), PID, 3, True, 50).metadata
    assert meta is not None and meta.producer_epoch == 3


def test_a_retried_v2_end_txn_with_the_old_epoch_gets_the_same_answer() -> None:
    prepared = state.end_transaction(ongoing(3), PID, 3, True, 50, bump=True).metadata
    assert prepared is not None
    retry = state.end_transaction(prepared, PID, 3, True, 51, bump=True)
    assert retry.error is ErrorCode.CONCURRENT_TRANSACTIONS and retry.metadata is None
    done = state.completed(prepared, 60)
    assert state.end_transaction(done, PID, 3, True, 61, bump=True).error is ErrorCode.NONE
    opposite = state.end_transaction(done, PID, 3, False, 61, bump=True)
    assert opposite.error is ErrorCode.INVALID_TXN_STATE
    # The ended transaction's epoch is fenced for anything but that retry.
    assert state.add_to_transaction(done, PID, 3, 70, frozenset({TP})).error is (
        ErrorCode.PRODUCER_FENCED
    )


def test_a_v2_abort_of_a_transaction_that_never_began_bumps_the_epoch() -> None:
    empty = TxnMetadata("app", PID, 5, 1000, TxnState.COMPLETE_COMMIT)
    aborting = state.end_transaction(empty, PID, 5, False, 50, bump=True).metadata
    assert aborting is not None
    assert (aborting.state, aborting.producer_epoch) == (TxnState.PREPARE_ABORT, 6)
    assert state.end_transaction(empty, PID, 5, True, 50, bump=True).error is (
        ErrorCode.INVALID_TXN_STATE
    )


def test_the_last_epoch_moves_the_producer_to_a_new_id() -> None:
    last = ongoing(state.MAX_PRODUCER_EPOCH - 1)
    assert state.needs_new_producer_id(last)
    assert not state.needs_new_producer_id(ongoing(state.MAX_PRODUCER_EPOCH - 2))
    prepared = state.end_transaction(
        last, PID, last.producer_epoch, True, 50, bump=True, new_producer_id=99
    ).metadata
    assert prepared is not None
    assert (prepared.producer_id, prepared.producer_epoch) == (PID, state.MAX_PRODUCER_EPOCH)
    assert state.end_answer(prepared) == (99, 0)
    done = state.completed(prepared, 60)
    assert (done.producer_id, done.producer_epoch, done.next_producer_id) == (99, 0, -1)
    retry = state.end_transaction(done, PID, last.producer_epoch, True, 61, bump=True)
    assert retry.error is ErrorCode.NONE and state.end_answer(done) == (99, 0)


def test_a_timeout_abort_is_not_mistaken_for_a_retried_end_txn() -> None:
    prepared = state.end_transaction(ongoing(3), PID, 3, True, 50, bump=True).metadata
    assert prepared is not None
    again = dataclasses.replace(
        state.completed(prepared, 60), state=TxnState.ONGOING, partitions=frozenset({TP})
    )
    aborting = state.fenced_abort(again, 70)
    assert (aborting.previous_producer_id, aborting.previous_epoch) == (-1, -1)


def test_the_v2_fields_survive_etcd() -> None:
    prepared = state.end_transaction(
        ongoing(3), PID, 3, True, 50, bump=True, new_producer_id=12
    ).metadata
    assert prepared is not None
    assert decode_metadata(encode_metadata(prepared)) == prepared
    old_record = b'{"transactional_id":"app","producer_id":7,"producer_epoch":1,"timeout_ms":9}'
    assert decode_metadata(old_record).previous_epoch == -1


def test_transaction_protocol_off_lists_no_finalized_feature() -> None:
    """Kafka lists no finalized entry at level 0; clients then take protocol v1."""
    from kafscale.broker.api.features import features_body

    assert features_body(0, share_version=0)["finalized_features"] == []
    assert features_body(1, share_version=0)["finalized_features"] == [
        {"name": "transaction.version", "max_version_level": 1, "min_version_level": 1}
    ]


# --- the produce path: nothing between the guard's check and the append ------------------------


class _Yes:
    """The coordinator's answer: the partition is in the producer's ongoing transaction."""

    async def verify(
        self, _txn_id: str, _pid: int, _epoch: int, tps: list[Any], add: bool = False
    ) -> dict[Any, ErrorCode]:
        return {tp: ErrorCode.NONE for tp in tps}


def _produce_context(owned: OwnedPartition, key: bytes | None = b"k") -> tuple[Any, Any]:
    """A Produce v9 request of one gzip'd transactional batch for ``owned`` (a compacted topic,
    so its keys are read in the decode pool), and the context that serves it."""
    builder = DefaultRecordBatchBuilder(2, 1, True, PID, 3, 0, 1 << 20)
    builder.append(0, timestamp=None, key=key, value=bytes(1000), headers=[])
    batch = bytes(builder.build())
    assert read_header(batch).compression == 1  # gzip'd: its records are read in the pool
    partition = SimpleNamespace(index=TP[1], records=batch)
    request = SimpleNamespace(
        transactional_id="app", topic_data=[SimpleNamespace(name=TP[0], partition_data=[partition])]
    )

    async def owned_partition(_tp: tuple[str, int]) -> OwnedPartition:
        return owned

    topic = TopicInfo(TP[0], "id", 1, {"cleanup.policy": "compact"})
    broker = SimpleNamespace(
        settings=BrokerSettings(),
        view=SimpleNamespace(acls=AclCache(), topics={TP[0]: topic}),
        log_manager=SimpleNamespace(owned_partition=owned_partition, appended=lambda _o: None),
        transactions=SimpleNamespace(
            verifier=_Yes(), settings=SimpleNamespace(partition_verification=True)
        ),
    )
    header = RequestHeader(0, 9, 1, "test")
    return request, RequestContext(header, broker, Connection("127.0.0.1:5000"))  # type: ignore[arg-type]


async def _append_with_a_marker_while_decoding(
    request: Any, ctx: Any, owned: OwnedPartition
) -> dict[Any, Any]:
    """Serve ``request`` with an abort marker for ``PID`` reaching ``owned`` while the request's
    batch is parked on the decode pool (both its workers held busy until the marker is in)."""
    release = threading.Event()
    started = [threading.Event() for _ in range(2)]

    def block(started: threading.Event) -> None:
        started.set()
        release.wait(60)

    blockers = [produce._DECODERS.submit(block, event) for event in started]
    try:
        # Both workers busy first: until a worker takes its blocker, the blocker itself is what
        # the queue holds, and the marker would come before the batch was even verified.
        assert all(event.wait(60) for event in started)
        task = asyncio.ensure_future(produce._append_all(request, ctx))
        deadline = asyncio.get_running_loop().time() + 60
        while produce._DECODERS._work_queue.qsize() == 0:  # parked on the decode pool
            assert not task.done(), task.result()
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        owned.append_marker(PID, 3, commit=False, coordinator_epoch=1, now_ms=0)
    finally:
        release.set()
    for blocker in blockers:
        blocker.result(timeout=60)
    return await asyncio.wait_for(task, 60)


async def test_an_abort_while_a_verified_batch_is_decoded_refuses_the_batch() -> None:
    """Fails on the old main: Produce checked the partition's guard, then read the batch's
    records in the decode pool (a compressed batch of a compacted topic: its keys), then
    appended. An abort marker that came while the records were read found no guard to void,
    and the late batch opened a transaction no marker would ever end (the LSO stuck). The
    records are now read before the guard is checked, and the check and the append are one
    step of the event loop, as KIP-890 needs."""
    owned = _partition()
    request, ctx = _produce_context(owned)
    outcomes = await _append_with_a_marker_while_decoding(request, ctx, owned)
    assert _codes(outcomes) == {TP: ErrorCode.INVALID_TXN_STATE}
    assert PID not in owned.open_txns  # no transaction left open on the partition
    assert [batch.base_offset for batch in owned.pending] == [10]  # the marker, not the batch


async def test_a_batch_of_a_transaction_aborted_on_its_way_is_refused() -> None:
    """Fails on the old main: a batch continuing a transaction open on the partition needed no
    verification, and nothing looked again at the append; the coordinator's abort (a timeout)
    that came while the batch's records were read left the batch to open a new transaction no
    marker would ever end. Kafka refuses such a batch (neither ongoing nor verified)."""
    owned = _partition()
    opened = owned.append(b"x" * 70, _txn_header())  # the transaction's first batch
    request, ctx = _produce_context(owned)
    outcomes = await _append_with_a_marker_while_decoding(request, ctx, owned)
    assert _codes(outcomes) == {TP: ErrorCode.INVALID_TXN_STATE}
    assert PID not in owned.open_txns
    assert len(owned.pending) == 2  # the first batch and the abort marker, not the late batch
    opened.cancel()


async def test_a_verified_batch_refused_by_the_topic_rules_leaves_no_guard_behind() -> None:
    """The rules are now checked before the guard is: a batch they refuse (a keyless record
    on a compacted topic) drops its guard instead of leaving it until the producer's next
    marker."""
    owned = _partition()
    request, ctx = _produce_context(owned, key=None)
    outcomes = await produce._append_all(request, ctx)
    assert isinstance(outcomes[TP], produce.Refusal)
    assert owned.verifying == {} and owned.pending == []


# --- the produce path: a batch never joins a transaction the coordinator does not know --------


def _request(epoch: int, partitions: list[int]) -> Any:
    """A Produce request of one transactional batch of ``PID`` at ``epoch`` per partition."""
    builder = DefaultRecordBatchBuilder(2, 0, True, PID, epoch, 0, 1 << 20)
    builder.append(0, timestamp=None, key=b"k", value=b"v", headers=[])
    batch = bytes(builder.build())
    data = [SimpleNamespace(index=p, records=batch) for p in partitions]
    return SimpleNamespace(
        transactional_id="app", topic_data=[SimpleNamespace(name=TP[0], partition_data=data)]
    )


class _Recorder(_Yes):
    """Says yes, and runs ``during`` while the coordinator is being asked."""

    def __init__(self, during: Any = None) -> None:
        self.asked: list[list[Any]] = []
        self._during = during

    async def verify(
        self, _txn_id: str, _pid: int, _epoch: int, tps: list[Any], add: bool = False
    ) -> dict[Any, ErrorCode]:
        self.asked.append(list(tps))
        if self._during is not None:
            self._during()
        return {tp: ErrorCode.NONE for tp in tps}


def _context(
    owned_by_tp: dict[Any, OwnedPartition], verifier: Any, version: int = 12
) -> RequestContext:
    async def owned_partition(tp: tuple[str, int]) -> OwnedPartition:
        owned = owned_by_tp.get(tp)
        if owned is None:
            raise NotLeader(f"{tp} is owned by broker 2")
        return owned

    topic = TopicInfo(TP[0], "id", 2, {})
    broker = SimpleNamespace(
        settings=BrokerSettings(),
        view=SimpleNamespace(acls=AclCache(), topics={TP[0]: topic}),
        log_manager=SimpleNamespace(owned_partition=owned_partition, appended=lambda _o: None),
        transactions=SimpleNamespace(
            verifier=verifier, settings=SimpleNamespace(partition_verification=True)
        ),
    )
    header = RequestHeader(0, version, 1, "test")
    return RequestContext(header, broker, Connection("127.0.0.1:5000"))  # type: ignore[arg-type]


async def test_a_partition_claimed_while_the_request_was_verified_is_not_appended_unverified() -> (
    None
):
    """Fails on the old main (the stuck LSO of bench/chaos_txn.py --via-proxy): a request for
    two partitions (the proxy sends one per owner) reached a broker that did not own one of
    them yet: that one was skipped by the check ("refused by the append"), the other verified;
    meanwhile the broker took the first one over (claimed on demand, or assigned), and the
    append wrote its batch unverified, never added to the transaction: no marker ever ended
    it, and the producer's later transactions continued it."""
    owned, other = _partition(), dataclasses.replace(_partition(), partition=1)
    owners: dict[Any, OwnedPartition] = {OTHER: other}
    verifier = _Recorder(during=lambda: owners.update({TP: owned}))  # taken over meanwhile
    outcomes = await produce._append_all(_request(3, [0, 1]), _context(owners, verifier))
    assert verifier.asked == [[OTHER]]
    assert _codes(outcomes)[TP] == ErrorCode.NOT_LEADER_OR_FOLLOWER  # the client routes it again
    assert owned.pending == [] and owned.open_txns == {}
    assert PID in other.open_txns
    for outcome in outcomes.values():
        if isinstance(outcome, asyncio.Future):
            outcome.cancel()


@pytest.mark.parametrize(
    ("version", "code"),
    [(12, ErrorCode.CONCURRENT_TRANSACTIONS), (9, ErrorCode.NOT_ENOUGH_REPLICAS)],
)
async def test_a_newer_epochs_batch_does_not_continue_the_open_transaction(
    version: int, code: ErrorCode
) -> None:
    """Fails on the old main: the producer's epoch-3 transaction is open here (its marker not
    written yet: a v2 EndTxn answers before every marker is in), and its next transaction's
    batch (epoch 4) was taken as continuing it, unverified: never added to the epoch-4
    transaction, and ended by the epoch-3 marker with that transaction's outcome. It is now
    refused as retriable, until the marker closes the older transaction."""
    owned = _partition()
    opened = owned.append(b"x" * 70, _txn_header())  # epoch 3, open
    verifier = _Recorder()
    outcomes = await produce._append_all(_request(4, [0]), _context({TP: owned}, verifier, version))
    assert _codes(outcomes) == {TP: code}
    assert verifier.asked == []
    assert len(owned.pending) == 1
    owned.append_marker(PID, 4, commit=True, coordinator_epoch=1, now_ms=0)  # the marker comes
    outcomes = await produce._append_all(_request(4, [0]), _context({TP: owned}, verifier, version))
    assert verifier.asked == [[TP]]  # now verified (added) as its transaction's first batch
    assert isinstance(outcomes[TP], asyncio.Future)
    assert owned.open_txns == {PID: 12}  # the first batch (10), the marker (11), this one
    outcomes[TP].cancel()
    opened.cancel()
