"""The one module that talks to kio (the Kafka wire-format library).

kio generates one frozen dataclass per API, version and nested structure. Handlers would
otherwise have to know which fields exist in which version; instead they return plain
dictionaries shaped like the newest version, and :func:`build_entity` turns them into the
entity of the version the client asked for: fields the version lacks are dropped, fields the
handler left out get their default (or the type's zero value), and milliseconds, error codes
and UUIDs are converted to kio's types. Requests stay kio entities: handlers read them with
``getattr(request, name, default)`` where a field is version-dependent.

Dropping the fields a version lacks must not hide a misspelt key (it would vanish from every
version and the client would see a default: an error code of 0, an empty success). So
:func:`encode_response` refuses a key that no version of the response has, at any depth
(``UnknownResponseField``), and :func:`has_error_code` tells whether a version has a top-level
error code at all, so that an error is never encoded into a response that cannot carry it.

kio's API has moved between releases, so it is pinned and nothing else imports it but
:mod:`legacy_schemas`, the layouts of the versions kio lacks, written the way kio writes its own
(imported on first use: see :func:`_legacy_schema`).
"""

from __future__ import annotations

import datetime
import functools
import importlib
import io
import struct
import uuid
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields, is_dataclass
from types import NoneType, UnionType
from typing import Any, get_args, get_origin, get_type_hints

from kio.index import load_request_schema, load_response_schema
from kio.schema.default_principal_data.v0.data import DefaultPrincipalData
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from kafscale.broker.protocol import guard

_HEADER_PREFIX = struct.Struct(">hhi")
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


class DecodeError(Exception):
    """The frame's body could not be parsed as the request its header names."""


class UnknownApi(Exception):
    """kio has no schema for this API key and version."""


class UnknownResponseField(ValueError):
    """A handler's response names a field that no version of the response has (a typo)."""


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


@dataclass(frozen=True, slots=True)
class DecodedRequest:
    header: RequestHeader
    body: Any


def peek_header(frame: bytes | memoryview) -> tuple[int, int, int]:
    """(api key, api version, correlation id) from the fixed start every header shares."""
    if len(frame) < _HEADER_PREFIX.size:
        raise DecodeError("frame shorter than a request header")
    api_key, api_version, correlation_id = _HEADER_PREFIX.unpack_from(frame, 0)
    return api_key, api_version, correlation_id


# Schemas by (api key, version), looked up for every request and response: kio resolves each
# through the import system (pkgutil.resolve_name), ~7% of the event loop's py-spy samples at
# 1000 records/s in small produce requests. Only versions a handler supports are looked up, so
# the caches stay small.
@functools.lru_cache(maxsize=1024)
def request_schema(api_key: int, api_version: int) -> type[Any]:
    try:
        return load_request_schema(api_key, api_version)
    except Exception as exc:  # kio raises its own index errors
        legacy = _legacy_schema(api_key, api_version, response=False)
        if legacy is None:
            raise UnknownApi(f"no schema for api {api_key} v{api_version}") from exc
        return legacy


LEGACY_APIS = frozenset({0, 1, 2, 8, 9, 27})
"""The APIs that have versions in :mod:`legacy_schemas` (a unit test keeps the two in step)."""


def _legacy_schema(api_key: int, api_version: int, *, response: bool) -> type[Any] | None:
    """The :mod:`legacy_schemas` layout of a version kio lacks (kio has none of them, which a
    unit test checks, so asking kio first finds the same schema), or None.

    Imported only for the APIs that have one: the module and the kio versions it builds on
    cost ~0.1 s of CPU, which a broker whose clients never send an old version, and every
    proxy and CLI command, would otherwise pay at start."""
    if api_key not in LEGACY_APIS:
        return None
    from kafscale.broker.protocol import legacy_schemas

    table = legacy_schemas.RESPONSES if response else legacy_schemas.REQUESTS
    return table.get((api_key, api_version))


def decode_request(frame: bytes | memoryview, schema: type[Any]) -> DecodedRequest:
    """Parse header and body of ``frame`` (without its length prefix); kio refuses a writable
    buffer, so a memoryview must be read-only."""
    header_schema = schema.__header_schema__
    try:
        header_edits = guard.check_header(header_schema, frame)
        if header_edits:  # tagged fields in the header, which kio would refuse
            frame = guard.apply_edits(frame, header_edits)
        header, header_size = entity_reader(header_schema)(frame, 0)
        edits = guard.check_body(schema, frame, header_size)  # before kio reserves memory
        if edits:  # tagged fields kio does not know, which it would refuse: cut them out
            frame = guard.apply_edits(frame, edits)
        body, _ = entity_reader(schema)(frame, header_size)
    except Exception as exc:
        raise DecodeError(f"cannot parse {schema.__name__}: {exc}") from exc
    decoded_header = RequestHeader(
        api_key=int(header.request_api_key),
        api_version=int(header.request_api_version),
        correlation_id=int(header.correlation_id),
        client_id=header.client_id,
    )
    return DecodedRequest(decoded_header, body)


@functools.lru_cache(maxsize=1024)
def response_schema(api_key: int, api_version: int) -> type[Any]:
    try:
        return load_response_schema(api_key, api_version)
    except Exception:  # kio raises its own index errors
        legacy = _legacy_schema(api_key, api_version, response=True)
        if legacy is None:
            raise
        return legacy


_MAX_VERSION_PROBED = 32


@functools.lru_cache(maxsize=256)
def response_fields(api_key: int) -> FieldTree:
    """Every field name any version of this API's response has, nested structures merged by
    field name (``{name: subtree or None}``)."""
    tree: dict[str, Any] = {}
    for version in range(_MAX_VERSION_PROBED):
        try:
            schema = response_schema(api_key, version)
        except Exception:  # kio raises its own index errors for versions it lacks
            continue
        _merge_fields(tree, schema)
    return tree


@functools.lru_cache(maxsize=1024)
def version_fields(api_key: int, api_version: int) -> FieldTree:
    """The field names of this one version's response, in the shape of ``response_fields``."""
    tree: FieldTree = {}
    _merge_fields(tree, response_schema(api_key, api_version))
    return tree


def check_known_keys(api_key: int, api_version: int, body: Mapping[str, Any]) -> None:
    """``UnknownResponseField`` for a key no version of the response has. Checked against the
    asked version first: a key it has exists, and the union of every version (``response_fields``
    loads all of the API's response schemas, ~80 ms of CPU for Produce or Metadata, once per
    process) is built only for a body with keys that version lacks, not for a broker's first
    answer of each API."""
    try:
        check_response_keys(version_fields(api_key, api_version), body)
    except UnknownResponseField:
        check_response_keys(response_fields(api_key), body)


FieldTree = dict[str, Any]


def _merge_fields(tree: FieldTree, entity_type: type[Any]) -> None:
    hints = get_type_hints(entity_type)
    for field in fields(entity_type):
        inner = _strip_none(hints[field.name])
        if get_origin(inner) is tuple:
            inner = get_args(inner)[0]
        if isinstance(inner, type) and is_dataclass(inner):
            subtree = tree.get(field.name) or {}
            _merge_fields(subtree, inner)
            tree[field.name] = subtree
        else:
            tree.setdefault(field.name, None)


def check_response_keys(tree: FieldTree, body: Mapping[str, Any], path: str = "") -> None:
    """Raise ``UnknownResponseField`` for a key of ``body`` (at any depth) not in ``tree``."""
    for key, value in body.items():
        if key not in tree:
            raise UnknownResponseField(f"response field {path}{key!r} exists in no version")
        subtree = tree[key]
        if subtree is None or value is None:
            continue
        if isinstance(value, Mapping):
            check_response_keys(subtree, value, f"{path}{key}.")
        elif isinstance(value, list | tuple):
            for item in value:
                if isinstance(item, Mapping):
                    check_response_keys(subtree, item, f"{path}{key}[].")


def has_error_code(api_key: int, api_version: int) -> bool:
    """Whether this response version has a top-level ``error_code`` an error can go into."""
    try:
        schema = response_schema(api_key, api_version)
    except Exception:
        return False
    return any(field.name == "error_code" for field in fields(schema))


def encode_response(
    api_key: int, api_version: int, correlation_id: int, body: Mapping[str, Any]
) -> bytes:
    """A whole response frame (length prefix, header, body) for ``body`` at this version."""
    schema = response_schema(api_key, api_version)
    check_known_keys(api_key, api_version, body)
    entity = build_entity(schema, body)
    header_schema = schema.__header_schema__
    buffer = io.BytesIO()
    buffer.write(b"\x00\x00\x00\x00")
    entity_writer(header_schema)(buffer, header_schema(correlation_id=correlation_id))
    entity_writer(schema)(buffer, entity)
    frame = buffer.getbuffer()
    struct.pack_into(">i", frame, 0, len(frame) - 4)
    return bytes(frame)


def encode_request(
    api_key: int,
    api_version: int,
    correlation_id: int,
    body: Any,
    client_id: str | None = "kafscale",
) -> bytes:
    """A request frame; used by the proxy, and by tests and tools that speak to a broker
    directly. The proxy passes its client's ``client_id`` on (group members are named by it)."""
    schema = request_schema(api_key, api_version)
    entity = body if isinstance(body, schema) else build_entity(schema, body)
    header_schema = schema.__header_schema__
    buffer = io.BytesIO()
    buffer.write(b"\x00\x00\x00\x00")
    header = header_schema(
        request_api_key=api_key,
        request_api_version=api_version,
        correlation_id=correlation_id,
        client_id=client_id,
    )
    entity_writer(header_schema)(buffer, header)
    entity_writer(schema)(buffer, entity)
    frame = buffer.getbuffer()
    struct.pack_into(">i", frame, 0, len(frame) - 4)
    return bytes(frame)


def decode_response(frame: bytes, api_key: int, api_version: int) -> Any:
    """Parse a response frame body (without length prefix); for tests and tools."""
    schema = response_schema(api_key, api_version)
    _, header_size = entity_reader(schema.__header_schema__)(frame, 0)
    body, _ = entity_reader(schema)(frame, header_size)
    return body


# --- dict -> entity ---------------------------------------------------------------------------


def build_entity(entity_type: type[Any], data: Mapping[str, Any]) -> Any:
    """The ``entity_type`` instance holding ``data``; see the module docstring."""
    kwargs = {}
    for name, convert in _field_plan(entity_type):
        kwargs[name] = convert(data.get(name, MISSING))
    return entity_type(**kwargs)


_PLANS: dict[type[Any], tuple[tuple[str, Callable[[Any], Any]], ...]] = {}


def _field_plan(entity_type: type[Any]) -> tuple[tuple[str, Callable[[Any], Any]], ...]:
    plan = _PLANS.get(entity_type)
    if plan is None:
        plan = _PLANS[entity_type] = _make_plan(entity_type)
    return plan


def _make_plan(entity_type: type[Any]) -> tuple[tuple[str, Callable[[Any], Any]], ...]:
    hints = get_type_hints(entity_type)
    plan = []
    for field in fields(entity_type):
        default: Any = field.default
        factory: Any = field.default_factory
        if default is MISSING and factory is not MISSING:
            default = factory()
        kafka_type = field.metadata.get("kafka_type", "")
        plan.append((field.name, _converter(hints[field.name], kafka_type, default)))
    return tuple(plan)


def _converter(annotation: Any, kafka_type: str, default: Any) -> Callable[[Any], Any]:
    nullable = _is_nullable(annotation)
    inner = _strip_none(annotation)
    if get_origin(inner) is tuple:
        item_type = get_args(inner)[0]
        item = _value_converter(item_type, kafka_type)

        def convert_tuple(value: Any) -> Any:
            if value is MISSING:
                return default if default is not MISSING else (None if nullable else ())
            if value is None:
                return None if nullable else ()
            return tuple(item(v) for v in value)

        return convert_tuple

    scalar = _value_converter(inner, kafka_type)
    zero = _zero_value(inner, kafka_type)

    def convert_scalar(value: Any) -> Any:
        if value is MISSING:
            if default is not MISSING:
                return default
            return None if nullable else scalar(zero)
        if value is None:
            return None if nullable else scalar(zero)
        return scalar(value)

    return convert_scalar


def _value_converter(value_type: Any, kafka_type: str) -> Callable[[Any], Any]:
    if isinstance(value_type, type) and is_dataclass(value_type):
        entity_type: type[Any] = value_type
        return lambda v: v if isinstance(v, entity_type) else build_entity(entity_type, v)
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return _to_timedelta
    if kafka_type == "datetime_i64":
        return _to_datetime
    if kafka_type == "error_code":
        return lambda v: ErrorCode(int(v))
    if kafka_type == "uuid":
        return _to_uuid
    if kafka_type in ("bytes", "records"):
        return lambda v: bytes(v)
    if isinstance(value_type, type) and issubclass(value_type, int) and value_type is not bool:
        return lambda v: value_type(int(v))
    return lambda v: v


def _zero_value(value_type: Any, kafka_type: str) -> Any:
    if kafka_type in ("string",):
        return ""
    if kafka_type in ("bytes", "records"):
        return b""
    if kafka_type == "bool":
        return False
    if kafka_type == "uuid":
        return uuid.UUID(int=0)
    if kafka_type == "float64":
        return 0.0
    if is_dataclass(value_type):
        return {}
    return 0


def _to_timedelta(value: Any) -> datetime.timedelta:
    if isinstance(value, datetime.timedelta):
        return value
    return datetime.timedelta(milliseconds=int(value))


def _to_datetime(value: Any) -> datetime.datetime:
    if isinstance(value, datetime.datetime):
        return value
    return _EPOCH + datetime.timedelta(milliseconds=int(value))


def _to_uuid(value: Any) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, bytes):
        return uuid.UUID(bytes=value)
    return uuid.UUID(str(value))


def _is_nullable(annotation: Any) -> bool:
    return get_origin(annotation) is UnionType and NoneType in get_args(annotation)


def _strip_none(annotation: Any) -> Any:
    if get_origin(annotation) is UnionType:
        args = [a for a in get_args(annotation) if a is not NoneType]
        return args[0]
    return annotation


# --- request-side helpers ---------------------------------------------------------------------


def millis(value: Any) -> int:
    """A kio duration or timestamp field as integer milliseconds."""
    if isinstance(value, datetime.timedelta):
        return int(value / datetime.timedelta(milliseconds=1))
    if isinstance(value, datetime.datetime):
        return int((value - _EPOCH) / datetime.timedelta(milliseconds=1))
    return int(value)


def uuid_to_str(value: uuid.UUID | None) -> str:
    return "" if value is None else value.hex


ZERO_UUID = uuid.UUID(int=0)


# --- forwarded principals (KIP-590 Envelope) --------------------------------------------------

ENVELOPE_KEY = 58
_PRINCIPAL_VERSION = struct.Struct(">h")


def encode_principal(principal: str, token_authenticated: bool = False) -> bytes:
    """``Type:name`` as Kafka serializes a principal into an Envelope (a version-prefixed
    ``DefaultPrincipalData``), so the bytes mean the same to a Kafka broker; with whether the
    client logged in with a delegation token (such a client may not ask for tokens)."""
    type_, _, name = principal.partition(":")
    buffer = io.BytesIO()
    buffer.write(_PRINCIPAL_VERSION.pack(0))
    entity = DefaultPrincipalData(type_=type_, name=name, token_authenticated=token_authenticated)
    entity_writer(DefaultPrincipalData)(buffer, entity)
    return buffer.getvalue()


def decode_principal(data: bytes) -> str:
    """``Type:name`` from :func:`encode_principal`'s bytes; DecodeError if unreadable or
    token-authenticated (see :func:`decode_forwarded_principal` for those)."""
    principal, token_authenticated = decode_forwarded_principal(data)
    if token_authenticated:
        raise DecodeError("forwarded principal is token-authenticated")
    return principal


def decode_forwarded_principal(data: bytes) -> tuple[str, bool]:
    """(``Type:name``, token-authenticated) from :func:`encode_principal`'s bytes;
    DecodeError if unreadable."""
    try:
        (version,) = _PRINCIPAL_VERSION.unpack_from(data, 0)
        if version != 0:
            raise ValueError(f"principal data version {version}")
        principal, _ = entity_reader(DefaultPrincipalData)(data, _PRINCIPAL_VERSION.size)
    except Exception as exc:
        raise DecodeError(f"cannot parse the forwarded principal: {exc}") from exc
    if not principal.type_ or not principal.name:
        raise DecodeError("forwarded principal without type or name")
    return f"{principal.type_}:{principal.name}", bool(principal.token_authenticated)


# --- the classic consumer protocol's embedded metadata ------------------------------------------

_EMBEDDED_VERSION = struct.Struct(">h")
_EMBEDDED_TYPES = {
    "consumer_protocol_subscription": "ConsumerProtocolSubscription",
    "consumer_protocol_assignment": "ConsumerProtocolAssignment",
}


@dataclass(frozen=True, slots=True)
class ConsumerSubscription:
    """A classic consumer's JoinGroup metadata (ConsumerProtocolSubscription)."""

    topics: tuple[str, ...]
    owned: frozenset[tuple[str, int]]
    rack_id: str | None


def _read_embedded(data: bytes, family: str) -> tuple[int, Any] | None:
    """(version, entity) of an embedded consumer-protocol document, or None if unreadable.

    Like Kafka, a version newer than kio knows is read as the newest known one (newer versions
    only append fields); a document shorter than its version claims is read as an older one.
    """
    if len(data) < _EMBEDDED_VERSION.size:
        return None
    (version,) = _EMBEDDED_VERSION.unpack_from(data, 0)
    if version < 0:
        return None
    for candidate in range(min(version, 3), -1, -1):
        module = importlib.import_module(f"kio.schema.{family}.v{candidate}.data")
        entity_type = getattr(module, _EMBEDDED_TYPES[family])
        try:
            entity, _ = entity_reader(entity_type)(data, _EMBEDDED_VERSION.size)
        except Exception:  # any malformed document is "not a subscription"
            continue
        return version, entity
    return None


def decode_consumer_subscription(data: bytes) -> ConsumerSubscription | None:
    """The subscription in a classic member's metadata; None when it is not one."""
    read = _read_embedded(data, "consumer_protocol_subscription")
    if read is None:
        return None
    _, entity = read
    owned_topics = getattr(entity, "owned_partitions", ())
    owned = frozenset((str(tp.topic), int(p)) for tp in owned_topics for p in tp.partitions)
    return ConsumerSubscription(tuple(entity.topics), owned, getattr(entity, "rack_id", None))


def decode_consumer_assignment(data: bytes) -> frozenset[tuple[str, int]] | None:
    """The partitions of a classic member's SyncGroup assignment; None when unreadable."""
    read = _read_embedded(data, "consumer_protocol_assignment")
    if read is None:
        return None
    _, entity = read
    return frozenset(
        (str(tp.topic), int(p)) for tp in entity.assigned_partitions for p in tp.partitions
    )


def encode_consumer_assignment(partitions: frozenset[tuple[str, int]]) -> bytes:
    """A ConsumerProtocolAssignment v0 (read by every classic client) of ``partitions``."""
    from kio.schema.consumer_protocol_assignment.v0.data import (
        ConsumerProtocolAssignment,
    )
    from kio.schema.consumer_protocol_assignment.v0.data import (
        TopicPartition as AssignedPartitions,
    )
    from kio.static.primitive import i32

    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    entity = ConsumerProtocolAssignment(
        assigned_partitions=tuple(
            AssignedPartitions(topic=topic, partitions=tuple(i32(p) for p in ps))  # type: ignore[arg-type]
            for topic, ps in by_topic.items()
        ),
        user_data=None,
    )
    buffer = io.BytesIO()
    buffer.write(_EMBEDDED_VERSION.pack(0))
    entity_writer(ConsumerProtocolAssignment)(buffer, entity)
    return buffer.getvalue()
