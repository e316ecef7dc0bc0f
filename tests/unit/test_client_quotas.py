"""Client quotas' pure parts: entities, precedence, filters, the token bucket, key layout."""

from __future__ import annotations

import pytest

from kafscale.broker.metadata import keys
from kafscale.broker.quotas.enforcement import QuotaEnforcer, fetched_bytes, user_of
from kafscale.broker.quotas.entities import (
    CLIENT_ID,
    CONSUMER_BYTE_RATE,
    MATCH_ANY,
    MATCH_DEFAULT,
    MATCH_EXACT,
    PRODUCER_BYTE_RATE,
    USER,
    Component,
    InvalidQuota,
    apply_ops,
    check_filter,
    filter_matches,
    make_entity,
    resolve,
)
from kafscale.broker.quotas.store import QuotaCache, decode, encode
from kafscale.broker.quotas.throttle import MAX_THROTTLE_MS, Bucket, Throttles, take

ALICE_APP = ((USER, "alice"), (CLIENT_ID, "app"))
ALICE_ANY_CLIENT = ((USER, "alice"), (CLIENT_ID, None))
ALICE = ((USER, "alice"),)
ANY_USER_APP = ((USER, None), (CLIENT_ID, "app"))
ANY_USER_ANY_CLIENT = ((USER, None), (CLIENT_ID, None))
ANY_USER = ((USER, None),)
APP = ((CLIENT_ID, "app"),)
ANY_CLIENT = ((CLIENT_ID, None),)
PRECEDENCE = [
    ALICE_APP,
    ALICE_ANY_CLIENT,
    ALICE,
    ANY_USER_APP,
    ANY_USER_ANY_CLIENT,
    ANY_USER,
    APP,
    ANY_CLIENT,
]


# --- entities and values ----------------------------------------------------------------------


def test_entity_is_canonical_user_first() -> None:
    assert make_entity([(CLIENT_ID, "app"), (USER, "alice")]) == ALICE_APP


@pytest.mark.parametrize(
    "parts",
    [[], [(USER, "a"), (USER, "b")], [("group", "g")], [("ip", "1.2.3.4")]],
)
def test_bad_entities_are_refused(parts: list[tuple[str, str | None]]) -> None:
    with pytest.raises(InvalidQuota):
        make_entity(parts)


def test_ops_set_and_remove_keys() -> None:
    current = {PRODUCER_BYTE_RATE: 100.0, CONSUMER_BYTE_RATE: 200.0}
    updated = apply_ops(current, [(PRODUCER_BYTE_RATE, 300, False), (CONSUMER_BYTE_RATE, 0, True)])
    assert updated == {PRODUCER_BYTE_RATE: 300.0}
    assert current == {PRODUCER_BYTE_RATE: 100.0, CONSUMER_BYTE_RATE: 200.0}


@pytest.mark.parametrize(
    "ops, words",
    [
        ([("producer_bytes_rate", 1, False)], "unknown quota key"),
        ([("request_percentage", 50, False)], "not supported"),
        ([("controller_mutation_rate", 5, False)], "not supported"),
        ([(PRODUCER_BYTE_RATE, -1, False)], "positive whole number"),
        ([(PRODUCER_BYTE_RATE, 1.5, False)], "positive whole number"),
        ([(PRODUCER_BYTE_RATE, float("nan"), False)], "positive whole number"),
        ([(PRODUCER_BYTE_RATE, 1, False), (PRODUCER_BYTE_RATE, 2, False)], "named twice"),
        ([("nonsense", 0, True)], "unknown quota key"),
    ],
)
def test_bad_ops_are_refused_with_a_message(ops: list[tuple[str, float, bool]], words: str) -> None:
    with pytest.raises(InvalidQuota, match=words):
        apply_ops({}, ops)


# --- precedence -------------------------------------------------------------------------------


@pytest.mark.parametrize("level", range(len(PRECEDENCE)))
def test_the_most_specific_entity_wins(level: int) -> None:
    """With quotas on every entity from ``level`` down, the one at ``level`` applies."""
    quotas = {entity: {PRODUCER_BYTE_RATE: float(i + 1)} for i, entity in enumerate(PRECEDENCE)}
    for entity in PRECEDENCE[:level]:
        del quotas[entity]
    resolved = resolve(quotas, PRODUCER_BYTE_RATE, "alice", "app")
    assert resolved is not None and resolved.limit == level + 1


def test_tags_say_who_shares_the_rate() -> None:
    """A named or default user quota is each user's own, shared by its clients."""
    for entity, tags in [
        (ALICE_APP, ("alice", "app")),
        (ANY_USER_ANY_CLIENT, ("alice", "app")),
        (ALICE, ("alice", "")),
        (ANY_USER, ("alice", "")),
        (ANY_CLIENT, ("", "app")),
    ]:
        resolved = resolve({entity: {PRODUCER_BYTE_RATE: 1.0}}, PRODUCER_BYTE_RATE, "alice", "app")
        assert resolved is not None and resolved.tags == tags


def test_each_key_resolves_on_its_own() -> None:
    quotas = {ALICE: {CONSUMER_BYTE_RATE: 5.0}, ANY_CLIENT: {PRODUCER_BYTE_RATE: 7.0}}
    produce = resolve(quotas, PRODUCER_BYTE_RATE, "alice", "app")
    fetch = resolve(quotas, CONSUMER_BYTE_RATE, "alice", "app")
    assert produce is not None and produce.limit == 7.0
    assert fetch is not None and fetch.limit == 5.0
    assert resolve(quotas, CONSUMER_BYTE_RATE, "bob", "app") is None


def test_other_users_and_clients_do_not_match() -> None:
    quotas = {ALICE_APP: {PRODUCER_BYTE_RATE: 1.0}, APP: {PRODUCER_BYTE_RATE: 2.0}}
    assert resolve(quotas, PRODUCER_BYTE_RATE, "bob", "other") is None
    bob = resolve(quotas, PRODUCER_BYTE_RATE, "bob", "app")
    assert bob is not None and bob.limit == 2.0


# --- filters ----------------------------------------------------------------------------------


def _c(entity_type: str, match_type: int, match: str | None = None) -> Component:
    return Component(entity_type, match_type, match)


@pytest.mark.parametrize(
    "components, strict, matched",
    [
        ([], False, PRECEDENCE),
        ([], True, []),
        ([_c(USER, MATCH_EXACT, "alice")], False, [ALICE_APP, ALICE_ANY_CLIENT, ALICE]),
        ([_c(USER, MATCH_EXACT, "alice")], True, [ALICE]),
        ([_c(USER, MATCH_DEFAULT)], False, [ANY_USER_APP, ANY_USER_ANY_CLIENT, ANY_USER]),
        ([_c(USER, MATCH_DEFAULT)], True, [ANY_USER]),
        ([_c(USER, MATCH_ANY)], True, [ALICE, ANY_USER]),
        ([_c(CLIENT_ID, MATCH_ANY)], True, [APP, ANY_CLIENT]),
        ([_c(CLIENT_ID, MATCH_EXACT, "app")], False, [ALICE_APP, ANY_USER_APP, APP]),
        (
            [_c(USER, MATCH_ANY), _c(CLIENT_ID, MATCH_DEFAULT)],
            True,
            [ALICE_ANY_CLIENT, ANY_USER_ANY_CLIENT],
        ),
        ([_c("ip", MATCH_ANY)], False, []),
    ],
)
def test_filters_match_as_kafka(
    components: list[Component], strict: bool, matched: list[tuple[object, ...]]
) -> None:
    check_filter(components)
    assert [e for e in PRECEDENCE if filter_matches(components, strict, e)] == matched


@pytest.mark.parametrize(
    "components",
    [
        [_c(USER, MATCH_ANY), _c(USER, MATCH_DEFAULT)],
        [_c("group", MATCH_ANY)],
        [_c(USER, 7)],
        [_c(USER, MATCH_EXACT, None)],
    ],
)
def test_bad_filters_are_refused(components: list[Component]) -> None:
    with pytest.raises(InvalidQuota):
        check_filter(components)


# --- the token bucket -------------------------------------------------------------------------


def test_a_quiet_client_may_burst_one_second_of_quota() -> None:
    bucket = Bucket(tokens=1000.0, updated_s=0.0)
    assert take(bucket, 1000.0, 1000, 0.0, 1.0) == 0
    assert take(bucket, 1000.0, 500, 0.0, 1.0) == 500  # 500 bytes over at 1000/s: 0.5 s


def test_throttle_pays_the_debt_and_the_rate_converges_to_the_quota() -> None:
    """A client that sends as soon as its throttle ends gets the quota's rate, whatever the
    request size up to the throttle cap's worth of quota (300 KB at 10 KB/s)."""
    for request_bytes in (100, 10_000, 250_000):
        throttles = Throttles(burst_s=1.0)
        now, sent = 0.0, 0
        while now < 600:
            throttle_ms = throttles.record(("p", "u", ""), 10_000.0, request_bytes, now)
            sent += request_bytes
            now += max(throttle_ms / 1000, 0.001)
        assert 0.9 * 10_000 <= sent / now <= 1.1 * 10_000, request_bytes


def test_throttle_and_debt_are_capped() -> None:
    """A request far over the quota waits the cap, and so does the next one: no more."""
    bucket = Bucket(tokens=0.0, updated_s=0.0)
    assert take(bucket, 1.0, 10**9, 0.0, 1.0) == MAX_THROTTLE_MS
    assert take(bucket, 1.0, 10**9, MAX_THROTTLE_MS / 1000, 1.0) == MAX_THROTTLE_MS


def test_refill_stops_at_the_burst() -> None:
    bucket = Bucket(tokens=0.0, updated_s=0.0)
    take(bucket, 100.0, 0, 3600.0, 1.0)
    assert bucket.tokens == 100.0


def test_buckets_are_bounded_and_idle_ones_evicted() -> None:
    throttles = Throttles(idle_s=10.0, max_buckets=3)
    for i in range(5):
        throttles.record(("p", f"u{i}", ""), 1.0, 0, 0.0)
    assert len(throttles) == 3
    throttles.record(("p", "late", ""), 1.0, 0, 100.0)
    assert len(throttles) == 1


# --- enforcement and storage ------------------------------------------------------------------


def test_enforcer_charges_produce_and_fetch_against_their_own_keys() -> None:
    quotas = {ANY_USER: {PRODUCER_BYTE_RATE: 1000.0}}
    enforcer = QuotaEnforcer(lambda: quotas, clock=lambda: 0.0)
    assert enforcer.charge(1, "User:alice", "app", 10**6) == 0  # no consumer quota
    assert enforcer.charge(0, "User:alice", "app", 1000) == 0
    assert enforcer.charge(0, "User:alice", "app", 1000) == 1000
    assert enforcer.charge(0, "User:bob", "app", 1000) == 0  # bob's own bucket
    assert enforcer.charge(18, "User:alice", "app", 10**6) == 0  # not a quota'd API


def test_user_of_principal_and_fetched_bytes() -> None:
    assert user_of("User:alice") == "alice"
    assert user_of("User:ANONYMOUS") == "ANONYMOUS"
    body = {"responses": [{"partitions": [{"records": b"x" * 10}, {"records": None}]}]}
    assert fetched_bytes(body) == 10
    assert fetched_bytes(None) == 0


def test_keys_round_trip_with_defaults_and_awkward_names() -> None:
    for entity in [*PRECEDENCE, ((USER, "a/b c"), (CLIENT_ID, "<default>"))]:
        key = keys.quota_key("c", entity)
        assert tuple(keys.quota_entity_from_key("c", key) or ()) == entity
    assert keys.quota_key("c", ANY_USER) == "/kafscale/c/quotas/users/<default>"
    assert keys.quota_entity_from_key("c", "/kafscale/c/quotas/clients") is None
    assert keys.quota_entity_from_key("c", "/kafscale/c/quotas/groups/x") is None


def test_cache_follows_puts_and_deletes_and_skips_garbage() -> None:
    cache = QuotaCache("c")
    key = keys.quota_key("c", ALICE)
    cache.put(key, encode({PRODUCER_BYTE_RATE: 5.0}))
    assert cache.quotas == {ALICE: {PRODUCER_BYTE_RATE: 5.0}}
    cache.put(keys.quota_key("c", APP), b"not json")
    assert decode("c", key, b"[1]") is None
    assert APP not in cache.quotas
    cache.delete(key)
    assert cache.quotas == {}
