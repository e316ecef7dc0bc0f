"""KIP-890: a partition owner asks the transaction coordinator before a transactional
producer's batch opens a transaction on a partition (part 1), or adds the partition to the
transaction itself (part 2, transaction protocol v2: Produce v12+, where the producer sends no
AddPartitionsToTxn); a group coordinator adds the group for TxnOffsetCommit v5 the same way.

Without the check, a batch that arrives late (after its transaction was aborted, or one a
producer sent without AddPartitionsToTxn) would open a transaction on the partition that no
marker will ever close: a *hanging transaction*, which holds the last stable offset, and with it
every ``read_committed`` consumer, until an operator aborts it. With it, the owner sends the
coordinator AddPartitionsToTxn v4 with ``verify_only`` (or asks its own coordinator when the
transactional id is coordinated here) and refuses the batch with INVALID_TXN_STATE unless the
partition is in the producer's ongoing transaction. Only a batch that would open a transaction
pays the round trip: later batches of the transaction find it open on the partition.

Errors as Kafka's ReplicaManager translates them for Produce: a coordinator that cannot answer
(NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, a network failure, and CONCURRENT_TRANSACTIONS
before v2) becomes NOT_ENOUGH_REPLICAS, which every client retries without a metadata refresh;
never an accept.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, Protocol

from kafscale.broker.metadata.cluster import BrokerInfo
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.observability.retry_log import reason
from kafscale.broker.protocol.errors import ErrorCode, KafkaError
from kafscale.broker.transactions.inter_broker_client import InterBrokerClient
from kafscale.broker.transactions.state import TopicPartition

log = logging.getLogger(__name__)

ADD_PARTITIONS_TO_TXN = 24
VERIFY_VERSION = 4  # the batched broker form, with verify_only
ADD_OFFSETS_TO_TXN, ADD_OFFSETS_VERSION = 25, 4

RETRIABLE = frozenset(
    {
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.CONCURRENT_TRANSACTIONS,
    }
)


def produce_error(code: ErrorCode, transaction_v2: bool = False) -> ErrorCode:
    """The code a Produce partition gets for a failed verification (Kafka's translation): v2
    clients know CONCURRENT_TRANSACTIONS on Produce (a commit still being completed)."""
    if code is ErrorCode.CONCURRENT_TRANSACTIONS and transaction_v2:
        return code
    if code in RETRIABLE:
        return ErrorCode.NOT_ENOUGH_REPLICAS
    if code is ErrorCode.PRODUCER_FENCED:
        return ErrorCode.INVALID_PRODUCER_EPOCH  # what Produce answers a fenced producer
    return code


def request_body(
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    asked: Iterable[TopicPartition],
    verify_only: bool = True,
) -> dict[str, Any]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(asked):
        by_topic.setdefault(topic, []).append(partition)
    return {
        "transactions": [
            {
                "transactional_id": transactional_id,
                "producer_id": producer_id,
                "producer_epoch": producer_epoch,
                "verify_only": verify_only,
                "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()],
            }
        ]
    }


def response_codes(
    response: Any, asked: Iterable[TopicPartition]
) -> dict[TopicPartition, ErrorCode]:
    """Each asked partition's code; one the response does not mention failed (retriable)."""
    codes = dict.fromkeys(asked, ErrorCode.NETWORK_EXCEPTION)
    top = _code(response.error_code)
    if top is not ErrorCode.NONE:
        return dict.fromkeys(codes, top)
    for txn in response.results_by_transaction:
        for topic in txn.topic_results:
            for part in topic.results_by_partition:
                tp = (str(topic.name), int(part.partition_index))
                if tp in codes:
                    codes[tp] = _code(part.partition_error_code)
    return codes


def _code(value: Any) -> ErrorCode:
    try:
        return ErrorCode(int(value))
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR


class Coordinator(Protocol):
    """What the verifier needs from this broker's transaction coordinator."""

    def coordinator_for(self, transactional_id: str) -> BrokerInfo | None: ...

    async def verify(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]: ...

    async def add(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition] = (),
        groups: Iterable[str] = (),
    ) -> ErrorCode: ...


class PartitionVerifier:
    def __init__(self, coordinator: Coordinator, client: InterBrokerClient, node_id: int) -> None:
        self._coordinator = coordinator
        self._client = client
        self._node_id = node_id

    async def verify(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        asked: list[TopicPartition],
        add: bool = False,
    ) -> dict[TopicPartition, ErrorCode]:
        """Per partition: NONE if it is in the producer's ongoing transaction (``add``: now
        added to it, beginning the transaction if none is ongoing), else the code Produce
        answers (see ``produce_error``)."""
        codes = await self._ask(transactional_id, producer_id, producer_epoch, asked, add)
        return {tp: produce_error(code, add) for tp, code in codes.items()}

    async def add_group(
        self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str
    ) -> ErrorCode:
        """TxnOffsetCommit v5's implicit AddOffsetsToTxn, at the transaction's coordinator."""
        chosen = self._coordinator.coordinator_for(transactional_id)
        if chosen is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        try:
            if chosen.node_id == self._node_id:
                return await self._coordinator.add(
                    transactional_id, producer_id, producer_epoch, groups=[group_id]
                )
            body = {
                "transactional_id": transactional_id,
                "producer_id": producer_id,
                "producer_epoch": producer_epoch,
                "group_id": group_id,
            }
            async with asyncio.timeout(self._client.timeout_s):
                response = await self._client.call(
                    chosen, ADD_OFFSETS_TO_TXN, ADD_OFFSETS_VERSION, body
                )
        except MetadataUnavailable:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        except KafkaError as exc:
            return exc.code
        except Exception as exc:  # unreachable, timed out, connection closed
            log.warning(
                "cannot add a group to a transaction at broker %d: %s", chosen.node_id, reason(exc)
            )
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return _code(response.error_code)

    async def _ask(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        asked: list[TopicPartition],
        add: bool,
    ) -> dict[TopicPartition, ErrorCode]:
        chosen = self._coordinator.coordinator_for(transactional_id)
        if chosen is None:
            return dict.fromkeys(asked, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        try:
            if chosen.node_id == self._node_id:
                return await self._ask_here(
                    transactional_id, producer_id, producer_epoch, asked, add
                )
            async with asyncio.timeout(self._client.timeout_s):
                response = await self._client.call(
                    chosen,
                    ADD_PARTITIONS_TO_TXN,
                    VERIFY_VERSION,
                    request_body(
                        transactional_id, producer_id, producer_epoch, asked, verify_only=not add
                    ),
                )
        except MetadataUnavailable:
            return dict.fromkeys(asked, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        except KafkaError as exc:
            return dict.fromkeys(asked, exc.code)
        except Exception as exc:  # unreachable, timed out, connection closed
            log.warning("cannot verify a transaction at broker %d: %s", chosen.node_id, reason(exc))
            return dict.fromkeys(asked, ErrorCode.NETWORK_EXCEPTION)
        return response_codes(response, asked)

    async def _ask_here(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        asked: list[TopicPartition],
        add: bool,
    ) -> dict[TopicPartition, ErrorCode]:
        if not add:
            return await self._coordinator.verify(
                transactional_id, producer_id, producer_epoch, asked
            )
        code = await self._coordinator.add(
            transactional_id, producer_id, producer_epoch, partitions=asked
        )
        return dict.fromkeys(asked, code)
