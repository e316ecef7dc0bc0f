"""The data source's options, parsed once on the driver into frozen values.

Connection options are named like the broker's settings (``etcd.endpoints``, ``cluster``,
``storage.kind``, ``storage.bucket`` ...). Whatever a job does not set comes from the broker's
own configuration model, ``BrokerSettings``, and so from the same ``KAFSCALE_*`` environment
variables a broker reads: a job started next to a broker needs no connection options at all.
The resolved values travel to the executors inside the reader (nothing there reads the
environment, which may differ). Where no ``KAFSCALE_*`` variable is set, the model's defaults
are the sections' own, and the model (pydantic-settings, the listener and TLS settings) is not
imported: Spark starts a planner process per query, on a clock (see ``store_settings``).

Options and variables that cannot apply together are checked by the broker's own rules
(``settings_combinations``): a bucket or S3 credentials with ``storage.kind=local``, a local
directory with an S3 store, half of an S3 credential pair, of an etcd login or of a client
certificate are refused, as ``kafscale broker`` refuses them, instead of being ignored (the
query then read another store than the user meant, or none); TLS files for an etcd reached over
http:// only are a warning.

The other options are those of Spark's Kafka source, with its names and meanings. A wrong or
missing option is a ``SourceOptionError`` with a message naming the option, raised on the
driver before any task starts.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import SecretStr, ValidationError

from kafscale.broker.settings_names import env_name
from kafscale.broker.store_settings import (
    DEFAULT_CLUSTER,
    ENV_PREFIX,
    EtcdSettings,
    StorageKind,
    StorageSettings,
)

S = TypeVar("S", EtcdSettings, StorageSettings)

EARLIEST = -2
LATEST = -1

log = logging.getLogger(__name__)


class SourceOptionError(ValueError):
    """An option is missing, unknown in combination, or malformed."""


@dataclass(frozen=True, slots=True)
class Connection:
    """Where the cluster's metadata and objects are: everything an executor needs to read."""

    cluster: str
    etcd: EtcdSettings
    storage: StorageSettings


@dataclass(frozen=True, slots=True)
class Subscription:
    """Exactly one of Spark's three ways to name partitions."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assign: tuple[tuple[str, int], ...] = ()

    def matches(self, topic: str) -> bool:
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        if self.assign:
            return any(t == topic for t, _ in self.assign)
        return topic in self.topics


OffsetSpec = int | dict[str, dict[int, int]]
"""``EARLIEST``, ``LATEST``, or per topic and partition an offset (-2 earliest, -1 latest)."""


@dataclass(frozen=True, slots=True)
class ReadOptions:
    connection: Connection
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp_ms: int | None
    max_offsets_per_trigger: int | None
    min_offsets_per_trigger: int | None
    max_trigger_delay_ms: int
    fail_on_data_loss: bool
    include_headers: bool
    min_partitions: int | None

    def for_executors(self) -> TaskReading:
        """What the executors get: the store and two flags, never the etcd settings."""
        return TaskReading(
            cluster=self.connection.cluster,
            storage=self.connection.storage,
            include_headers=self.include_headers,
            fail_on_data_loss=self.fail_on_data_loss,
        )


def store_identity(storage: StorageSettings) -> str:
    """The key under which a process keeps the store opened for ``storage``. Secrets count:
    pydantic's dump masks them, so a store opened with old credentials would otherwise serve
    a query that gives new ones (after a rotation, until Spark restarts the worker)."""
    values = {
        name: value.get_secret_value() if isinstance(value, SecretStr) else str(value)
        for name, value in storage.model_dump().items()
    }
    return json.dumps(values, sort_keys=True)


@dataclass(frozen=True, slots=True)
class TaskReading:
    """Everything an executor needs to read its tasks, and nothing more.

    Only the driver talks to etcd; executors GET objects. So the etcd endpoints, password, and
    certificate paths stay on the driver: Spark pickles the reader into every task, where
    they would be readable by whatever else runs on the executors (and in their dumps)."""

    cluster: str
    """The objects' key prefix."""
    storage: StorageSettings
    include_headers: bool
    fail_on_data_loss: bool


_STORAGE_OPTIONS = {
    "storage.kind": "kind",
    "storage.bucket": "bucket",
    "storage.prefix": "prefix",
    "storage.endpoint": "endpoint",
    "storage.region": "region",
    "storage.local_dir": "local_dir",
    "storage.access_key_id": "access_key_id",
    "storage.secret_access_key": "secret_access_key",
    "storage.timeout_s": "timeout_s",
    "storage.max_concurrency": "max_concurrency",
}


_ETCD_SECURITY_OPTIONS = {
    "etcd.ca_file": "ca_file",
    "etcd.cert_file": "cert_file",
    "etcd.key_file": "key_file",
    "etcd.username": "username",
    "etcd.password": "password",
}


def _etcd_security_value(name: str, value: str) -> Any:
    """An option's text as the settings field takes it; an empty text unsets the field (an
    option overrides a ``KAFSCALE_ETCD__*`` variable the job's environment happens to set)."""
    if not value.strip():
        return None
    if name == "password":
        return SecretStr(value)
    if name.endswith("_file"):
        return Path(value)
    return value


def sets_broker_settings(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` has a variable the broker's settings model may read: one named with
    its prefix, in any case (pydantic-settings ignores the case of names)."""
    return any(name.upper().startswith(ENV_PREFIX) for name in environ)


def configured_connection() -> Connection:
    """The connection the broker's settings give: their defaults and ``KAFSCALE_*`` (the
    sections know which of their fields a variable set: ``model_fields_set``)."""
    if not sets_broker_settings(os.environ):  # the defaults, without the whole model
        return Connection(DEFAULT_CLUSTER, EtcdSettings(), StorageSettings())
    from kafscale.broker.config import BrokerSettings
    from kafscale.broker.settings_check import describe_errors, unparsable_variables

    problems = unparsable_variables(os.environ, BrokerSettings)
    if not problems:
        try:
            settings = BrokerSettings()
        except ValidationError as exc:
            problems = describe_errors(exc, BrokerSettings)
        else:
            return Connection(settings.cluster, settings.etcd, settings.storage)
    raise SourceOptionError(f"the KAFSCALE_* environment is not valid: {'; '.join(problems)}")


def parse_connection(options: Mapping[str, str]) -> Connection:
    """Connection options over the broker's settings (defaults and ``KAFSCALE_*``)."""
    base = configured_connection()
    storage: dict[str, Any] = {}
    for option, name in _STORAGE_OPTIONS.items():
        value = options.get(option)
        if value is None:
            continue
        if name in ("access_key_id", "secret_access_key"):
            storage[name] = SecretStr(value)
        elif name == "local_dir":
            storage[name] = Path(value)
        elif name == "kind":
            storage[name] = _kind(value)
        else:
            storage[name] = value
    etcd: dict[str, Any] = {}
    if "etcd.endpoints" in options:
        endpoints = tuple(e.strip() for e in options["etcd.endpoints"].split(",") if e.strip())
        if not endpoints:
            raise SourceOptionError("etcd.endpoints is empty")
        etcd["endpoints"] = endpoints
    if "etcd.timeout_s" in options:
        etcd["timeout_s"] = options["etcd.timeout_s"]
    for option, name in _ETCD_SECURITY_OPTIONS.items():
        value = options.get(option)
        if value is not None:
            etcd[name] = _etcd_security_value(name, value)
    try:
        connection = Connection(
            cluster=options.get("cluster", base.cluster),
            etcd=_given(EtcdSettings, base.etcd, etcd),
            storage=_given(StorageSettings, base.storage, storage),
        )
    except ValidationError as exc:
        raise SourceOptionError(f"bad connection option: {exc}") from exc
    _check_combinations(connection, options, base)
    return connection


def _given(model: type[S], base: S, options: dict[str, Any]) -> S:
    """``options`` over what the environment set in ``base``: the result's
    ``model_fields_set`` holds what a variable or an option gave (an empty option unsets)."""
    values = {**base.model_dump(include=base.model_fields_set), **options}
    return model.model_validate({name: v for name, v in values.items() if v is not None})


def _check_combinations(
    connection: Connection, options: Mapping[str, str], base: Connection
) -> None:
    """The broker's rules for settings that cannot apply together: refused ones raise, naming
    the option or variable that gave each setting; the others are logged once per query."""
    from kafscale.broker.settings_combinations import renamed, store_combinations

    from_environment = {("storage", name) for name in base.storage.model_fields_set}
    from_environment |= {("etcd", name) for name in base.etcd.model_fields_set}

    def name_of(path: tuple[str, ...]) -> str:
        option = ".".join(path)
        if option not in options and path in from_environment:
            return env_name(path)
        return f"option {option}"

    found = store_combinations(connection.storage, connection.etcd)
    if found.refused:
        raise SourceOptionError("; ".join(renamed(line, name_of) for line in found.refused))
    for line in found.warned:
        log.warning("%s", renamed(line, name_of))


def connection_options(connection: Connection) -> dict[str, str]:
    """``connection`` as options again: a job resolves the connection in its own process (where
    its ``KAFSCALE_*`` variables are) and hands it to Spark explicitly. Spark's planner runs in
    Python processes started by the JVM, which see the environment the session started with.
    Only the store settings of its kind are given (a bucket beside ``kind=local`` is refused)."""
    storage = connection.storage
    options = {
        "cluster": connection.cluster,
        "etcd.endpoints": ",".join(connection.etcd.endpoints),
        "etcd.timeout_s": str(connection.etcd.timeout_s),
        "storage.kind": storage.kind.value,
        "storage.prefix": storage.prefix,
        "storage.timeout_s": str(storage.timeout_s),
        "storage.max_concurrency": str(storage.max_concurrency),
    }
    etcd = connection.etcd
    for option, name in _ETCD_SECURITY_OPTIONS.items():
        value = getattr(etcd, name)
        if value is not None:
            options[option] = _text(value)
    if storage.kind is StorageKind.LOCAL:
        return options | {"storage.local_dir": str(storage.local_dir)}
    options |= {"storage.bucket": storage.bucket, "storage.region": storage.region}
    for name in ("endpoint", "access_key_id", "secret_access_key"):
        value = getattr(storage, name)
        if value is not None:
            options[f"storage.{name}"] = _text(value)
    return options


def _text(value: object) -> str:
    return value.get_secret_value() if isinstance(value, SecretStr) else str(value)


def _kind(value: str) -> StorageKind:
    try:
        return StorageKind(value.lower())
    except ValueError:
        raise SourceOptionError(f"storage.kind must be s3 or local, not {value!r}") from None


def parse_subscription(options: Mapping[str, str]) -> Subscription:
    given = [name for name in ("subscribe", "subscribePattern", "assign") if options.get(name)]
    if len(given) != 1:
        raise SourceOptionError(
            "set exactly one of the options subscribe, subscribePattern, assign"
            + (f" (got {', '.join(given)})" if given else "")
        )
    if given[0] == "subscribe":
        topics = tuple(t.strip() for t in options["subscribe"].split(",") if t.strip())
        if not topics:
            raise SourceOptionError("subscribe names no topic")
        return Subscription(topics=topics)
    if given[0] == "subscribePattern":
        try:
            re.compile(options["subscribePattern"])
        except re.error as exc:
            raise SourceOptionError(f"subscribePattern is not a regular expression: {exc}") from exc
        return Subscription(pattern=options["subscribePattern"])
    assigned = _json_object("assign", options["assign"])
    pairs: list[tuple[str, int]] = []
    for topic, partitions in assigned.items():
        if not isinstance(partitions, list) or not all(isinstance(p, int) for p in partitions):
            raise SourceOptionError(
                f"assign: {topic} must map to a list of partitions, e.g. [0, 1]"
            )
        pairs.extend((topic, p) for p in partitions)
    if not pairs:
        raise SourceOptionError("assign names no partition")
    return Subscription(assign=tuple(pairs))


def _json_object(name: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceOptionError(f"{name} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise SourceOptionError(f'{name} must be a JSON object like {{"topic": ...}}')
    return value


def parse_offsets(
    name: str, text: str | None, default: int, *, allow_latest: bool = True
) -> OffsetSpec:
    """``earliest`` / ``latest`` / ``{"topic": {"0": 23, "1": -2}}`` as in Spark's Kafka source."""
    if text is None:
        return default
    word = text.strip().lower()
    if word == "earliest":
        return EARLIEST
    if word == "latest":
        if not allow_latest:
            raise SourceOptionError(f"{name}=latest is not allowed here")
        return LATEST
    document = _json_object(name, text)
    spec: dict[str, dict[int, int]] = {}
    for topic, partitions in document.items():
        if not isinstance(partitions, dict):
            raise SourceOptionError(
                f'{name}: {topic} must map partitions to offsets, e.g. {{"0": 5}}'
            )
        try:
            spec[topic] = {int(p): int(o) for p, o in partitions.items()}
        except (TypeError, ValueError) as exc:
            raise SourceOptionError(f"{name}: bad partition or offset for {topic}: {exc}") from exc
        if any(o < EARLIEST for o in spec[topic].values()):
            raise SourceOptionError(f"{name}: offsets are >= 0, or -2 (earliest), -1 (latest)")
    return spec


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise SourceOptionError(f"{name} must be an integer, not {value!r}") from None
    if number < 1:
        raise SourceOptionError(f"{name} must be positive")
    return number


DEFAULT_MAX_TRIGGER_DELAY = "15m"

_TIME_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}
_TIME_UNITS_MS["d"] = 24 * _TIME_UNITS_MS["h"]


def parse_duration_ms(name: str, text: str) -> int:
    """A time as Spark writes it (``500ms``, ``30s``, ``15m``, ``1h``; no unit is ms)."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", text.lower())
    if match is None or match.group(2) not in (*_TIME_UNITS_MS, ""):
        raise SourceOptionError(f"{name} must be a time like 30s, 500ms or 15m, not {text!r}")
    return int(int(match.group(1)) * _TIME_UNITS_MS.get(match.group(2), 1))


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = options.get(name)
    if value is None:
        return default
    if value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise SourceOptionError(f"{name} must be true or false, not {value!r}")


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """All read options; batch reads default to earliest..latest, streams start at latest."""
    lowered = {k.lower(): v for k, v in options.items()}
    given = {name: lowered[name.lower()] for name in _KNOWN if name.lower() in lowered}
    starting_timestamp = None
    if given.get("startingTimestamp") is not None:
        try:
            starting_timestamp = int(given["startingTimestamp"])
        except ValueError:
            raise SourceOptionError(
                "startingTimestamp must be milliseconds since the epoch"
            ) from None
        if "startingOffsets" in given:
            raise SourceOptionError("set startingOffsets or startingTimestamp, not both")
    if streaming and "endingOffsets" in given:
        raise SourceOptionError("endingOffsets is for batch reads only")
    for name in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay"):
        if not streaming and name in given:
            raise SourceOptionError(f"{name} is for streaming reads only")
    max_offsets = _positive_int(given, "maxOffsetsPerTrigger")
    min_offsets = _positive_int(given, "minOffsetsPerTrigger")
    if min_offsets is not None and max_offsets is not None and min_offsets > max_offsets:
        raise SourceOptionError(
            f"minOffsetsPerTrigger ({min_offsets}) is higher than maxOffsetsPerTrigger "
            f"({max_offsets})"
        )
    return ReadOptions(
        connection=parse_connection(given),
        subscription=parse_subscription(given),
        starting=parse_offsets(
            "startingOffsets",
            given.get("startingOffsets"),
            LATEST if streaming else EARLIEST,
            allow_latest=streaming,
        ),
        ending=parse_offsets("endingOffsets", given.get("endingOffsets"), LATEST),
        starting_timestamp_ms=starting_timestamp,
        max_offsets_per_trigger=max_offsets,
        min_offsets_per_trigger=min_offsets,
        max_trigger_delay_ms=parse_duration_ms(
            "maxTriggerDelay", given.get("maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY)
        ),
        fail_on_data_loss=_bool(given, "failOnDataLoss", True),
        include_headers=_bool(given, "includeHeaders", False),
        min_partitions=_positive_int(given, "minPartitions"),
    )


_KNOWN = (
    "cluster",
    "etcd.endpoints",
    "etcd.timeout_s",
    *_ETCD_SECURITY_OPTIONS,
    *_STORAGE_OPTIONS,
    "subscribe",
    "subscribePattern",
    "assign",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "failOnDataLoss",
    "includeHeaders",
    "minPartitions",
)
