"""The per-partition codes a Fetch or ShareFetch answer carries are ones consumers handle.

The Java consumer (kafka-clients 4.3.0, ``FetchCollector.handleInitializeErrors`` and
``ShareFetchCollector.handleInitializeErrors``, read from the jar's bytecode) knows the codes in
``FETCH_PARTITION_CODES`` and throws IllegalStateException("Unexpected error code N while
fetching ...") out of poll() on any other. The broker answered REQUEST_TIMED_OUT when etcd did
not answer a non-owner's read; ``tests/integration/test_fetch_outage_clients.py`` runs the
clients through that."""

from __future__ import annotations

import pytest

from kafscale.broker.protocol.errors import (
    FETCH_PARTITION_CODES,
    ErrorCode,
    fetch_partition_code,
)

# What the Java consumer's handleInitializeErrors tests for, in its order (kafka-clients 4.3.0).
JAVA_FETCH_CODES = (6, 9, 56, 74, 78, 3, 100, 103, 1, 29, 75, -1, 2)


def test_the_codes_passed_through_are_the_ones_the_java_consumer_handles() -> None:
    assert {int(c) for c in FETCH_PARTITION_CODES} == {0, *JAVA_FETCH_CODES}


@pytest.mark.parametrize("code", sorted(FETCH_PARTITION_CODES))
def test_a_code_consumers_handle_is_answered_as_it_is(code: ErrorCode) -> None:
    assert fetch_partition_code(code) is code


def test_an_etcd_timeout_is_answered_as_a_storage_error_every_client_retries() -> None:
    assert fetch_partition_code(ErrorCode.REQUEST_TIMED_OUT) is ErrorCode.KAFKA_STORAGE_ERROR


@pytest.mark.parametrize("code", sorted(set(ErrorCode) - FETCH_PARTITION_CODES))
def test_every_other_code_becomes_one_the_java_consumer_handles(code: ErrorCode) -> None:
    assert fetch_partition_code(code) in FETCH_PARTITION_CODES
    assert fetch_partition_code(code) is ErrorCode.KAFKA_STORAGE_ERROR


@pytest.mark.parametrize("version", range(6))
def test_fetch_v0_to_v5_get_not_leader_where_later_versions_get_a_storage_error(
    version: int,
) -> None:
    """As Kafka answers them (KafkaApis' maybeDownConvertStorageError): KAFKA_STORAGE_ERROR is
    a code of Fetch v6+, and a client of an older version may take it for a fatal one."""
    for code in (ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.REQUEST_TIMED_OUT):
        assert fetch_partition_code(code, version) is ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert fetch_partition_code(code, 6) is ErrorCode.KAFKA_STORAGE_ERROR
    assert fetch_partition_code(ErrorCode.OFFSET_OUT_OF_RANGE, version) is (
        ErrorCode.OFFSET_OUT_OF_RANGE
    )
