"""A topic's record in etcd (``topics/<name>``): its id, partition count and configs.

Its own module, with nothing but the standard library, because the Spark source's planner
reads topic records too and should not import the broker's live cluster view (``cluster``,
which re-exports it) with its ACL, quota and watch machinery.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: str
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return json.dumps(
            {"topic_id": self.topic_id, "partitions": self.partitions, "configs": self.configs}
        ).encode()

    @classmethod
    def from_json(cls, name: str, data: bytes) -> TopicInfo:
        document = json.loads(data)
        configs = {str(k): str(v) for k, v in document.get("configs", {}).items()}
        return cls(name, str(document["topic_id"]), int(document["partitions"]), configs)
