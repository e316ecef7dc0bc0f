"""Every served API's error body (``api/error_bodies.py``) makes a response the codec encodes,
at every served version, for a request with every field set: the broker's dispatcher and the
proxy answer a failed request with it, and one that cannot be encoded closes the client's
connection instead (``api/dispatch.py:encode_error``)."""

from __future__ import annotations

import pytest
from harness.kafka_wire import sample_body

from kafscale.broker.api.error_bodies import ERROR_BODIES, error_body_of
from kafscale.broker.api.served import SERVED_APIS
from kafscale.broker.protocol import codec
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.unit

CASES = [
    (api.key, version)
    for api in SERVED_APIS.values()
    for version in range(api.min_version, api.max_version + 1)
]


def test_error_bodies_are_only_for_served_apis() -> None:
    assert set(ERROR_BODIES) <= set(SERVED_APIS)


@pytest.mark.parametrize(("api_key", "version"), CASES)
def test_the_error_body_encodes(api_key: int, version: int) -> None:
    schema = codec.request_schema(api_key, version)
    request = codec.build_entity(schema, sample_body(schema))
    body = error_body_of(api_key)(request, ErrorCode.UNKNOWN_SERVER_ERROR)
    frame = codec.encode_response(api_key, version, 7, body)
    assert len(frame) > 8
