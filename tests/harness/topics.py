"""Topics created through a real admin client (confluent-kafka), as users create them."""

from __future__ import annotations

from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic


def create_topics(
    bootstrap: str,
    names: list[str],
    partitions: int,
    topic_config: dict[str, str] | None = None,
    **config: Any,
) -> None:
    """Create ``names`` with ``partitions`` each (and ``topic_config``), through an admin client
    configured with ``config``; raises if the broker refuses one."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **config})
    new = [NewTopic(n, partitions, 1, config=topic_config or {}) for n in names]
    for future in admin.create_topics(new).values():
        future.result(30)


def create_topic(
    bootstrap: str,
    topic: str,
    partitions: int,
    topic_config: dict[str, str] | None = None,
    **config: Any,
) -> None:
    create_topics(bootstrap, [topic], partitions, topic_config, **config)
