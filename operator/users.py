"""KafScaleUser → a SCRAM credential and ACL bindings in the cluster's etcd, a password Secret.

The decisions are pure (which bindings the spec means, which to add and remove, whether the
stored credential still matches the Secret's password, the Secret's manifest); the shell below
them reads and writes through the broker's own stores (``CredentialStore``, the ACL store), so
the operator writes exactly what ``kafscale users``, ``kafscale acls`` and the Kafka admin API
write, and brokers see it at once (credentials on the next login, ACLs through their watch).

The password is generated once, kept in the Secret (the only place it exists: etcd holds salt,
iterations and keys) and reused on every later reconcile; the credential in etcd is rewritten
only when it no longer verifies against that password, so a resync does not churn salts.
"""

from __future__ import annotations

import base64
import secrets
import string
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kafscale.broker.authz.model import (
    CLUSTER_NAME,
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    check_binding,
)
from kafscale.broker.authz.store import create_bindings, delete_matching, stored_bindings
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.security.credentials import CredentialStore
from kafscale.broker.security.scram import ScramMechanism, check_password, new_credential
from kafscale.operator import naming
from kafscale.operator.model_user_access import (
    AclOperation,
    AclPatternType,
    AclResourceType,
    AclRule,
    AclRuleType,
    AuthenticationType,
)
from kafscale.operator.models import API_VERSION, USER_KIND, ClusterRef, KafScaleUserSpec
from kafscale.operator.ownership import describe_owner, owned_by

PASSWORD_LENGTH = 32
PASSWORD_ALPHABET = string.ascii_letters + string.digits
SECRET_PASSWORD_KEY = "password"
SECRET_JAAS_KEY = "sasl.jaas.config"

_RESOURCE_TYPES = {
    AclResourceType.TOPIC: ResourceType.TOPIC,
    AclResourceType.GROUP: ResourceType.GROUP,
    AclResourceType.CLUSTER: ResourceType.CLUSTER,
    AclResourceType.TRANSACTIONAL_ID: ResourceType.TRANSACTIONAL_ID,
}
_PATTERN_TYPES = {
    AclPatternType.LITERAL: PatternType.LITERAL,
    AclPatternType.PREFIX: PatternType.PREFIXED,
}
_OPERATIONS = {
    AclOperation.ALL: Operation.ALL,
    AclOperation.READ: Operation.READ,
    AclOperation.WRITE: Operation.WRITE,
    AclOperation.CREATE: Operation.CREATE,
    AclOperation.DELETE: Operation.DELETE,
    AclOperation.ALTER: Operation.ALTER,
    AclOperation.DESCRIBE: Operation.DESCRIBE,
    AclOperation.CLUSTER_ACTION: Operation.CLUSTER_ACTION,
    AclOperation.DESCRIBE_CONFIGS: Operation.DESCRIBE_CONFIGS,
    AclOperation.ALTER_CONFIGS: Operation.ALTER_CONFIGS,
    AclOperation.IDEMPOTENT_WRITE: Operation.IDEMPOTENT_WRITE,
}
_MECHANISMS = {
    AuthenticationType.SCRAM_SHA_256: ScramMechanism.SCRAM_SHA_256,
    AuthenticationType.SCRAM_SHA_512: ScramMechanism.SCRAM_SHA_512,
}


# --- pure decisions -----------------------------------------------------------------------------


def principal_of(username: str) -> str:
    return f"User:{username}"


def mechanism_of(spec: KafScaleUserSpec) -> ScramMechanism:
    return _MECHANISMS[AuthenticationType(spec.authentication.type)]


def bindings_of_rule(username: str, rule: AclRule) -> list[AclBinding]:
    """The bindings one rule stands for (one per operation); ``InvalidBinding`` if Kafka
    would refuse one (a ``prefix`` pattern on ``*``, say)."""
    resource = rule.resource
    resource_type = _RESOURCE_TYPES[AclResourceType(resource.type)]
    name = CLUSTER_NAME if resource_type is ResourceType.CLUSTER else str(resource.name)
    permission = Permission.ALLOW if rule.type == AclRuleType.ALLOW else Permission.DENY
    found = []
    for operation in rule.operations:
        binding = AclBinding(
            resource_type,
            name,
            _PATTERN_TYPES[AclPatternType(resource.pattern_type)],
            principal_of(username),
            rule.host,
            _OPERATIONS[AclOperation(operation)],
            permission,
        )
        check_binding(binding)
        found.append(binding)
    return found


def desired_bindings(username: str, spec: KafScaleUserSpec) -> frozenset[AclBinding]:
    """Every binding the spec asks for (duplicates across rules collapse)."""
    return frozenset(
        binding for rule in spec.authorization.acls for binding in bindings_of_rule(username, rule)
    )


@dataclass(frozen=True)
class AclPlan:
    add: tuple[AclBinding, ...]
    remove: tuple[AclBinding, ...]
    kept: int


def plan_acls(
    username: str, desired: frozenset[AclBinding], stored: Iterable[AclBinding]
) -> AclPlan:
    """What to add and remove so that the user's bindings are exactly ``desired``.

    Only bindings of the user's own principal are considered: other principals' bindings
    (``User:*`` included) are not this resource's to remove.
    """
    mine = {b for b in stored if b.principal == principal_of(username)}
    return AclPlan(
        add=tuple(sorted(desired - mine)),
        remove=tuple(sorted(mine - desired)),
        kept=len(mine & desired),
    )


def generate_password(length: int = PASSWORD_LENGTH) -> str:
    return "".join(secrets.choice(PASSWORD_ALPHABET) for _ in range(length))


def jaas_config(username: str, password: str) -> str:
    """What Strimzi puts in ``sasl.jaas.config``: ready for a Java client's properties."""
    return (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{username}" password="{password}";'
    )


def user_owner_reference(ref: ClusterRef) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": USER_KIND,
        "name": ref.name,
        "uid": ref.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def build_user_secret(ref: ClusterRef, cluster: str, password: str) -> dict[str, Any]:
    """The user's Secret, owned by the KafScaleUser (the garbage collector deletes it with it)."""

    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": naming.user_secret_name(ref.name),
            "namespace": ref.namespace,
            "labels": naming.user_labels(cluster, ref.name),
            "ownerReferences": [user_owner_reference(ref)],
        },
        "data": {
            SECRET_PASSWORD_KEY: b64(password),
            SECRET_JAAS_KEY: b64(jaas_config(ref.name, password)),
        },
    }


class SecretConflict(Exception):
    """A Secret of the user's name exists and belongs to someone else: it is never taken over."""


def password_in(secret: dict[str, Any] | None, owner_uid: str) -> str | None:
    """The password kept in the user's Secret, or None when there is none yet.

    Raises :class:`SecretConflict` for a Secret this user does not own (a user's own Secret of
    the same name must not be overwritten).
    """
    if secret is None:
        return None
    if not owned_by(secret, owner_uid):
        name = (secret.get("metadata") or {}).get("name")
        raise SecretConflict(
            f"Secret {name} ({describe_owner(secret)}) is not this KafScaleUser's, so left as "
            "it is: delete it and the operator makes its own, or give the user its password "
            "with authentication.password.valueFrom"
        )
    return password_from_ref(secret, SECRET_PASSWORD_KEY)


def password_from_ref(secret: dict[str, Any] | None, key: str) -> str | None:
    """The password a user's own Secret holds under ``key`` (None: no Secret, no such key, or
    not text). Leading and trailing whitespace counts: it is the password as written."""
    encoded = ((secret or {}).get("data") or {}).get(key)
    if not encoded:
        return None
    try:
        password = base64.b64decode(encoded, validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return None
    return password or None


def secret_of(name: str, spec: KafScaleUserSpec) -> str:
    """The Secret holding the user's password: the referenced one, else the generated one."""
    source = spec.authentication.password
    if source is not None:
        return source.value_from.secret_key_ref.name
    return naming.user_secret_name(name)


# --- I/O shell ----------------------------------------------------------------------------------


async def sync_credential(
    etcd: Etcd, cluster: str, username: str, mechanism: ScramMechanism, password: str
) -> bool:
    """Store a credential for ``password`` unless the stored one verifies; drop the other
    mechanisms' credentials (the spec names one). Returns whether anything was written."""
    store = CredentialStore(etcd, cluster)
    written = False
    current = await store.get(username, mechanism)
    if current is None or not check_password(password.encode(), current, mechanism):
        await store.put(username, mechanism, new_credential(password, mechanism))
        written = True
    for other in ScramMechanism:
        if other is not mechanism and await store.delete(username, other):
            written = True
    return written


def _exact_filter(binding: AclBinding) -> AclFilter:
    return AclFilter(
        binding.resource_type,
        binding.resource_name,
        binding.pattern_type,
        binding.principal,
        binding.host,
        binding.operation,
        binding.permission,
    )


async def sync_acls(
    etcd: Etcd, cluster: str, username: str, desired: frozenset[AclBinding]
) -> AclPlan:
    """Make the user's bindings in etcd exactly ``desired``."""
    stored = (await stored_bindings(etcd, cluster)).values()
    plan = plan_acls(username, desired, stored)
    if plan.add:
        await create_bindings(etcd, cluster, plan.add)
    if plan.remove:
        await delete_matching(etcd, cluster, [_exact_filter(b) for b in plan.remove])
    return plan


async def remove_user(etcd: Etcd, cluster: str, username: str) -> tuple[int, int]:
    """Delete the user's credentials and every binding of its principal: (credentials, ACLs)."""
    store = CredentialStore(etcd, cluster)
    credentials = 0
    for mechanism in ScramMechanism:
        if await store.delete(username, mechanism):
            credentials += 1
    plan = await sync_acls(etcd, cluster, username, frozenset())
    return credentials, len(plan.remove)
