"""DescribeConfigs through the proxy: each resource goes to a broker that can answer it.

Clients see the proxy as broker ``listener.node_id`` (1000 by default) and ask DescribeConfigs
for that broker: the Java AdminClient's ``describeConfigs`` on a node from ``describeCluster``,
kafka-ui, ``kafka-configs --describe --entity-type brokers``. No broker has that id, and a
broker describes only itself, so the proxy asks a live broker for its own configs under that
broker's id and answers them as the proxy's: the proxy's id, name and advertised listener. With
``routing.expose_owners`` clients also see the real broker ids; a resource naming one of them
goes to that broker. Topics and the cluster default (``""``) go to any broker.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

BROKER_RESOURCE = 4
ANY = -1  # a resource any broker answers (asked of one, another if it cannot be reached)


@dataclass(frozen=True, slots=True)
class Target:
    """Where one resource is asked: a broker id, or ``ANY``; ``as_proxy``: it names the proxy
    (asked under the answering broker's id, answered under the proxy's)."""

    broker: int
    as_proxy: bool = False


def plan(resources: Sequence[Any], proxy_id: int, live: Collection[int]) -> list[Target]:
    """Each resource's target, in the request's order (a pure decision)."""
    targets = []
    for resource in resources:
        name = str(resource.resource_name)
        if int(resource.resource_type) != BROKER_RESOURCE:
            targets.append(Target(ANY))
        elif name == str(proxy_id):
            targets.append(Target(ANY, as_proxy=True))
        elif name.isdigit() and int(name) in live:
            targets.append(Target(int(name)))
        else:  # "" (the cluster default) or an unknown id, which any broker refuses alike
            targets.append(Target(ANY))
    return targets


def as_broker(resource: Any, broker: int) -> Any:
    """The proxy's resource, asked of ``broker`` under its own id."""
    return dataclasses.replace(resource, resource_name=str(broker))


def as_proxy(result: Any, proxy_id: int, listeners: Mapping[str, str]) -> Any:
    """A broker's description of itself, as the proxy's: its id and its own ``listeners``
    configs (``api.configs.listener_values``), in each entry's value and in its synonyms of the
    same name."""
    own = {"broker.id": str(proxy_id), "node.id": str(proxy_id), **listeners}
    configs = tuple(
        _as_own(config, own[config.name]) if config.name in own else config
        for config in result.configs
    )
    return dataclasses.replace(result, resource_name=str(proxy_id), configs=configs)


def _as_own(config: Any, value: str) -> Any:
    synonyms = tuple(
        dataclasses.replace(synonym, value=value) if synonym.name == config.name else synonym
        for synonym in getattr(config, "synonyms", ())
    )
    return dataclasses.replace(config, value=value, synonyms=synonyms)
