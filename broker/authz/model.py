"""ACL bindings and binding filters, with Kafka's enum values and matching rules.

The numbers are Kafka's own (``ResourceType``, ``PatternType``, ``AclOperation``,
``AclPermissionType`` in ``org.apache.kafka.common``): clients send them on the wire. A
binding is what CreateAcls stores; a filter is what DescribeAcls and DeleteAcls send, where
``ANY`` and a null name, principal or host match everything, and the ``MATCH`` pattern type
matches every binding that would apply to the named resource (the literal name, the wildcard
``*`` and every prefix of the name).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass

WILDCARD = "*"
"""Resource name (literal) matching every resource, and host matching every host."""
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"
"""The one cluster resource's name, as Kafka names it."""


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


# Resource types ACLs may be stored for: those the broker authorizes.
STORABLE_RESOURCES = frozenset(
    {
        ResourceType.TOPIC,
        ResourceType.GROUP,
        ResourceType.CLUSTER,
        ResourceType.TRANSACTIONAL_ID,
        ResourceType.DELEGATION_TOKEN,  # DESCRIBE: see a token (by id)
        ResourceType.USER,  # CREATE_TOKENS, DESCRIBE_TOKENS: for that user (KIP-373)
    }
)


class InvalidBinding(ValueError):
    """A binding that cannot be stored (Kafka answers INVALID_REQUEST)."""


@dataclass(frozen=True, slots=True, order=True)
class AclBinding:
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "resource_type": self.resource_type.name,
                "resource_name": self.resource_name,
                "pattern_type": self.pattern_type.name,
                "principal": self.principal,
                "host": self.host,
                "operation": self.operation.name,
                "permission": self.permission.name,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> AclBinding:
        d = json.loads(data)
        return cls(
            ResourceType[d["resource_type"]],
            str(d["resource_name"]),
            PatternType[d["pattern_type"]],
            str(d["principal"]),
            str(d["host"]),
            Operation[d["operation"]],
            Permission[d["permission"]],
        )


def binding_of(
    resource_type: int,
    resource_name: str,
    pattern_type: int,
    principal: str,
    host: str,
    operation: int,
    permission: int,
) -> AclBinding:
    """A binding from wire values, refused (``InvalidBinding``) where Kafka refuses it."""
    try:
        binding = AclBinding(
            ResourceType(resource_type),
            resource_name,
            PatternType(pattern_type),
            principal,
            host,
            Operation(operation),
            Permission(permission),
        )
    except ValueError as exc:
        raise InvalidBinding(f"unknown enum value: {exc}") from exc
    check_binding(binding)
    return binding


def check_binding(binding: AclBinding) -> None:
    """Kafka's rules for a binding that may be created."""
    if binding.resource_type not in STORABLE_RESOURCES:
        raise InvalidBinding(f"ACLs on {binding.resource_type.name} resources are not supported")
    if binding.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise InvalidBinding("the pattern type must be LITERAL or PREFIXED")
    if binding.operation in (Operation.UNKNOWN, Operation.ANY):
        raise InvalidBinding("the operation must be a concrete one")
    if binding.permission not in (Permission.ALLOW, Permission.DENY):
        raise InvalidBinding("the permission must be ALLOW or DENY")
    if not binding.resource_name:
        raise InvalidBinding("the resource name must not be empty")
    if binding.resource_type is ResourceType.CLUSTER and binding.resource_name != CLUSTER_NAME:
        raise InvalidBinding(f"the cluster resource is named {CLUSTER_NAME}")
    if binding.pattern_type is PatternType.PREFIXED and binding.resource_name == WILDCARD:
        raise InvalidBinding("a PREFIXED pattern cannot be the wildcard '*'")
    kind, _, name = binding.principal.partition(":")
    if not kind or not name:
        raise InvalidBinding(f"principal {binding.principal!r} is not of the form Type:name")
    if not binding.host:
        raise InvalidBinding("the host must not be empty ('*' matches every host)")


@dataclass(frozen=True, slots=True)
class AclFilter:
    """DescribeAcls/DeleteAcls filter: ``None`` strings and the ``ANY`` values match all."""

    resource_type: ResourceType
    resource_name: str | None
    pattern_type: PatternType
    principal: str | None
    host: str | None
    operation: Operation
    permission: Permission


def filter_of(
    resource_type: int,
    resource_name: str | None,
    pattern_type: int,
    principal: str | None,
    host: str | None,
    operation: int,
    permission: int,
) -> AclFilter:
    """A filter from wire values; ``InvalidBinding`` for values no filter may hold."""
    try:
        result = AclFilter(
            ResourceType(resource_type),
            resource_name,
            PatternType(pattern_type),
            principal,
            host,
            Operation(operation),
            Permission(permission),
        )
    except ValueError as exc:
        raise InvalidBinding(f"unknown enum value: {exc}") from exc
    unknown = (
        result.resource_type is ResourceType.UNKNOWN
        or result.pattern_type is PatternType.UNKNOWN
        or result.operation is Operation.UNKNOWN
        or result.permission is Permission.UNKNOWN
    )
    if unknown:
        raise InvalidBinding("a filter cannot hold UNKNOWN values")
    return result


def filter_matches(acl_filter: AclFilter, binding: AclBinding) -> bool:
    """Whether ``binding`` is one ``acl_filter`` selects (Kafka's ``AclBindingFilter.matches``)."""
    f = acl_filter
    return (
        f.resource_type in (ResourceType.ANY, binding.resource_type)
        and _pattern_matches(f, binding)
        and (f.principal is None or f.principal == binding.principal)
        and (f.host is None or f.host == binding.host)
        and f.operation in (Operation.ANY, binding.operation)
        and f.permission in (Permission.ANY, binding.permission)
    )


def _pattern_matches(f: AclFilter, binding: AclBinding) -> bool:
    if f.pattern_type is PatternType.MATCH:
        if f.resource_name is None:
            return True
        return resource_matches(binding, f.resource_name)
    if f.pattern_type not in (PatternType.ANY, binding.pattern_type):
        return False
    return f.resource_name is None or f.resource_name == binding.resource_name


def resource_matches(binding: AclBinding, name: str) -> bool:
    """Whether ``binding``'s pattern covers the resource ``name`` (literal, '*' or prefix)."""
    if binding.pattern_type is PatternType.LITERAL:
        return binding.resource_name in (name, WILDCARD)
    if binding.pattern_type is PatternType.PREFIXED:
        return name.startswith(binding.resource_name)
    return False
