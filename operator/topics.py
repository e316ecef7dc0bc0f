"""KafScaleTopic → the topic record in etcd (``topics/<name>``).

The record is the broker's own format, ``{"topic_id": str, "partitions": int, "configs": {}}``;
partition states are created lazily by the broker that first owns a partition. Partitions may
grow, never shrink (Kafka cannot remove partitions): a decrease is refused and reported. A
record that already exists (created through the Kafka API, say) is adopted with its topic id.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_txn import create_revision_is, mod_revision_is, put_op
from kafscale.operator.models import KafScaleTopicSpec

CAS_ATTEMPTS = 5


@dataclass(frozen=True)
class TopicRecord:
    topic_id: str
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> bytes:
        document = {
            "topic_id": self.topic_id,
            "partitions": self.partitions,
            "configs": self.configs,
        }
        return json.dumps(document).encode()

    @classmethod
    def from_json(cls, data: bytes) -> TopicRecord:
        document: dict[str, Any] = json.loads(data)
        configs = {str(k): str(v) for k, v in (document.get("configs") or {}).items()}
        return cls(str(document["topic_id"]), int(document["partitions"]), configs)


@dataclass(frozen=True)
class TopicProblem:
    reason: str  # a condition reason (CamelCase)
    message: str


@dataclass(frozen=True)
class TopicDecision:
    record: TopicRecord  # what etcd should hold afterwards
    write: bool  # whether that differs from what it holds
    problem: TopicProblem | None = None


def decide_topic(
    current: TopicRecord | None, spec: KafScaleTopicSpec, new_topic_id: str
) -> TopicDecision:
    """Pure: the record to write for ``spec`` given the stored one."""
    configs = dict(sorted(spec.configs.items()))
    if current is None:
        return TopicDecision(TopicRecord(new_topic_id, spec.partitions, configs), write=True)
    problem = None
    partitions = spec.partitions
    if spec.partitions < current.partitions:
        problem = TopicProblem(
            "PartitionDecreaseRejected",
            f"the topic has {current.partitions} partitions; partitions can only grow "
            f"(spec asks for {spec.partitions})",
        )
        partitions = current.partitions
    record = TopicRecord(current.topic_id, partitions, configs)
    return TopicDecision(record, write=record != current, problem=problem)


def topic_name(spec: KafScaleTopicSpec, resource_name: str) -> str:
    return spec.topic_name or resource_name


async def reconcile_topic(
    etcd: Etcd, cluster: str, name: str, spec: KafScaleTopicSpec
) -> TopicDecision:
    """Create or update the record (compare-and-swap, retried when someone else wrote)."""
    key = keys.topic_key(cluster, name)
    for _ in range(CAS_ATTEMPTS):
        kv = await etcd.get(key)
        current = TopicRecord.from_json(kv.value) if kv is not None else None
        decision = decide_topic(current, spec, uuid.uuid4().hex)
        if not decision.write:
            return decision
        guard = mod_revision_is(key, kv.mod_revision) if kv else create_revision_is(key, 0)
        result = await etcd.txn([guard], [put_op(key, decision.record.to_json())])
        if result.succeeded:
            return decision
    raise RuntimeError(f"topic {name} kept changing in etcd; gave up after retries")
