"""The proxy's pure splitting and merging of partitioned requests (``broker/proxy/split.py``)
and its Metadata leader choice (``broker/proxy/answers.py``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.protocol import codec
from kafscale.broker.proxy import split
from kafscale.broker.proxy.answers import Identity, leader_id

pytestmark = pytest.mark.unit

PRODUCE_V9 = codec.request_schema(0, 9)
PRODUCE_RESPONSE_V9 = codec.response_schema(0, 9)

partitions_st = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 7), st.binary(max_size=16)),
    min_size=1,
    max_size=20,
    unique_by=lambda item: (item[0], item[1]),
)


def produce_request(items: list[tuple[str, int, bytes]]) -> object:
    topics: dict[str, list[dict[str, object]]] = {}
    for topic, partition, records in items:
        topics.setdefault(topic, []).append({"index": partition, "records": records})
    body = {
        "acks": -1,
        "timeout": 30_000,
        "topic_data": [{"name": t, "partition_data": ps} for t, ps in topics.items()],
    }
    return codec.build_entity(PRODUCE_V9, body)


@given(partitions_st, st.integers(1, 4))
def test_split_then_merge_keeps_every_partition_in_the_clients_order(
    items: list[tuple[str, int, bytes]], brokers: int
) -> None:
    request = produce_request(items)
    order = split.requested_partitions(request, split.PRODUCE)

    def route(tp: tuple[str, int]) -> int:
        return (hash(tp[0]) + tp[1]) % brokers

    parts = split.split_request(request, split.PRODUCE, route)
    seen: dict[tuple[str, int], bytes] = {}
    for broker, part in parts.items():
        for topic in part.topic_data:
            for p in topic.partition_data:
                assert route((topic.name, p.index)) == broker
                seen[(topic.name, p.index)] = p.records
        # within a broker's part, partitions keep the client's relative order
        part_order = split.requested_partitions(part, split.PRODUCE)
        assert part_order == [tp for tp in order if route(tp) == broker]
    assert seen == {(t, p): r for t, p, r in items}  # record batches untouched

    answers = {
        tp: {"index": tp[1], "error_code": 0, "base_offset": i} for i, tp in enumerate(order)
    }
    merged = split.merge_response(split.PRODUCE, order, answers)
    response = codec.build_entity(PRODUCE_RESPONSE_V9, merged)
    got = [
        ((t.name, p.index), p.base_offset)
        for t in response.responses
        for p in t.partition_responses
    ]
    assert sorted(got, key=lambda g: g[1]) == [(tp, i) for i, tp in enumerate(order)]


def test_only_keeps_the_named_partitions() -> None:
    request = produce_request([("a", 0, b"x"), ("a", 1, b"y"), ("b", 0, b"z")])
    parts = split.split_request(request, split.PRODUCE, lambda tp: 7, only=[("a", 1)])
    assert split.requested_partitions(parts[7], split.PRODUCE) == [("a", 1)]


def test_error_codes_are_read_from_every_level_of_a_parsed_response() -> None:
    body = split.merge_response(
        split.PRODUCE,
        [("a", 0), ("a", 1)],
        {
            ("a", 0): {"index": 0, "error_code": 0},
            ("a", 1): split.partition_error(split.PRODUCE, 1, 6),
        },
    )
    response = codec.build_entity(PRODUCE_RESPONSE_V9, body)
    assert sorted(split.error_codes(response)) == [0, 6]


def test_metadata_names_the_proxy_or_the_owner_as_leader() -> None:
    one = Identity(1000, "proxy", 9092, "c")
    owners = Identity(1000, "proxy", 9092, "c", expose_owners=True)
    assert (leader_id(3, one), leader_id(-1, one)) == (1000, -1)
    assert (leader_id(3, owners), leader_id(-1, owners)) == (3, -1)
