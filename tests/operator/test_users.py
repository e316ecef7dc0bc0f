"""KafScaleUser decisions (pure): the bindings a spec means, the plan to reach them, the Secret."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from pydantic import ValidationError

from kafscale.broker.authz.model import (
    AclBinding,
    InvalidBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from kafscale.broker.security.scram import ScramMechanism
from kafscale.operator.models import ClusterRef, parse_user_spec
from kafscale.operator.secret_watch import UserSecret, users_reading, users_to_resync
from kafscale.operator.users import (
    PASSWORD_LENGTH,
    SecretConflict,
    build_user_secret,
    desired_bindings,
    generate_password,
    jaas_config,
    mechanism_of,
    password_in,
    plan_acls,
)

pytestmark = pytest.mark.operator

REF = ClusterRef(name="alice", namespace="ns", uid="uid-1")


def spec(acls: list[dict[str, Any]], auth: str = "scram-sha-512") -> Any:
    return parse_user_spec(
        {"cluster": "demo", "authentication": {"type": auth}, "authorization": {"acls": acls}}
    )


def binding(
    type_: ResourceType,
    name: str,
    op: Operation,
    *,
    pattern: PatternType = PatternType.LITERAL,
    principal: str = "User:alice",
    permission: Permission = Permission.ALLOW,
    host: str = "*",
) -> AclBinding:
    return AclBinding(type_, name, pattern, principal, host, op, permission)


def test_rules_become_one_binding_per_operation_with_kafkas_names() -> None:
    wanted = desired_bindings(
        "alice",
        spec(
            [
                {"resource": {"type": "topic", "name": "orders"}, "operations": ["Read", "Write"]},
                {
                    "resource": {"type": "group", "name": "app-", "patternType": "prefix"},
                    "operations": ["Read"],
                    "type": "deny",
                    "host": "10.0.0.1",
                },
                {"resource": {"type": "cluster"}, "operations": ["IdempotentWrite"]},
                {"resource": {"type": "transactionalId", "name": "*"}, "operations": ["All"]},
                {"resource": {"type": "topic", "name": "orders"}, "operations": ["Read"]},
            ]
        ),
    )
    assert wanted == {
        binding(ResourceType.TOPIC, "orders", Operation.READ),
        binding(ResourceType.TOPIC, "orders", Operation.WRITE),
        binding(
            ResourceType.GROUP,
            "app-",
            Operation.READ,
            pattern=PatternType.PREFIXED,
            permission=Permission.DENY,
            host="10.0.0.1",
        ),
        binding(ResourceType.CLUSTER, "kafka-cluster", Operation.IDEMPOTENT_WRITE),
        binding(ResourceType.TRANSACTIONAL_ID, "*", Operation.ALL),
    }


def test_a_binding_kafka_refuses_is_refused() -> None:
    prefixed_wildcard = spec(
        [
            {
                "resource": {"type": "topic", "name": "*", "patternType": "prefix"},
                "operations": ["Read"],
            }
        ]
    )
    with pytest.raises(InvalidBinding):
        desired_bindings("alice", prefixed_wildcard)


@pytest.mark.parametrize(
    "bad",
    [
        {"cluster": "demo", "authentication": {"type": "plain"}},
        {
            "cluster": "demo",
            "authorization": {"acls": [{"resource": {"type": "topic"}, "operations": ["Read"]}]},
        },
        {
            "cluster": "demo",
            "authorization": {
                "acls": [{"resource": {"type": "topic", "name": "t"}, "operations": []}]
            },
        },
        {
            "cluster": "demo",
            "authorization": {
                "acls": [{"resource": {"type": "topic", "name": "t"}, "operations": ["Eat"]}]
            },
        },
        {"authentication": {"type": "scram-sha-512"}},
    ],
)
def test_bad_specs_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        parse_user_spec(bad)


def test_mechanism_follows_the_authentication_type() -> None:
    assert mechanism_of(spec([])) is ScramMechanism.SCRAM_SHA_512
    assert mechanism_of(spec([], "scram-sha-256")) is ScramMechanism.SCRAM_SHA_256


def test_plan_adds_missing_removes_extra_and_leaves_other_principals_alone() -> None:
    keep = binding(ResourceType.TOPIC, "a", Operation.READ)
    extra = binding(ResourceType.TOPIC, "b", Operation.WRITE)
    missing = binding(ResourceType.GROUP, "g", Operation.READ)
    others = [
        binding(ResourceType.TOPIC, "b", Operation.WRITE, principal="User:bob"),
        binding(ResourceType.TOPIC, "*", Operation.READ, principal="User:*"),
        binding(ResourceType.TOPIC, "b", Operation.WRITE, principal="User:alice2"),
    ]
    plan = plan_acls("alice", frozenset({keep, missing}), [keep, extra, *others])
    assert plan.add == (missing,)
    assert plan.remove == (extra,)
    assert plan.kept == 1
    assert plan_acls("alice", frozenset({keep}), [keep]).add == ()


def test_secret_carries_password_and_jaas_config_and_is_owned_by_the_user() -> None:
    password = generate_password()
    assert len(password) == PASSWORD_LENGTH and password.isalnum()
    assert generate_password() != password
    secret = build_user_secret(REF, "ns.demo", password)
    assert secret["metadata"]["name"] == "alice"
    (owner,) = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("KafScaleUser", "uid-1", True)
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data["password"] == password
    assert data["sasl.jaas.config"] == jaas_config("alice", password)
    assert data["sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="alice" password="{password}";'
    )
    assert password_in(secret, "uid-1") == password


def test_an_existing_secret_is_reused_only_if_the_user_owns_it() -> None:
    assert password_in(None, "uid-1") is None
    foreign = build_user_secret(REF.model_copy(update={"uid": "uid-2"}), "ns.demo", "pw")
    with pytest.raises(SecretConflict):
        password_in(foreign, "uid-1")
    empty = build_user_secret(REF, "ns.demo", "pw")
    empty["data"] = {}
    assert password_in(empty, "uid-1") is None


def _password_secret(name: str, owner_uid: str | None, **data: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "kafka", "uid": f"uid-{name}"}
    if owner_uid is not None:
        meta["ownerReferences"] = [{"kind": "KafScaleUser", "name": "alice", "uid": owner_uid}]
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": encoded}


def test_a_users_own_password_secret_calls_for_a_round_on_any_change() -> None:
    """``valueFrom.secretKeyRef``: the password may have changed, or the Secret gone."""
    theirs = UserSecret("alice-login", "u-alice", own=False)
    assert theirs.round_due(_password_secret("alice-login", None, pw="new password"))
    assert theirs.round_due(None)


def test_the_operators_password_secret_calls_for_a_round_when_gone_taken_or_emptied() -> None:
    ours = UserSecret("alice", "u-alice", own=True)
    assert not ours.round_due(_password_secret("alice", "u-alice", password="p"))  # its write
    assert ours.round_due(None)  # deleted: a new one (and password) is written
    assert ours.round_due(_password_secret("alice", "someone-else", password="p"))  # conflict
    assert ours.round_due(_password_secret("alice", "u-alice", other="x"))  # password removed


def test_a_changed_secret_concerns_the_users_of_its_namespace_that_read_it() -> None:
    users = {
        ("kafka", "alice"): UserSecret("alice-login", "u-alice", own=False),
        ("kafka", "bob"): UserSecret("bob", "u-bob", own=True),
        ("staging", "alice"): UserSecret("alice-login", "u-alice-2", own=False),
    }
    assert users_reading(users, "kafka", "alice-login") == [("kafka", "alice")]
    assert users_reading(users, "kafka", "orders") == []
    bobs = _password_secret("bob", "u-bob", password="p")
    assert users_to_resync(users, "kafka", "bob", bobs) == []
    assert users_to_resync(users, "kafka", "bob", None) == [("kafka", "bob")]
