"""Topics created through a real admin client (confluent-kafka), as users create them."""

from __future__ import annotations

from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic


def create_topics(bootstrap: str, names: list[str], partitions: int, **config: Any) -> None:
    """Create ``names`` with ``partitions`` each; raises if the broker refuses one."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **config})
    for future in admin.create_topics([NewTopic(n, partitions, 1) for n in names]).values():
        future.result(30)


def create_topic(bootstrap: str, topic: str, partitions: int, **config: Any) -> None:
    create_topics(bootstrap, [topic], partitions, **config)
