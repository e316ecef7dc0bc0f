"""The authorization decision, as a pure function of the request, the ACLs and the policy.

Kafka's semantics (``StandardAuthorizer``):

* a super user is allowed everything;
* the ACLs that apply are those whose resource pattern covers the resource (a literal name, the
  literal wildcard ``*``, or a prefix of the name), whose principal is the caller's or
  ``User:*`` and whose host is the caller's or ``*``;
* a DENY for the operation (or ``ALL``) wins over every ALLOW;
* an ALLOW for the operation allows it, and so do the operations that imply it: ``DESCRIBE`` is
  implied by ``READ``, ``WRITE``, ``DELETE`` and ``ALTER``; ``DESCRIBE_CONFIGS`` by
  ``ALTER_CONFIGS``; ``ALL`` implies every operation. (A DENY is never widened that way:
  denying READ does not deny DESCRIBE.)
* a resource no ACL at all covers (for any principal) is allowed only if the policy says
  ``allow_everyone_if_no_acl_found``; otherwise, no ALLOW means denied.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kafscale.broker.authz.model import (
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    resource_matches,
)

_IMPLIED_BY: dict[Operation, frozenset[Operation]] = {
    Operation.DESCRIBE: frozenset(
        {Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER}
    ),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS}),
}
_ALLOWING: dict[Operation, frozenset[Operation]] = {
    op: _IMPLIED_BY.get(op, frozenset({op})) | {Operation.ALL} for op in Operation
}


@dataclass(frozen=True, slots=True)
class Policy:
    """What the broker's settings say beyond the ACLs."""

    super_users: frozenset[str] = frozenset()
    allow_everyone_if_no_acl_found: bool = False


@dataclass(frozen=True, slots=True)
class Access:
    """Who wants to do what to which resource."""

    principal: str
    host: str
    operation: Operation
    resource_type: ResourceType
    resource_name: str


def allowing_operations(operation: Operation) -> frozenset[Operation]:
    """The operations an ALLOW ACL may name to allow ``operation``."""
    return _ALLOWING[operation]


def applies_to_caller(binding: AclBinding, principal: str, host: str) -> bool:
    return binding.principal in (principal, WILDCARD_PRINCIPAL) and binding.host in (host, WILDCARD)


def authorize(access: Access, acls: Iterable[AclBinding], policy: Policy) -> bool:
    """Whether ``access`` is allowed; see the module docstring for the rules."""
    if access.principal in policy.super_users:
        return True
    allowing = allowing_operations(access.operation)
    found_resource_acls = False
    allowed = False
    for binding in acls:
        if binding.resource_type is not access.resource_type:
            continue
        if not resource_matches(binding, access.resource_name):
            continue
        found_resource_acls = True
        if not applies_to_caller(binding, access.principal, access.host):
            continue
        if binding.permission is Permission.DENY:
            if binding.operation in (access.operation, Operation.ALL):
                return False
        elif binding.operation in allowing:
            allowed = True
    if not found_resource_acls:
        return policy.allow_everyone_if_no_acl_found
    return allowed


def authorize_any_resource(
    principal: str,
    host: str,
    operation: Operation,
    resource_type: ResourceType,
    acls: Iterable[AclBinding],
    policy: Policy,
) -> bool:
    """Whether some resource of ``resource_type`` allows ``operation`` (Kafka's
    ``authorizeByResourceType``: an idempotent producer may start with WRITE on any topic).

    True if an ALLOW pattern exists that no DENY for the caller covers: a DENY on the literal
    wildcard covers everything, a DENY prefix covers the allowed names starting with it, a DENY
    literal covers the same literal.
    """
    if principal in policy.super_users:
        return True
    allowing = allowing_operations(operation)
    relevant = [b for b in acls if b.resource_type is resource_type]
    mine = [b for b in relevant if applies_to_caller(b, principal, host)]
    denies = [
        b
        for b in mine
        if b.permission is Permission.DENY and b.operation in (operation, Operation.ALL)
    ]
    allows = [b for b in mine if b.permission is Permission.ALLOW and b.operation in allowing]
    for allow in allows:
        if not any(_covers(deny, allow) for deny in denies):
            return True
    if not relevant:
        return policy.allow_everyone_if_no_acl_found
    return False


def _covers(deny: AclBinding, allow: AclBinding) -> bool:
    """Whether ``deny`` denies every resource ``allow`` allows."""
    if deny.pattern_type is PatternType.LITERAL and deny.resource_name == WILDCARD:
        return True
    if deny.pattern_type is PatternType.PREFIXED:
        return allow.resource_name.startswith(deny.resource_name)
    return allow.pattern_type is PatternType.LITERAL and deny.resource_name == allow.resource_name
