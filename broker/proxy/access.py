"""The proxy's ACL checks, for the answers it makes itself (Metadata, FindCoordinator).

Everything else the proxy forwards, and the brokers authorize it as the client (the principal
travels in an Envelope). Metadata and FindCoordinator never reach a broker, so the proxy
decides them with the brokers' own pure authorizer, the ACLs its cluster watch already caches
and the brokers' authorizer settings: a client sees through the proxy exactly the topics it
would see at a broker.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafscale.broker.authz.authorizer import Access, Policy, authorize
from kafscale.broker.authz.model import Operation, ResourceType
from kafscale.broker.authz.store import AclCache
from kafscale.broker.config import AuthorizerSettings
from kafscale.broker.security.forwarding import peer_host


@dataclass(frozen=True, slots=True)
class ProxyAccess:
    settings: AuthorizerSettings
    acls: AclCache

    @property
    def policy(self) -> Policy:
        return Policy(
            frozenset(self.settings.super_users), self.settings.allow_everyone_if_no_acl_found
        )

    def allowed(
        self,
        principal: str,
        peer: str,
        operation: Operation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        if not self.settings.enabled:
            return True
        access = Access(principal, peer_host(peer), operation, resource_type, name)
        return authorize(access, self.acls.index.covering(resource_type, name), self.policy)

    def operations(
        self,
        principal: str,
        peer: str,
        resource_type: ResourceType,
        name: str,
        candidates: tuple[Operation, ...],
    ) -> int:
        """Kafka's ``authorized_operations`` bit field: bit ``op`` for each allowed one."""
        return sum(
            1 << op for op in candidates if self.allowed(principal, peer, op, resource_type, name)
        )
