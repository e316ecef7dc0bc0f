"""``spec.authentication`` and ``spec.authorization`` of a KafScaleUser.

The user's SCRAM credential (and the Secret a password of the user's own comes from) and its
ACL rules, in the shape of Strimzi's KafkaUser. :mod:`models` assembles them into the user's
spec; ``users`` turns them into a credential and ACL bindings in etcd.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import ConfigDict, Field, model_validator

from kafscale.operator.model_base import ApiModel


class AuthenticationType(StrEnum):
    SCRAM_SHA_512 = "scram-sha-512"
    SCRAM_SHA_256 = "scram-sha-256"


class SecretKeySelector(ApiModel):
    name: str = Field(min_length=1, max_length=253, description="Name of the Secret.")
    key: str = Field(min_length=1, max_length=253, description="Key inside the Secret.")


class PasswordSource(ApiModel):
    secret_key_ref: SecretKeySelector = Field(description="The Secret key holding the password.")


class UserPassword(ApiModel):
    value_from: PasswordSource = Field(description="Where the password comes from.")


class UserAuthentication(ApiModel):
    type: AuthenticationType = Field(
        default=AuthenticationType.SCRAM_SHA_512,
        description="SASL mechanism whose credential is stored in etcd (as Strimzi's KafkaUser).",
    )
    password: UserPassword | None = Field(
        default=None,
        description="A password of yours (`valueFrom.secretKeyRef`, as Strimzi's KafkaUser); "
        "unset: the operator generates one into a Secret named after the user.",
    )


class AclResourceType(StrEnum):
    TOPIC = "topic"
    GROUP = "group"
    CLUSTER = "cluster"
    TRANSACTIONAL_ID = "transactionalId"


class AclPatternType(StrEnum):
    LITERAL = "literal"
    PREFIX = "prefix"


class AclOperation(StrEnum):
    ALL = "All"
    READ = "Read"
    WRITE = "Write"
    CREATE = "Create"
    DELETE = "Delete"
    ALTER = "Alter"
    DESCRIBE = "Describe"
    CLUSTER_ACTION = "ClusterAction"
    DESCRIBE_CONFIGS = "DescribeConfigs"
    ALTER_CONFIGS = "AlterConfigs"
    IDEMPOTENT_WRITE = "IdempotentWrite"


class AclRuleType(StrEnum):
    ALLOW = "allow"
    DENY = "deny"


class AclResource(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.type == 'cluster' || (has(self.name) && size(self.name) > 0)",
                    "message": "a topic, group or transactionalId resource needs a name",
                }
            ]
        }
    )

    type: AclResourceType = Field(description="topic, group, cluster or transactionalId.")
    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=249,
        description="Resource name ('*': every resource of the type); not used for cluster.",
    )
    pattern_type: AclPatternType = Field(
        default=AclPatternType.LITERAL,
        description="literal: the name exactly (or '*'); prefix: every name starting with it.",
    )

    @model_validator(mode="after")
    def _named_unless_cluster(self) -> AclResource:
        if self.type != AclResourceType.CLUSTER and not self.name:
            raise ValueError("a topic, group or transactionalId resource needs a name")
        return self


class AclRule(ApiModel):
    resource: AclResource = Field(description="What the rule is about.")
    operations: list[AclOperation] = Field(
        min_length=1, description="Operations the rule allows or denies."
    )
    host: str = Field(default="*", min_length=1, description="Client address ('*': any).")
    type: AclRuleType = Field(default=AclRuleType.ALLOW, description="allow or deny.")


class AuthorizationType(StrEnum):
    SIMPLE = "simple"


class UserAuthorization(ApiModel):
    type: AuthorizationType = Field(
        default=AuthorizationType.SIMPLE, description="simple: ACLs in etcd (Kafka's own model)."
    )
    acls: list[AclRule] = Field(
        default_factory=list,
        description="The user's ACL rules; the operator makes the bindings in etcd exactly these.",
    )
