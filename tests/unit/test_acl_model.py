"""ACL bindings and filters (``authz.model``) and their etcd records (``authz.store``): what
CreateAcls accepts, which bindings DescribeAcls/DeleteAcls filters select (ANY and MATCH as in
Kafka), and that a record read back is the binding written."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.authz.model import (
    AclBinding,
    InvalidBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    binding_of,
    filter_matches,
    filter_of,
)
from kafscale.broker.authz.store import AclCache, binding_key
from kafscale.broker.metadata import keys

TOPIC, GROUP, CLUSTER, ANY_TYPE = 2, 3, 4, 1
ANY_PATTERN, MATCH, LITERAL, PREFIXED = 1, 2, 3, 4
ANY_OP, ALL, READ, WRITE = 1, 2, 3, 4
ANY_PERM, DENY, ALLOW = 1, 2, 3


def binding(
    name: str = "orders", pattern: int = LITERAL, resource: int = TOPIC, op: int = READ
) -> AclBinding:
    return binding_of(resource, name, pattern, "User:alice", "*", op, ALLOW)


def test_valid_bindings_are_accepted() -> None:
    created = binding_of(TOPIC, "pay", PREFIXED, "User:alice", "10.0.0.1", WRITE, DENY)
    assert created.resource_type is ResourceType.TOPIC
    assert created.pattern_type is PatternType.PREFIXED
    assert created.operation is Operation.WRITE
    assert created.permission is Permission.DENY
    assert binding_of(CLUSTER, "kafka-cluster", LITERAL, "User:*", "*", 7, ALLOW)


@pytest.mark.parametrize(
    "args",
    [
        (ANY_TYPE, "orders", LITERAL, "User:alice", "*", READ, ALLOW),  # ANY is a filter value
        (TOPIC, "orders", MATCH, "User:alice", "*", READ, ALLOW),  # MATCH too
        (TOPIC, "orders", LITERAL, "User:alice", "*", ANY_OP, ALLOW),
        (TOPIC, "orders", LITERAL, "User:alice", "*", READ, ANY_PERM),
        (TOPIC, "", LITERAL, "User:alice", "*", READ, ALLOW),
        (TOPIC, "orders", LITERAL, "alice", "*", READ, ALLOW),  # no principal type
        (TOPIC, "orders", LITERAL, "User:alice", "", READ, ALLOW),
        (TOPIC, "*", PREFIXED, "User:alice", "*", READ, ALLOW),
        (CLUSTER, "other", LITERAL, "User:alice", "*", READ, ALLOW),
        (8, "bob", LITERAL, "User:alice", "*", READ, ALLOW),  # no such resource type
        (TOPIC, "orders", LITERAL, "User:alice", "*", 99, ALLOW),  # no such operation
    ],
)
def test_invalid_bindings_are_refused(args: tuple[int, str, int, str, str, int, int]) -> None:
    with pytest.raises(InvalidBinding):
        binding_of(*args)


def test_token_acls_on_users_and_tokens_are_storable() -> None:
    """KIP-48/373: CREATE_TOKENS and DESCRIBE_TOKENS on a USER (named by its principal),
    DESCRIBE on a DELEGATION_TOKEN (named by its id)."""
    on_user = binding_of(7, "User:alice", LITERAL, "User:scheduler", "*", 13, ALLOW)
    assert on_user.resource_type is ResourceType.USER
    assert on_user.operation is Operation.CREATE_TOKENS
    on_token = binding_of(6, "tokenid", LITERAL, "User:auditor", "*", 8, ALLOW)
    assert on_token.resource_type is ResourceType.DELEGATION_TOKEN


def test_filters_with_any_and_nulls_match_everything() -> None:
    everything = filter_of(ANY_TYPE, None, ANY_PATTERN, None, None, ANY_OP, ANY_PERM)
    for b in (binding(), binding("pay", PREFIXED), binding("g", resource=GROUP)):
        assert filter_matches(everything, b)


def test_literal_filters_match_exactly() -> None:
    exact = filter_of(TOPIC, "orders", LITERAL, None, None, ANY_OP, ANY_PERM)
    assert filter_matches(exact, binding())
    assert not filter_matches(exact, binding("orders", PREFIXED))
    assert not filter_matches(exact, binding("*"))
    any_pattern = filter_of(TOPIC, "orders", ANY_PATTERN, None, None, ANY_OP, ANY_PERM)
    assert filter_matches(any_pattern, binding("orders", PREFIXED))
    assert not filter_matches(any_pattern, binding("ord", PREFIXED))


def test_match_filters_select_every_binding_that_applies_to_the_resource() -> None:
    match = filter_of(TOPIC, "orders", MATCH, None, None, ANY_OP, ANY_PERM)
    assert filter_matches(match, binding())
    assert filter_matches(match, binding("*"))
    assert filter_matches(match, binding("ord", PREFIXED))
    assert not filter_matches(match, binding("orders-eu"))
    assert not filter_matches(match, binding("x", PREFIXED))


def test_filters_on_principal_host_operation_permission() -> None:
    b = binding_of(TOPIC, "orders", LITERAL, "User:alice", "10.0.0.1", READ, ALLOW)
    assert filter_matches(filter_of(TOPIC, None, ANY_PATTERN, "User:alice", None, 1, 1), b)
    assert not filter_matches(filter_of(TOPIC, None, ANY_PATTERN, "User:bob", None, 1, 1), b)
    assert not filter_matches(filter_of(TOPIC, None, ANY_PATTERN, None, "*", 1, 1), b)
    assert filter_matches(filter_of(TOPIC, None, ANY_PATTERN, None, None, READ, ALLOW), b)
    assert not filter_matches(filter_of(TOPIC, None, ANY_PATTERN, None, None, WRITE, 1), b)
    assert not filter_matches(filter_of(TOPIC, None, ANY_PATTERN, None, None, 1, DENY), b)


def test_filters_cannot_hold_unknown() -> None:
    with pytest.raises(InvalidBinding):
        filter_of(0, None, ANY_PATTERN, None, None, ANY_OP, ANY_PERM)
    with pytest.raises(InvalidBinding):
        filter_of(TOPIC, None, 0, None, None, ANY_OP, ANY_PERM)


names = st.text(min_size=1, max_size=30)


@given(names, st.sampled_from([LITERAL, PREFIXED]), names, names)
def test_records_round_trip_and_keys_stay_one_segment_each(
    name: str, pattern: int, principal_name: str, host: str
) -> None:
    if pattern == PREFIXED and name == "*":
        return
    b = binding_of(TOPIC, name, pattern, f"User:{principal_name}", host, READ, ALLOW)
    assert AclBinding.from_json(b.to_json()) == b
    key = binding_key("c1", b)
    relative = key[len(keys.acls_prefix("c1")) :]
    assert len(relative.split("/")) == 7  # a "/" in a name cannot split the key


def test_cache_follows_puts_and_deletes() -> None:
    cache = AclCache()
    b = binding()
    key = binding_key("c1", b)
    cache.put(key, b.to_json())
    cache.put(key, b.to_json())
    assert cache.bindings == (b,)
    cache.put("bad", b"not json")  # an unreadable record is skipped, not fatal
    assert cache.bindings == (b,)
    cache.delete(key)
    assert cache.bindings == ()
