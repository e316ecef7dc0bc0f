"""DescribeConfigs / IncrementalAlterConfigs / AlterConfigs of a GROUP resource (type 32).

Kafka 4.x serves a consumer group's own configs this way (``kafka-configs --entity-type
groups``, ``Admin.incrementalAlterConfigs`` on ``ConfigResource.Type.GROUP``). Every broker
answers: the configs live in etcd and in each broker's view (``groups.config_store``), and the
group need not exist (Kafka accepts configs for a group before its first member). Rules and
validation are ``groups.group_configs``; this module is the thin shell the admin handlers call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kafscale.broker.api.config_sources import ConfigSource, Synonym, synonym_bodies
from kafscale.broker.api.configs import ConfigType
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.groups import group_configs
from kafscale.broker.groups.config_store import update_group_configs
from kafscale.broker.groups.coordinator import share_config
from kafscale.broker.protocol.errors import ErrorCode, KafkaError

GROUP_RESOURCE = 32


def check_group_name(name: str) -> None:
    if not name:
        raise KafkaError("Group name must not be empty", ErrorCode.INVALID_REQUEST)


def describe_group(name: str, wanted: Any, include_synonyms: bool, ctx: RequestContext) -> Body:
    """The group's configs: its own where set (source GROUP_CONFIG), else the broker's."""
    try:
        check_group_name(name)
    except KafkaError as exc:
        return {"error_code": exc.code, "error_message": str(exc), "configs": []}
    settings = ctx.broker.settings.groups
    own = ctx.broker.view.group_configs.get(name, {})
    share = group_configs.share_defaults(share_config(settings))
    broker = {**group_configs.defaults(settings), **share}
    every = (*group_configs.GROUP_CONFIG_NAMES, *group_configs.SHARE_CONFIG_NAMES)
    names = [n for n in every if not wanted or n in wanted]
    entries = [_entry(n, own.get(n), broker[n], include_synonyms) for n in names]
    return {"error_code": ErrorCode.NONE, "configs": entries}


def _entry(name: str, own: str | None, broker: str, include_synonyms: bool) -> Body:
    synonyms = [Synonym(name, own, ConfigSource.GROUP_CONFIG)] if own is not None else []
    synonym = {**group_configs.BROKER_SYNONYMS, **group_configs.SHARE_BROKER_SYNONYMS}.get(name)
    synonyms.append(Synonym(synonym or name, broker, ConfigSource.DEFAULT_CONFIG))
    kind = ConfigType.STRING if name in group_configs.SHARE_CHOICES else ConfigType.INT
    return {
        "name": name,
        "value": own if own is not None else broker,
        "read_only": False,
        "config_source": int(synonyms[0].source),
        "is_sensitive": False,
        "synonyms": synonym_bodies(synonyms, include_synonyms),
        "config_type": int(kind),
        "documentation": None,
    }


async def alter_group(
    name: str,
    changes: Mapping[str, str | None],
    validate_only: bool,
    ctx: RequestContext,
    replace_all: bool = False,
) -> None:
    """Set (value) or remove (None) the group's configs, validated as a whole as Kafka does;
    ``replace_all`` (AlterConfigs): configs not in ``changes`` go back to the default."""
    check_group_name(name)
    group_configs.check_names(list(changes))
    settings = ctx.broker.settings.groups

    def change(current: Mapping[str, str]) -> dict[str, str]:
        updated = group_configs.apply_changes({} if replace_all else current, changes)
        group_configs.validate(updated, settings)
        return updated

    if validate_only:
        change(ctx.broker.view.group_configs.get(name, {}))
        return
    broker = ctx.broker
    stored = await update_group_configs(broker.etcd, broker.cluster, name, change)
    # Our own view now, not one watch round trip later (the watch brings the same).
    if stored:
        broker.view.group_configs[name] = stored
    else:
        broker.view.group_configs.pop(name, None)
