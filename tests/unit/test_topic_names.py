"""Metadata's answer for a topic that does not exist tells a name that could never exist
(INVALID_TOPIC_EXCEPTION: clients give up at once) from one not created yet (retriable
UNKNOWN_TOPIC_OR_PARTITION), with the rule CreateTopics applies to names."""

from __future__ import annotations

import pytest

from kafscale.broker.metadata.topics import missing_topic_error, validate_topic_name
from kafscale.broker.protocol.errors import ErrorCode, KafkaError

INVALID = ["bad)(*&^%", "", ".", "..", "a" * 250, "with space", "slash/ed", "ü"]
VALID = ["orders", "a", "a" * 249, "A.b_c-9", "..."]


@pytest.mark.parametrize("name", INVALID)
def test_a_name_that_can_never_exist_is_an_invalid_topic(name: str) -> None:
    assert missing_topic_error(name) is ErrorCode.INVALID_TOPIC_EXCEPTION
    with pytest.raises(KafkaError):
        validate_topic_name(name)  # and CreateTopics refuses it by the same rule


@pytest.mark.parametrize("name", VALID)
def test_a_valid_name_not_created_yet_is_an_unknown_topic(name: str) -> None:
    assert missing_topic_error(name) is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    validate_topic_name(name)
