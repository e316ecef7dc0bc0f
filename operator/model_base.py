"""The base of every custom-resource model, and the field types the resources share.

Why a module of its own: the cluster's spec sections, its status, the topic and the user all
derive from :class:`ApiModel` (camelCase on the wire, frozen, unknown fields refused) and use
the same quantities, container resources and conditions; each model module imports only this.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

# A Kubernetes resource quantity ("500m", "1Gi", 2): int-or-string in the schema.
Quantity = Annotated[int | str, Field(json_schema_extra={"x-kubernetes-int-or-string": True})]


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_enum_values=True,
        validate_default=True,
    )

    def to_api(self) -> dict[str, Any]:
        """The camelCase JSON form, without unset optional fields."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class ResourceRequirements(ApiModel):
    """CPU and memory requests and limits, as in a Pod's container."""

    requests: dict[str, Quantity] | None = Field(default=None, description="Minimum resources.")
    limits: dict[str, Quantity] | None = Field(default=None, description="Maximum resources.")


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ApiModel):
    """One condition of a resource's status, after the Kubernetes API conventions."""

    type: str = Field(description="Ready, Progressing, Degraded or FeaturesSupported.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason of the last transition.")
    message: str = Field(default="", description="Human-readable details.")
    last_transition_time: str = Field(description="When the status last changed (RFC 3339).")
    observed_generation: int | None = Field(
        default=None, description="Generation this was computed for."
    )
