"""A structural check of a request body before kio's native reader parses it.

kio's reader (Rust) reserves memory for an array as soon as it has read the array's length,
before it checks that the frame holds that many elements: a 30-byte frame claiming 2^32
elements made it ask for 34 GB and abort the broker process, every connection with it (found by
mutation fuzzing). Kafka's own parser checks each array length against the bytes left first;
this walk does the same ahead of kio, and it also refuses a null where the schema allows none
(kio hands such a null to the handlers, which iterate it). It reads lengths only and skips the
rest: a produce request's record batches are skipped whole.

It also finds tagged fields the schema does not know. Kafka ignores them (that is how a newer
client's optional fields reach an older broker); kio refuses the whole request, so they are cut
out of the frame before kio reads it.

The walk follows the schema classes kio generates (field order, ``kafka_type`` metadata,
``__flexible__``, tagged fields marked with a ``tag``); a walker is built once per schema.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from types import NoneType, UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

Edit = tuple[int, int, bytes]
"""Replace ``frame[start:end]`` with these bytes (unknown tagged fields cut out)."""
Walker = Callable[[memoryview, int, list[Edit]], int]
"""Checks the value starting at a position, noting edits; returns the position after it."""

FIXED_SIZES = {
    "bool": 1,
    "int8": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "float64": 8,
    "uuid": 16,
}
_LEGACY_LENGTH = {"string": struct.Struct(">h"), "bytes": struct.Struct(">i")}
_INT8 = struct.Struct(">b")
_INT32 = struct.Struct(">i")
_MAX_UVARINT_BYTES = 5  # Kafka's unsigned varints are 32-bit


class MalformedRequest(Exception):
    """The body cannot be what its schema says: a length past the frame's end, or a null where
    none is allowed."""


def check_body(schema: type[Any], frame: bytes | memoryview, position: int) -> list[Edit]:
    """Raise MalformedRequest unless ``frame[position:]`` can hold a ``schema`` body; return the
    edits that cut out tagged fields the schema does not know (none, nearly always)."""
    view = frame if isinstance(frame, memoryview) else memoryview(frame)
    edits: list[Edit] = []
    entity_walker(schema)(view, position, edits)
    return edits


_HEADER_FIXED = 8  # api key, api version, correlation id
_CLIENT_ID_LENGTH = struct.Struct(">h")


def check_header(header_schema: type[Any], frame: bytes | memoryview) -> list[Edit]:
    """The edits that cut tagged fields out of a flexible request header (it defines none; the
    client id before them is an int16-length string in every header version)."""
    if not header_schema.__flexible__:
        return []
    view = frame if isinstance(frame, memoryview) else memoryview(frame)
    length, position = _legacy_length(_CLIENT_ID_LENGTH, view, _HEADER_FIXED, "client_id")
    position = _skip(view, position, length or 0, "client_id")
    edits: list[Edit] = []
    _skip_tagged_fields(view, position, frozenset(), edits)
    return edits


def apply_edits(frame: bytes | memoryview, edits: list[Edit]) -> bytes:
    """``frame`` with ``edits`` (from ``check_body``) applied."""
    parts = []
    position = 0
    for start, end, replacement in sorted(edits):
        parts += [frame[position:start], replacement]
        position = end
    parts.append(frame[position:])
    return b"".join(parts)


_WALKERS: dict[type[Any], Walker] = {}


def entity_walker(entity_type: type[Any]) -> Walker:
    walker = _WALKERS.get(entity_type)
    if walker is None:
        walker = _WALKERS[entity_type] = _make_entity_walker(entity_type)
    return walker


def _make_entity_walker(entity_type: type[Any]) -> Walker:
    flexible = bool(entity_type.__flexible__)
    hints = get_type_hints(entity_type)
    steps: list[Walker] = []
    fixed = 0  # bytes of fixed-size fields in a row: skipped in one step (a fetch's partitions)
    for field in fields(entity_type):
        if "tag" in field.metadata:
            continue  # tagged fields travel in the tagged section
        kafka_type = field.metadata.get("kafka_type")
        value_type = _split_optional(hints[field.name])[1]  # an array may be nullable
        if kafka_type in FIXED_SIZES and get_origin(value_type) is not tuple:
            fixed += FIXED_SIZES[kafka_type]
            continue
        if fixed:
            steps.append(_fixed_walker(entity_type.__name__, fixed))
            fixed = 0
        steps.append(_field_walker(field.name, hints[field.name], kafka_type, flexible))
    if fixed:
        steps.append(_fixed_walker(entity_type.__name__, fixed))

    known_tags = frozenset(f.metadata["tag"] for f in fields(entity_type) if "tag" in f.metadata)

    def walk(view: memoryview, position: int, edits: list[Edit]) -> int:
        for step in steps:
            position = step(view, position, edits)
        return _skip_tagged_fields(view, position, known_tags, edits) if flexible else position

    return walk


def _fixed_walker(name: str, size: int) -> Walker:
    return lambda view, position, _edits: _skip(view, position, size, name)


def _field_walker(name: str, annotation: Any, kafka_type: str | None, flexible: bool) -> Walker:
    nullable, inner = _split_optional(annotation)
    if get_origin(inner) is tuple:
        item_type = get_args(inner)[0]
        if is_dataclass(item_type):
            item = entity_walker(item_type)  # type: ignore[arg-type]
        else:
            item = _value_walker(name, kafka_type, flexible, nullable=False)
        return _array_walker(name, item, flexible, nullable)
    if is_dataclass(inner):
        return _struct_walker(name, entity_walker(inner), nullable)  # type: ignore[arg-type]
    return _value_walker(name, kafka_type, flexible, nullable)


def _split_optional(annotation: Any) -> tuple[bool, Any]:
    if get_origin(annotation) in (UnionType, Union):
        args = [a for a in get_args(annotation) if a is not NoneType]
        return len(args) < len(get_args(annotation)), args[0]
    return False, annotation


def _value_walker(name: str, kafka_type: str | None, flexible: bool, nullable: bool) -> Walker:
    if kafka_type in FIXED_SIZES:
        return _fixed_walker(name, FIXED_SIZES[kafka_type])
    if kafka_type in ("string", "bytes", "records"):
        if flexible:
            return _compact_walker(name, nullable)
        return _legacy_walker(
            name, _LEGACY_LENGTH["string" if kafka_type == "string" else "bytes"], nullable
        )
    raise TypeError(f"no wire size known for field {name!r} of kafka_type {kafka_type!r}")


def _compact_walker(name: str, nullable: bool) -> Walker:
    def walk(view: memoryview, position: int, _edits: list[Edit]) -> int:
        length, position = _compact_length(view, position)
        if length is None:
            return _null(name, nullable, position)
        return _skip(view, position, length, name)

    return walk


def _legacy_walker(name: str, prefix: struct.Struct, nullable: bool) -> Walker:
    def walk(view: memoryview, position: int, _edits: list[Edit]) -> int:
        length, position = _legacy_length(prefix, view, position, name)
        if length is None:
            return _null(name, nullable, position)
        return _skip(view, position, length, name)

    return walk


def _array_walker(name: str, item: Walker, flexible: bool, nullable: bool) -> Walker:
    def walk(view: memoryview, position: int, edits: list[Edit]) -> int:
        if flexible:
            count, position = _compact_length(view, position)
        else:
            count, position = _legacy_length(_INT32, view, position, name)
        if count is None:
            return _null(name, nullable, position)
        if count > len(view) - position:  # every element takes at least one byte
            raise MalformedRequest(
                f"{name}: array of {count} elements in {len(view) - position} bytes"
            )
        for _ in range(count):
            position = item(view, position, edits)
        return position

    return walk


def _compact_length(view: memoryview, position: int) -> tuple[int | None, int]:
    """A compact length (length + 1; 0 is null) and the position after it."""
    stored, position = read_uvarint(view, position)
    return (stored - 1 if stored else None), position


def _legacy_length(
    prefix: struct.Struct, view: memoryview, position: int, name: str
) -> tuple[int | None, int]:
    """An int16 or int32 length (-1 is null) and the position after it."""
    (length,) = _unpack(prefix, view, position, name)
    if length < -1:
        raise MalformedRequest(f"{name}: negative length {length}")
    return (length if length >= 0 else None), position + prefix.size


def _struct_walker(name: str, entity: Walker, nullable: bool) -> Walker:
    if not nullable:
        return entity

    def walk(view: memoryview, position: int, edits: list[Edit]) -> int:
        (marker,) = _unpack(_INT8, view, position, name)
        position += 1
        return _null(name, True, position) if marker < 0 else entity(view, position, edits)

    return walk


def _skip_tagged_fields(
    view: memoryview, position: int, known: frozenset[int], edits: list[Edit]
) -> int:
    count_at = position
    count, position = read_uvarint(view, position)
    count_end = position
    if count > len(view) - position:
        raise MalformedRequest(f"{count} tagged fields in {len(view) - position} bytes")
    unknown = []
    for _ in range(count):
        start = position
        tag, position = read_uvarint(view, position)
        size, position = read_uvarint(view, position)
        position = _skip(view, position, size, "tagged field")
        if tag not in known:
            unknown.append((start, position, b""))
    if unknown:
        edits.append((count_at, count_end, encode_uvarint(count - len(unknown))))
        edits += unknown
    return position


def encode_uvarint(value: int) -> bytes:
    """Kafka's unsigned varint: compact lengths and counts (+ 1, where 0 is null), tags."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def read_uvarint(view: memoryview, position: int) -> tuple[int, int]:
    value = shift = 0
    for index in range(_MAX_UVARINT_BYTES):
        if position + index >= len(view):
            raise MalformedRequest("varint runs past the end of the frame")
        byte = view[position + index]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position + index + 1
        shift += 7
    raise MalformedRequest("varint longer than 5 bytes")


def _skip(view: memoryview, position: int, size: int, name: str) -> int:
    end = position + size
    if end > len(view):
        raise MalformedRequest(f"{name}: {size} bytes wanted, {len(view) - position} left")
    return end


def _unpack(layout: struct.Struct, view: memoryview, position: int, name: str) -> tuple[int]:
    if position + layout.size > len(view):
        raise MalformedRequest(f"{name}: the frame ends inside its length")
    return layout.unpack_from(view, position)  # type: ignore[return-value]


def _null(name: str, nullable: bool, position: int) -> int:
    if not nullable:
        raise MalformedRequest(f"{name}: null where the schema allows none")
    return position
