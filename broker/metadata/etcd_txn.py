"""The values of our etcd interface: key-values, compares, ops and transaction results.

Callers build transactions from these small frozen values (``value_is``, ``put_op``, ...), so no
aetcd or protobuf type leaks out of the adapter; ``compare_message``, ``op_message`` and
``op_result`` are the only places that turn them into etcd's gRPC messages and back. Fenced
commits (DESIGN §3.4) are one ``Etcd.txn`` of these.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from aetcd import rpc


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


class CompareTarget(enum.Enum):
    VALUE = "value"
    CREATE_REVISION = "create_revision"
    MOD_REVISION = "mod_revision"


@dataclass(frozen=True, slots=True)
class Compare:
    """An equality test on one key; build it with the helpers below."""

    key: str
    target: CompareTarget
    expected: bytes | int


@dataclass(frozen=True, slots=True)
class PutOp:
    key: str
    value: bytes
    lease: int | None = None


@dataclass(frozen=True, slots=True)
class DeleteOp:
    key: str
    prefix: bool = False  # every key starting with ``key``


@dataclass(frozen=True, slots=True)
class GetOp:
    key: str


Op = PutOp | DeleteOp | GetOp
OpResult = KeyValue | int | None
"""GetOp: the KeyValue or None; PutOp: the revision written; DeleteOp: keys deleted."""


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int
    """Store revision after the transaction (the revision of its writes, if any)."""
    responses: list[OpResult]
    """One result per op of the branch that ran, in order (see ``OpResult``)."""

    def kv(self, index: int) -> KeyValue | None:
        """The result of the GetOp at ``index``."""
        result = self.responses[index]
        if isinstance(result, int):
            raise TypeError(f"txn response {index} is not a get result")
        return result


def value_is(key: str, value: bytes) -> Compare:
    return Compare(key, CompareTarget.VALUE, value)


def create_revision_is(key: str, revision: int) -> Compare:
    """``revision == 0`` means the key does not exist."""
    return Compare(key, CompareTarget.CREATE_REVISION, revision)


def mod_revision_is(key: str, revision: int) -> Compare:
    return Compare(key, CompareTarget.MOD_REVISION, revision)


def put_op(key: str, value: bytes, lease: int | None = None) -> PutOp:
    return PutOp(key, value, lease)


def delete_op(key: str) -> DeleteOp:
    return DeleteOp(key)


def delete_prefix_op(prefix: str) -> DeleteOp:
    return DeleteOp(prefix, prefix=True)


def prefix_range_end(prefix: bytes) -> bytes:
    """etcd's range end for "every key starting with ``prefix``": the prefix with its last byte
    below 0xff incremented (and the bytes after it dropped)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return b"\0"  # all keys
    return stripped[:-1] + bytes([stripped[-1] + 1])


def get_op(key: str) -> GetOp:
    return GetOp(key)


def compare_message(compare: Compare) -> Any:
    message = rpc.Compare(key=compare.key.encode(), result=rpc.Compare.EQUAL)
    if compare.target is CompareTarget.VALUE:
        message.target = rpc.Compare.VALUE
        message.value = compare.expected
    elif compare.target is CompareTarget.CREATE_REVISION:
        message.target = rpc.Compare.CREATE
        message.create_revision = compare.expected
    else:
        message.target = rpc.Compare.MOD
        message.mod_revision = compare.expected
    return message


def op_message(op: Op) -> Any:
    key = op.key.encode()
    if isinstance(op, PutOp):
        put = rpc.PutRequest(key=key, value=op.value, lease=op.lease or 0)
        return rpc.RequestOp(request_put=put)
    if isinstance(op, DeleteOp):
        range_end = prefix_range_end(key) if op.prefix else b""
        delete = rpc.DeleteRangeRequest(key=key, range_end=range_end)
        return rpc.RequestOp(request_delete_range=delete)
    return rpc.RequestOp(request_range=rpc.RangeRequest(key=key))


def op_result(response: Any, revision: int) -> OpResult:
    kind = response.WhichOneof("response")
    if kind == "response_range":
        kvs = response.response_range.kvs
        return key_value(kvs[0]) if kvs else None
    if kind == "response_delete_range":
        return int(response.response_delete_range.deleted)
    return revision


def key_value(raw: Any) -> KeyValue:
    return KeyValue(
        key=bytes(raw.key).decode(),
        value=bytes(raw.value),
        create_revision=int(raw.create_revision),
        mod_revision=int(raw.mod_revision),
        version=int(raw.version),
        lease=int(raw.lease),
    )
