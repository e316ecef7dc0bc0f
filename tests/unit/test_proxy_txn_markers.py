"""WriteTxnMarkers through the proxy, the pure halves (``broker/proxy/txn_markers.py``): each
marker's partitions go to their owners and the answers come back in the client's order."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.protocol import codec
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.proxy import txn_markers
from kafscale.broker.proxy.upstream import ForwardingRefused, UpstreamError

pytestmark = pytest.mark.unit

REQUEST_V1 = codec.request_schema(27, 1)
RESPONSE_V1 = codec.response_schema(27, 1)

markers_st = st.lists(
    st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 5)),
        min_size=1,
        max_size=8,
        unique=True,
    ),
    min_size=1,
    max_size=4,
)


def request(markers: list[list[tuple[str, int]]]) -> Any:
    body = {
        "markers": [
            {
                "producer_id": 100 + index,
                "producer_epoch": 0,
                "transaction_result": index % 2 == 0,
                "topics": _topics(partitions),
                "coordinator_epoch": 7,
            }
            for index, partitions in enumerate(markers)
        ]
    }
    return codec.build_entity(REQUEST_V1, body)


def _topics(partitions: list[tuple[str, int]]) -> list[dict[str, Any]]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    return [{"name": t, "partition_indexes": ps} for t, ps in by_topic.items()]


def answer(part_request: Any, code_of: Any) -> bytes:
    """A broker's response frame body (correlation id first) to its part."""
    body = {
        "markers": [
            {
                "producer_id": marker.producer_id,
                "topics": [
                    {
                        "name": topic.name,
                        "partitions": [
                            {"partition_index": p, "error_code": code_of(topic.name, p)}
                            for p in topic.partition_indexes
                        ],
                    }
                    for topic in marker.topics
                ],
            }
            for marker in part_request.markers
        ]
    }
    return codec.encode_response(27, 1, 0, body)[4:]


def route(tp: tuple[str, int]) -> int:
    return -1 if tp == ("b", 5) else (len(tp[0]) + tp[1]) % 3


@given(markers_st)
def test_every_marker_partition_reaches_its_owner_and_is_answered_in_order(
    markers: list[list[tuple[str, int]]],
) -> None:
    req = request(markers)
    sent: dict[int, Any] = {}

    async def send(parts: list[tuple[int, Any]]) -> list[asyncio.Future[bytes]]:
        loop = asyncio.get_running_loop()
        futures = []
        for broker, part in parts:
            decoded = codec.decode_request(bytes(part), REQUEST_V1).body
            sent[broker] = decoded
            future: asyncio.Future[bytes] = loop.create_future()
            future.set_result(answer(decoded, lambda t, p, b=broker: b))  # code: the broker
            futures.append(future)
        return futures

    def encode(body: Any) -> bytes:
        return codec.encode_request(27, 1, 0, body)[4:]

    merged = asyncio.run(txn_markers.forward_markers(send, encode, req, route, 1))
    for broker, part in sent.items():
        for marker in part.markers:
            assert marker.coordinator_epoch == 7
            for topic in marker.topics:
                assert all(route((topic.name, p)) == broker for p in topic.partition_indexes)
    assert len(merged["markers"]) == len(markers)
    for index, partitions in enumerate(markers):
        got = merged["markers"][index]
        assert got["producer_id"] == 100 + index
        flat = [
            (t["name"], p["partition_index"], p["error_code"])
            for t in got["topics"]
            for p in t["partitions"]
        ]
        expected_order = [
            (t["name"], p) for t in _topics(partitions) for p in t["partition_indexes"]
        ]
        assert [(t, p) for t, p, _ in flat] == expected_order
        for topic, partition, code in flat:
            owner = route((topic, partition))
            assert code == (owner if owner >= 0 else ErrorCode.NOT_LEADER_OR_FOLLOWER)


def test_an_unreachable_or_refusing_owner_answers_for_its_partitions() -> None:
    req = request([[("a", 0), ("a", 1), ("a", 2)]])
    parts = txn_markers.split_markers(req, lambda tp: tp[1])
    results = {
        **txn_markers.outcome_results(parts[0], UpstreamError("gone"), 1),
        **txn_markers.outcome_results(parts[1], ForwardingRefused(ErrorCode.NONE), 1),
        **txn_markers.outcome_results(parts[2], answer(parts[2].request, lambda t, p: 0), 1),
    }
    merged = txn_markers.merge_markers(req, results)
    codes = [p["error_code"] for p in merged["markers"][0]["topics"][0]["partitions"]]
    assert codes == [
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
        ErrorCode.NONE,
    ]
