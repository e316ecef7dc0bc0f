"""How the proxy reads its brokers' Fetch answers (``broker/proxy/fetch.py``): a partition a
broker left out, or answered UNKNOWN_SERVER_ERROR, is asked of another broker, and if no answer
comes the client gets a retriable code. kafka-python raises UNKNOWN_SERVER_ERROR on a fetch to
the user ("Unexpected error while fetching data"); a broker restarting must never cause it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kafscale.broker.api.fetch_sessions import FetchPosition
from kafscale.broker.protocol import codec
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.proxy.fetch import Wanted, record_answer, trim_results

pytestmark = pytest.mark.unit

FETCH_RESPONSE_V11 = codec.response_schema(1, 11)


def wanted(*partitions: int) -> list[Wanted]:
    return [Wanted(("t", p), "t", FetchPosition(0, 1 << 20, -1)) for p in partitions]


def response(error_code: int, answers: dict[int, int]) -> Any:
    return codec.build_entity(
        FETCH_RESPONSE_V11,
        {
            "error_code": error_code,
            "responses": [
                {
                    "topic": "t",
                    "partitions": [
                        {
                            "partition_index": p,
                            "error_code": code,
                            "high_watermark": 5,
                            "records": b"",
                        }
                        for p, code in answers.items()
                    ],
                }
            ],
        },
    )


def test_every_partition_answered_needs_no_other_broker() -> None:
    results: dict[Any, Any] = {}
    assert record_answer(response(0, {0: 0, 1: 1}), wanted(0, 1), results) == set()
    assert {key: int(r.error_code) for key, r in results.items()} == {("t", 0): 0, ("t", 1): 1}


def test_a_partition_left_out_is_asked_again() -> None:
    results: dict[Any, Any] = {}
    assert record_answer(response(0, {0: 0}), wanted(0, 1), results) == {("t", 1)}


def test_a_request_level_error_asks_every_partition_again() -> None:
    results: dict[Any, Any] = {}
    unanswered = record_answer(response(ErrorCode.UNKNOWN_SERVER_ERROR, {}), wanted(0, 1), results)
    assert unanswered == {("t", 0), ("t", 1)}


def test_an_unknown_server_error_is_asked_of_another_broker() -> None:
    results: dict[Any, Any] = {}
    code = ErrorCode.UNKNOWN_SERVER_ERROR
    assert record_answer(response(0, {0: code, 1: 0}), wanted(0, 1), results) == {("t", 0)}


def test_a_partition_with_no_answer_gets_a_retriable_code() -> None:
    items = wanted(0, 1)
    results = {("t", 0): response(0, {0: 0}).responses[0].partitions[0]}
    ordered = trim_results(items, results, 1 << 20)
    assert [int(r.error_code if not isinstance(r, dict) else r["error_code"]) for r in ordered] == [
        ErrorCode.NONE,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ]


def _with_records(sizes: dict[int, int]) -> dict[Any, Any]:
    partitions = response(0, dict.fromkeys(sizes, 0)).responses[0].partitions
    return {
        ("t", p.partition_index): dataclasses.replace(p, records=b"x" * sizes[p.partition_index])
        for p in partitions
    }


def test_the_first_partition_with_records_is_kept_whole_past_max_bytes() -> None:
    """The first partition is read to its end (no records): the second's batch, larger than
    the response's max_bytes, still comes whole, or the client would never get past it."""
    ordered = trim_results(wanted(0, 1, 2), _with_records({0: 0, 1: 500, 2: 10}), 300)
    assert [len(r.records) for r in ordered] == [0, 500, 0]


def test_a_partition_cut_for_max_bytes_gets_empty_records_not_null() -> None:
    ordered = trim_results(wanted(0, 1), _with_records({0: 200, 1: 200}), 300)
    assert [r.records for r in ordered] == [b"x" * 200, b""]
