"""What the broker's boto3 client puts on the wire for a segment upload.

The request is captured at botocore's ``before-send`` hook, after signing, and answered there,
so no server is involved: these are the headers S3 (or radosgw, or moto) would receive.
"""

from __future__ import annotations

from typing import Any

import pytest
from botocore.awsrequest import AWSPreparedRequest, AWSResponse
from pydantic import SecretStr

import kafscale
from kafscale.broker.config import StorageKind, StorageSettings
from kafscale.broker.storage.s3 import build_client

pytestmark = pytest.mark.unit


class _RawOk:
    def stream(self, **_: Any) -> Any:
        yield b""


def _captured_put(endpoint: str) -> AWSPreparedRequest:
    settings = StorageSettings(
        kind=StorageKind.S3,
        bucket="segments",
        endpoint=endpoint,
        access_key_id=SecretStr("key"),
        secret_access_key=SecretStr("secret"),
    )
    client = build_client(settings)
    seen: list[AWSPreparedRequest] = []

    def answer(request: AWSPreparedRequest, **_: Any) -> AWSResponse:
        seen.append(request)
        return AWSResponse(request.url, 200, {}, _RawOk())

    client.meta.events.register("before-send.s3.PutObject", answer)
    client.put_object(Bucket="segments", Key="a/b.kfs", Body=b"x" * 4096)
    return seen[0]


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:9", "https://s3.example.test"])
def test_segment_bodies_are_not_hashed_for_the_signature(endpoint: str) -> None:
    """Hashing each multi-MiB body with SHA-256 cost a third of a segment PUT's CPU; segments
    and batches carry their own CRC32C."""
    request = _captured_put(endpoint)
    assert request.headers["x-amz-content-sha256"] == b"UNSIGNED-PAYLOAD"
    assert b"Signature=" in request.headers["Authorization"]


def test_no_flexible_checksum_trailer_is_sent() -> None:
    """aws-chunked trailers are refused by some S3-compatible servers: plain bodies only."""
    request = _captured_put("https://s3.example.test")
    headers = {k.lower(): v for k, v in request.headers.items()}
    assert "content-encoding" not in headers
    assert not any(name.startswith("x-amz-checksum") for name in headers)
    assert "x-amz-trailer" not in headers


def test_requests_name_kafscale_in_the_user_agent() -> None:
    """Operators find the broker's requests in the store's access logs by this name."""
    request = _captured_put("https://s3.example.test")
    agent = request.headers["User-Agent"]
    agent = agent.decode() if isinstance(agent, bytes) else agent
    assert agent.startswith(f"kafscale/{kafscale.__version__} botocore/")
