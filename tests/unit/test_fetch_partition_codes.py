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
