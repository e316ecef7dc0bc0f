"""DescribeUserScramCredentials and AlterUserScramCredentials: Kafka's admin API for users.

Kafka's admin clients (``kafka-configs --alter --add-config SCRAM-SHA-512=[...]``,
confluent-kafka's and kafka-python's ``alter_user_scram_credentials``) salt the password
themselves and send the salted password; the broker derives StoredKey and ServerKey and keeps
only those (``security.credentials``). Per-user errors follow Kafka: an unknown mechanism is
UNSUPPORTED_SASL_MECHANISM, iterations outside 4096..16384 UNACCEPTABLE_CREDENTIAL, a user
named twice in one request DUPLICATE_RESOURCE, deleting or describing what does not exist
RESOURCE_NOT_FOUND. With authorization on, describing needs DESCRIBE and altering ALTER on the
cluster (CLUSTER_AUTHORIZATION_FAILED otherwise), as in Kafka.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.api.error_bodies import (
    scram_user_result,
)
from kafscale.broker.authz.model import Operation
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.security.scram import (
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    ScramMechanism,
    credential_from_salted,
)


def _mechanism(value: int) -> ScramMechanism | None:
    try:
        return ScramMechanism(int(value))
    except ValueError:
        return None


async def handle_describe_user_scram_credentials(request: Any, ctx: RequestContext) -> Body:
    access.require(ctx, Operation.DESCRIBE, access.CLUSTER)
    known = await ctx.broker.credentials.list()
    # Null or empty: every user (librdkafka sends an empty array for "all", as Kafka allows).
    names = [u.name for u in request.users] if request.users else sorted(known)
    counts = Counter(names)
    results = []
    for name in dict.fromkeys(names):
        if counts[name] > 1:
            results.append(
                scram_user_result(name, ErrorCode.DUPLICATE_RESOURCE, "user named twice")
            )
        elif name not in known:
            results.append(
                scram_user_result(
                    name, ErrorCode.RESOURCE_NOT_FOUND, f"no credentials for user {name}"
                )
            )
        else:
            infos = [
                {"mechanism": int(m), "iterations": it} for m, it in sorted(known[name].items())
            ]
            results.append(
                {**scram_user_result(name, ErrorCode.NONE, None), "credential_infos": infos}
            )
    return {"throttle_time": 0, "error_code": ErrorCode.NONE, "results": results}


async def handle_alter_user_scram_credentials(request: Any, ctx: RequestContext) -> Body:
    access.require(ctx, Operation.ALTER, access.CLUSTER)
    store = ctx.broker.credentials
    users = [d.name for d in request.deletions] + [u.name for u in request.upsertions]
    errors: dict[str, tuple[ErrorCode, str]] = {}
    pairs = Counter(
        [(d.name, d.mechanism) for d in request.deletions]
        + [(u.name, u.mechanism) for u in request.upsertions]
    )
    for (name, _), count in pairs.items():
        if count > 1:
            errors[name] = (ErrorCode.DUPLICATE_RESOURCE, "a user/mechanism is named twice")
    for item in [*request.deletions, *request.upsertions]:
        if item.name in errors:
            continue
        if not item.name:
            errors[item.name] = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "empty user name")
        elif _mechanism(item.mechanism) is None:
            errors[item.name] = (ErrorCode.UNSUPPORTED_SASL_MECHANISM, "unknown SCRAM mechanism")
    for upsertion in request.upsertions:
        if upsertion.name in errors:
            continue
        if not MIN_ITERATIONS <= upsertion.iterations <= MAX_ITERATIONS:
            errors[upsertion.name] = (
                ErrorCode.UNACCEPTABLE_CREDENTIAL,
                f"iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}",
            )
        elif not upsertion.salt or not upsertion.salted_password:
            errors[upsertion.name] = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "empty salt or password")
    for deletion in request.deletions:
        mechanism = _mechanism(deletion.mechanism)
        if deletion.name in errors or mechanism is None:
            continue
        if await store.get(deletion.name, mechanism) is None:
            errors[deletion.name] = (
                ErrorCode.RESOURCE_NOT_FOUND,
                f"user {deletion.name} has no {mechanism.sasl_name} credential",
            )
    for deletion in request.deletions:
        mechanism = _mechanism(deletion.mechanism)
        if deletion.name not in errors and mechanism is not None:
            await store.delete(deletion.name, mechanism)
    for upsertion in request.upsertions:
        mechanism = _mechanism(upsertion.mechanism)
        if upsertion.name not in errors and mechanism is not None:
            credential = credential_from_salted(
                upsertion.salted_password, upsertion.salt, upsertion.iterations, mechanism
            )
            await store.put(upsertion.name, mechanism, credential)
    results = []
    for name in dict.fromkeys(users):
        code, message = errors.get(name, (ErrorCode.NONE, None))
        results.append({"user": name, "error_code": code, "error_message": message})
    return {"throttle_time": 0, "results": results}
