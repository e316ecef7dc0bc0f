"""The authorization decision (``authz.authorizer``): Kafka's rules, example by example, and
the properties every ACL set must keep (deny only narrows, allow only widens, order does not
matter, super users pass)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.authz.authorizer import (
    Access,
    Policy,
    allowing_operations,
    authorize,
    authorize_any_resource,
)
from kafscale.broker.authz.index import AclIndex
from kafscale.broker.authz.model import (
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    resource_matches,
)

TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY
ALICE = "User:alice"
STRICT = Policy()


def acl(
    operation: Operation,
    permission: Permission = ALLOW,
    name: str = "orders",
    pattern: PatternType = LITERAL,
    principal: str = ALICE,
    host: str = "*",
    resource_type: ResourceType = TOPIC,
) -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, host, operation, permission)


def may(
    operation: Operation,
    acls: list[AclBinding],
    name: str = "orders",
    principal: str = ALICE,
    host: str = "10.0.0.1",
    resource_type: ResourceType = TOPIC,
    policy: Policy = STRICT,
) -> bool:
    return authorize(Access(principal, host, operation, resource_type, name), acls, policy)


# --- examples ---------------------------------------------------------------------------------


def test_no_acl_denies_unless_the_policy_allows_everyone() -> None:
    assert not may(Operation.READ, [])
    assert may(Operation.READ, [], policy=Policy(allow_everyone_if_no_acl_found=True))


def test_allow_everyone_applies_only_to_resources_no_acl_names() -> None:
    others = [acl(Operation.READ, principal="User:bob")]
    open_policy = Policy(allow_everyone_if_no_acl_found=True)
    assert not may(Operation.READ, others, policy=open_policy)
    assert may(Operation.READ, others, name="invoices", policy=open_policy)


def test_super_users_are_allowed_whatever_the_acls_say() -> None:
    denied = [acl(Operation.ALL, DENY, name="*")]
    assert may(Operation.DELETE, denied, policy=Policy(super_users=frozenset({ALICE})))
    assert not may(Operation.DELETE, denied, policy=Policy(super_users=frozenset({"User:bob"})))


def test_allow_gives_its_operation_only() -> None:
    acls = [acl(Operation.WRITE)]
    assert may(Operation.WRITE, acls)
    assert not may(Operation.READ, acls)
    assert not may(Operation.DELETE, acls)


@pytest.mark.parametrize(
    "granted", [Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER]
)
def test_describe_is_implied_by_read_write_delete_alter(granted: Operation) -> None:
    assert may(Operation.DESCRIBE, [acl(granted)])


def test_describe_configs_is_implied_by_alter_configs_only() -> None:
    assert may(Operation.DESCRIBE_CONFIGS, [acl(Operation.ALTER_CONFIGS)])
    assert not may(Operation.DESCRIBE_CONFIGS, [acl(Operation.READ)])
    assert not may(Operation.ALTER_CONFIGS, [acl(Operation.DESCRIBE_CONFIGS)])


def test_all_allows_every_operation() -> None:
    for operation in Operation:
        if operation not in (Operation.UNKNOWN, Operation.ANY):
            assert may(operation, [acl(Operation.ALL)]), operation


def test_deny_wins_over_allow() -> None:
    acls = [acl(Operation.ALL), acl(Operation.READ, DENY)]
    assert not may(Operation.READ, acls)
    assert may(Operation.WRITE, acls)


def test_deny_is_not_widened_by_implication() -> None:
    # Denying READ leaves DESCRIBE to an ALLOW (Kafka's rule: only ALLOW implies).
    acls = [acl(Operation.WRITE), acl(Operation.READ, DENY)]
    assert may(Operation.DESCRIBE, acls)


def test_deny_all_denies_every_operation() -> None:
    acls = [acl(Operation.ALL), acl(Operation.ALL, DENY, principal="User:*")]
    assert not may(Operation.DESCRIBE, acls)
    assert not may(Operation.WRITE, acls)


def test_wildcard_principal_and_host() -> None:
    assert may(Operation.READ, [acl(Operation.READ, principal="User:*")])
    assert may(Operation.READ, [acl(Operation.READ, host="10.0.0.1")])
    assert not may(Operation.READ, [acl(Operation.READ, host="10.0.0.2")])
    assert not may(Operation.READ, [acl(Operation.READ, principal="User:bob")])


def test_wildcard_resource_name_covers_every_resource_of_its_type() -> None:
    acls = [acl(Operation.READ, name="*")]
    assert may(Operation.READ, acls, name="anything")
    assert not may(Operation.READ, acls, name="anything", resource_type=GROUP)


def test_prefixed_pattern_covers_names_starting_with_it() -> None:
    acls = [acl(Operation.READ, name="pay", pattern=PREFIXED)]
    assert may(Operation.READ, acls, name="payments")
    assert may(Operation.READ, acls, name="pay")
    assert not may(Operation.READ, acls, name="pa")
    assert not may(Operation.READ, acls, name="repay")


def test_a_literal_star_name_is_not_a_wildcard_when_prefixed_by_something() -> None:
    # A literal "orders*" names only the topic "orders*" (literals are exact).
    acls = [acl(Operation.READ, name="orders*")]
    assert not may(Operation.READ, acls, name="orders-eu")


def test_prefixed_deny_overrides_literal_allow() -> None:
    acls = [acl(Operation.READ), acl(Operation.READ, DENY, name="ord", pattern=PREFIXED)]
    assert not may(Operation.READ, acls)


def test_cluster_and_group_resources() -> None:
    cluster = [acl(Operation.CREATE, name="kafka-cluster", resource_type=CLUSTER)]
    assert may(Operation.CREATE, cluster, name="kafka-cluster", resource_type=CLUSTER)
    assert not may(Operation.CREATE, cluster, name="orders")
    group = [acl(Operation.READ, name="billing", resource_type=GROUP)]
    assert may(Operation.READ, group, name="billing", resource_type=GROUP)
    assert may(Operation.DESCRIBE, group, name="billing", resource_type=GROUP)
    assert not may(Operation.DELETE, group, name="billing", resource_type=GROUP)


def test_allowing_operations() -> None:
    assert allowing_operations(Operation.WRITE) == {Operation.WRITE, Operation.ALL}
    assert Operation.ALTER in allowing_operations(Operation.DESCRIBE)


# --- by resource type (an idempotent producer's WRITE on any topic) ---------------------------


def any_topic(operation: Operation, acls: list[AclBinding], policy: Policy = STRICT) -> bool:
    return authorize_any_resource(ALICE, "10.0.0.1", operation, TOPIC, acls, policy)


def test_any_resource_needs_one_allow_not_covered_by_a_deny() -> None:
    assert any_topic(Operation.WRITE, [acl(Operation.WRITE)])
    assert any_topic(Operation.WRITE, [acl(Operation.ALL, name="x", pattern=PREFIXED)])
    assert not any_topic(Operation.WRITE, [acl(Operation.READ)])
    assert not any_topic(Operation.WRITE, [acl(Operation.WRITE), acl(Operation.WRITE, DENY)])
    assert not any_topic(
        Operation.WRITE, [acl(Operation.WRITE), acl(Operation.WRITE, DENY, name="*")]
    )
    assert not any_topic(
        Operation.WRITE,
        [acl(Operation.WRITE), acl(Operation.ALL, DENY, name="o", pattern=PREFIXED)],
    )
    # a literal deny does not cover a prefixed allow of the same name (longer names remain)
    assert any_topic(
        Operation.WRITE, [acl(Operation.WRITE, pattern=PREFIXED), acl(Operation.WRITE, DENY)]
    )


def test_any_resource_policy_and_super_users() -> None:
    assert not any_topic(Operation.WRITE, [])
    assert any_topic(Operation.WRITE, [], Policy(allow_everyone_if_no_acl_found=True))
    assert any_topic(Operation.WRITE, [], Policy(super_users=frozenset({ALICE})))


# --- properties -------------------------------------------------------------------------------

operations = st.sampled_from(
    [op for op in Operation if op not in (Operation.UNKNOWN, Operation.ANY)]
)
names = st.sampled_from(["orders", "ord", "o", "*", "payments", "pay"])
principals = st.sampled_from([ALICE, "User:bob", "User:*"])
hosts = st.sampled_from(["*", "10.0.0.1", "10.0.0.2"])
bindings = st.builds(
    AclBinding,
    st.sampled_from([TOPIC, GROUP]),
    names,
    st.sampled_from([LITERAL, PREFIXED]),
    principals,
    hosts,
    operations,
    st.sampled_from([ALLOW, DENY]),
).filter(lambda b: not (b.pattern_type is PREFIXED and b.resource_name == "*"))
accesses = st.builds(
    Access,
    st.sampled_from([ALICE, "User:bob"]),
    st.sampled_from(["10.0.0.1", "10.0.0.2"]),
    operations,
    st.sampled_from([TOPIC, GROUP]),
    st.sampled_from(["orders", "payments", "other"]),
)
policies = st.builds(Policy, st.just(frozenset()), st.booleans())


@given(accesses, st.lists(bindings, max_size=8), bindings, policies)
def test_adding_a_deny_never_allows_more(
    access: Access, acls: list[AclBinding], extra: AclBinding, policy: Policy
) -> None:
    deny = AclBinding(*[*_fields(extra)[:-1], DENY])
    if not authorize(access, acls, policy):
        assert not authorize(access, [*acls, deny], policy)


@given(accesses, st.lists(bindings, max_size=8), policies)
def test_an_allow_for_the_caller_on_the_resource_allows_unless_denied(
    access: Access, acls: list[AclBinding], policy: Policy
) -> None:
    granted = AclBinding(
        access.resource_type,
        access.resource_name,
        LITERAL,
        access.principal,
        access.host,
        access.operation,
        ALLOW,
    )
    denied = any(
        b.permission is DENY
        and b.resource_type is access.resource_type
        and (
            b.resource_name in (access.resource_name, "*")
            if b.pattern_type is LITERAL
            else access.resource_name.startswith(b.resource_name)
        )
        and b.principal in (access.principal, "User:*")
        and b.host in (access.host, "*")
        and b.operation in (access.operation, Operation.ALL)
        for b in acls
    )
    assert authorize(access, [*acls, granted], policy) is not denied


@given(accesses, st.lists(bindings, max_size=8), policies, st.randoms())
def test_the_order_of_acls_does_not_matter(
    access: Access, acls: list[AclBinding], policy: Policy, rng: random.Random
) -> None:
    shuffled = list(acls)
    rng.shuffle(shuffled)
    assert authorize(access, acls, policy) == authorize(access, shuffled, policy)


@given(accesses, st.lists(bindings, max_size=8))
def test_super_users_always_pass(access: Access, acls: list[AclBinding]) -> None:
    assert authorize(access, acls, Policy(super_users=frozenset({access.principal})))


@given(st.lists(bindings, max_size=8), operations)
def test_allowed_on_a_topic_means_allowed_on_some_topic(
    acls: list[AclBinding], operation: Operation
) -> None:
    for name in ("orders", "payments", "other"):
        if authorize(Access(ALICE, "10.0.0.1", operation, TOPIC, name), acls, STRICT):
            assert any_topic(operation, acls)


def _fields(b: AclBinding) -> list[object]:
    return [
        b.resource_type,
        b.resource_name,
        b.pattern_type,
        b.principal,
        b.host,
        b.operation,
        b.permission,
    ]


@given(accesses, st.lists(bindings, max_size=12), policies)
def test_deciding_on_the_indexed_bindings_gives_the_same_answer(
    access: Access, acls: list[AclBinding], policy: Policy
) -> None:
    covering = AclIndex.build(acls).covering(access.resource_type, access.resource_name)
    assert authorize(access, covering, policy) == authorize(access, acls, policy)
    assert sorted(covering) == sorted(
        b
        for b in acls
        if b.resource_type is access.resource_type and resource_matches(b, access.resource_name)
    )
