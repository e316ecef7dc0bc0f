"""UpdateFeatures' decision (``api/feature_updates.py``): Kafka's checks in Kafka's order, then
the fixed level."""

from __future__ import annotations

from kafscale.broker.api.feature_updates import (
    SAFE_DOWNGRADE,
    UNSAFE_DOWNGRADE,
    UPGRADE,
    decide_update,
    first_refusal,
)
from kafscale.broker.protocol.errors import ErrorCode

FINALIZED = {"transaction.version": 2, "share.version": 1}


def reason(feature: str, level: int, upgrade_type: int = UPGRADE) -> str | None:
    refusal = decide_update(feature, level, upgrade_type, FINALIZED, 7)
    if refusal is None:
        return None
    code, message = refusal
    assert code is ErrorCode.INVALID_UPDATE_VERSION
    prefix = f"Invalid update version {level} for feature {feature}. "
    assert message.startswith(prefix)
    return message[len(prefix) :]


def test_the_level_a_feature_has_is_accepted_whatever_the_upgrade_type() -> None:
    for upgrade_type in (UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE):
        assert reason("share.version", 1, upgrade_type) is None
        assert reason("transaction.version", 2, upgrade_type) is None
    assert reason("no.such.version", 0) is None  # level 0 of a feature nobody finalized


def test_kafkas_checks_come_first_in_kafkas_order() -> None:
    assert (
        reason("share.version", 1, 9) == "The controller does not support the given upgrade type."
    )
    assert reason("share.version", -1) == "A feature version cannot be less than 0."
    assert reason("share.version", 2) == "Local controller 7 only supports versions 0-1"
    assert reason("no.such.version", 1) == "Local controller 7 does not support this feature."
    assert reason("share.version", 0) == (
        "Can't downgrade the version of this feature without setting the upgrade type to "
        "either safe or unsafe downgrade."
    )
    assert reason("transaction.version", 3, SAFE_DOWNGRADE) == (
        "Local controller 7 only supports versions 0-2"
    )


def test_a_supported_level_other_than_the_finalized_one_is_refused() -> None:
    message = reason("share.version", 0, SAFE_DOWNGRADE)
    assert message is not None and "cannot be changed at run time" in message
    message = reason("transaction.version", 1, UNSAFE_DOWNGRADE)
    assert message is not None and "transactions.protocol_version" in message
    low = {"transaction.version": 1, "share.version": 1}
    assert decide_update("transaction.version", 2, UPGRADE, low, 7) is not None


def test_the_first_refused_update_fails_the_request() -> None:
    updates = [("share.version", 1, UPGRADE), ("share.version", 4, UPGRADE), ("x", 1, UPGRADE)]
    refusal = first_refusal(updates, FINALIZED, 7)
    assert refusal is not None and "version 4 for feature share.version" in refusal[1]
    assert first_refusal(updates[:1], FINALIZED, 7) is None
