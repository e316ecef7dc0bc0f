"""``unreachable_reason``: what went wrong reaching an etcd member, in a few words; and
``translate_error``'s message, one line.

The texts are the ones gRPC 1.x and aetcd gave here (a closed loopback port, an ``.invalid``
host name, a server that never answered, a port served by something else); the integration
tests (``test_etcd_unreachable_message``) check the refused and silent cases end to end.
"""

from __future__ import annotations

import aetcd
import pytest
from aetcd import rpc

from kafscale.broker.metadata.etcd_errors import (
    MetadataError,
    MetadataUnavailable,
    translate_error,
    unreachable_reason,
)


def failed(text: str) -> MetadataError:
    """Our error raised from aetcd's, as ``Etcd._call_here`` raises it."""
    try:
        try:
            raise aetcd.ConnectionFailedError(text)
        except aetcd.ConnectionFailedError as cause:
            raise MetadataUnavailable(f"etcd range at http://e:2379 failed: {text}") from cause
    except MetadataUnavailable as error:
        return error


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
            "Failed to connect to remote host: Connection refused",
            "connection refused",
        ),
        (
            "errors resolving no-such-host.invalid:2379: [field:hostname lookup error:address "
            "lookup failed for no-such-host.invalid:2379: Domain name not found]",
            "host name not resolved",
        ),
        ("DNS resolution failed for etcd-0.etcd:2379", "host name not resolved"),
        ("Deadline Exceeded", "no answer within 5 s"),
        ("etcdserver: authentication failed, invalid user ID or password", "authentication failed"),
        ("Received http2 header with status: 404", "Received http2 header with status: 404"),
    ],
)
def test_grpc_texts_become_a_few_words(text: str, reason: str) -> None:
    assert unreachable_reason(failed(text), 5) == reason


def test_our_own_timeout_is_no_answer_within_it() -> None:
    try:
        try:
            raise TimeoutError
        except TimeoutError as cause:
            raise MetadataUnavailable("etcd range timed out after 2.5 s at http://e") from cause
    except MetadataUnavailable as error:
        assert unreachable_reason(error, 2.5) == "no answer within 2.5 s"


def test_an_unknown_text_is_kept_on_one_line_and_bounded() -> None:
    reason = unreachable_reason(failed("first line\n\tsecond " + "x" * 500), 5)
    assert reason.startswith("first line second x") and "\n" not in reason
    assert len(reason) == 200


def test_a_grpc_error_is_one_line_of_what_etcd_said() -> None:
    """gRPC's own error (not wrapped by aetcd) prints as five lines; a log line about a
    refused read read as a block of them."""
    refused = rpc.AioRpcError(
        rpc.StatusCode.PERMISSION_DENIED,
        None,
        None,
        details="etcdserver: permission denied",
        debug_error_string="PERMISSION_DENIED:etcdserver: permission denied",
    )
    translated = translate_error(refused, "range at http://e:2379")
    assert type(translated) is MetadataError  # a refusal, not an outage
    assert str(translated) == "etcd range at http://e:2379 failed: etcdserver: permission denied"
