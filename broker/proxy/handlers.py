"""Which way each API goes through the proxy.

Answered here: ApiVersions, Metadata (unless it must create topics), FindCoordinator,
DescribeCluster, DescribeTopicPartitions, ListConfigResources and AlterPartitionReassignments
(their answers name broker ids: the proxy's, made with the brokers' pure functions), and the
SASL login (SaslHandshake, SaslAuthenticate) with the brokers' own code. Metadata,
DescribeTopicPartitions and FindCoordinator show a client only what its ACLs let it describe.
Split by partition owner: Produce, Fetch, ListOffsets, OffsetForLeaderEpoch, DeleteRecords,
DescribeProducers, WriteTxnMarkers (``txn_markers``). To the group's coordinator: the group
and offset APIs (OffsetDelete among them; DescribeGroups, DeleteGroups and multi-group
OffsetFetch split by coordinator) and TxnOffsetCommit. To the transactional id's coordinator:
InitProducerId with a transactional id, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn
(DescribeTransactions split by coordinator). To every broker: ListGroups, ListTransactions,
DescribeLogDirs (joined as one broker's, ``log_dirs``). Split by partition owner and joined as one
broker's answer: AlterReplicaLogDirs (``log_dirs``). To any broker (they act through etcd):
topic, config, ACL, user and delegation-token administration (token APIs from a client that
is token-authenticated or anonymous, or any with ``forward_principals`` off, are refused
here), ElectLeaders and ListPartitionReassignments (their answers name no broker),
InitProducerId of an idempotent producer; DescribeConfigs of a broker goes to that broker,
and of the proxy's own id to a live broker whose answer the proxy gives as its own
(``configs``).

A handler returns a body to encode, the raw answer of one broker (forwarded as it came, only the
correlation id changed), or None (acks=0).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kafscale.broker.api import config_resources, error_bodies, replicas, topic_partitions
from kafscale.broker.api.features import TRANSACTION_VERSION
from kafscale.broker.api.fetch_sessions import FetchSessionCache
from kafscale.broker.api.sasl import sasl_authenticate, sasl_handshake
from kafscale.broker.authz.model import CLUSTER_NAME, Operation, ResourceType
from kafscale.broker.metadata.topics import is_valid_topic_name
from kafscale.broker.protocol import codec
from kafscale.broker.protocol.errors import ErrorCode, KafkaError
from kafscale.broker.proxy import answers, configs, log_dirs, split
from kafscale.broker.proxy.access import ProxyAccess
from kafscale.broker.proxy.fetch import forward_fetch
from kafscale.broker.proxy.forward import Call, Forwarder
from kafscale.broker.proxy.share import ShareCall, forward_share_acknowledge, forward_share_fetch
from kafscale.broker.proxy.staleness import RouteKey
from kafscale.broker.proxy.txn_markers import forward_markers
from kafscale.broker.proxy.upstream import UpstreamError, UpstreamPool
from kafscale.broker.security.sasl import CredentialLookup, TokenLookup
from kafscale.broker.security.tokens import token_requests_allowed
from kafscale.broker.server import Connection

Body = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Raw:
    """One broker's answer, passed on as it came."""

    body: bytes


Answer = Body | Raw | None


@dataclass(frozen=True, slots=True)
class ProxyContext:
    forwarder: Forwarder
    sessions: FetchSessionCache
    identity: answers.Identity  # the first listener's
    identities: Mapping[str, answers.Identity] = dataclasses.field(default_factory=dict)
    access: ProxyAccess | None = None  # None: every client may describe everything
    credentials: CredentialLookup | None = None  # SCRAM credentials for SASL logins
    transaction_version: int = TRANSACTION_VERSION  # the finalized level ApiVersions reports
    # The proxy's own listener configs (DescribeConfigs of its broker id)
    listener_configs: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tokens: TokenLookup | None = None  # delegation-token logins (None: tokens are off)
    # Whether brokers see each client's principal (upstream.forward_principals); without it
    # they see the proxy's, and a token asked for here would be the proxy's own.
    forwards_principals: bool = True


@dataclass(frozen=True, slots=True)
class ProxyRequest:
    call: Call
    body: Any
    frame: bytes | memoryview
    pool: UpstreamPool
    ctx: ProxyContext
    connection: Connection | None = None

    @property
    def identity(self) -> answers.Identity:
        """The proxy as clients of this connection's listener know it."""
        if self.connection is None:
            return self.ctx.identity
        return self.ctx.identities.get(self.connection.listener, self.ctx.identity)

    def operations(self, resource_type: ResourceType, name: str) -> int:
        """The client's ``authorized_operations`` bit field on the resource."""
        candidates = answers.CANDIDATES[resource_type]
        access, connection = self.ctx.access, self.connection
        if access is None or connection is None:
            return sum(1 << op for op in candidates)
        return access.operations(
            connection.principal, connection.peer, resource_type, name, candidates
        )

    def may_describe(self, resource_type: ResourceType, name: str) -> bool:
        return self.may(Operation.DESCRIBE, resource_type, name)

    def may(self, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        access, connection = self.ctx.access, self.connection
        if access is None or connection is None:
            return True
        return access.allowed(connection.principal, connection.peer, operation, resource_type, name)


Handler = Callable[[ProxyRequest], Awaitable[Answer]]


# --- answered by the proxy ----------------------------------------------------------------------


async def api_versions(r: ProxyRequest) -> Answer:
    return answers.api_versions(r.ctx.transaction_version)


async def metadata(r: ProxyRequest) -> Answer:
    routes = r.ctx.forwarder.routes
    names = answers.requested_topic_names(r.body, r.call.api_version, routes) or []
    unknown = [
        name
        for name in names
        if name not in routes.view.topics
        and is_valid_topic_name(name)  # an invalid name is answered at once (no broker makes it)
        and r.may_describe(ResourceType.TOPIC, name)
    ]
    refused: dict[str, ErrorCode] = {}
    if unknown and getattr(r.body, "allow_auto_topic_creation", True):
        # A broker creates them (auto.create.topics.enable is theirs, and the client's CREATE
        # is checked there); answer from the view once the watch shows them.
        forwarder = r.ctx.forwarder
        _, answer = await forwarder.routed(
            r.pool, r.call, r.frame, routes.any_broker, forwarder.deadline(), frozenset()
        )
        refused = answers.refused_creations(answer, unknown)
        await _until_known(forwarder, [n for n in unknown if n not in refused], timeout_s=2.0)
    body = answers.metadata(
        r.body,
        r.call.api_version,
        routes,
        r.identity,
        lambda name: r.may_describe(ResourceType.TOPIC, name),
        r.operations,
    )
    return answers.with_topic_errors(body, refused)


async def _until_known(forwarder: Forwarder, names: list[str], timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    view = forwarder.routes.view
    while any(name not in view.topics for name in names) and loop.time() < deadline:
        await forwarder.routes.wait_changed(deadline - loop.time())


async def describe_topic_partitions(r: ProxyRequest) -> Answer:
    """KIP-966 from the proxy's view, with Metadata's leaders (its own ids)."""
    routes = r.ctx.forwarder.routes
    topics = routes.view.topics

    def partition_count(name: str) -> int | None:
        info = topics.get(name)
        return None if info is None else info.partitions

    look = topic_partitions.ClusterLook(
        all_topics=list(topics),
        partition_count=partition_count,
        topic_id_of=lambda name: uuid.UUID(hex=topics[name].topic_id),
        leader_of=answers.leader_of(routes, r.identity),
        epoch_of=routes.leader_epoch,
        describable=lambda name: r.may_describe(ResourceType.TOPIC, name),
        operations_of=lambda name: r.operations(ResourceType.TOPIC, name),
    )
    try:
        return topic_partitions.describe_topic_partitions(r.body, look)
    except KafkaError as exc:
        return error_bodies.describe_topic_partitions_error_body(r.body, exc.code)


async def list_config_resources(r: ProxyRequest) -> Answer:
    """The brokers' answer with the broker ids the proxy's clients know (its own)."""
    if not r.may(Operation.DESCRIBE_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME):
        return {"throttle_time": 0, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED}
    routes = r.ctx.forwarder.routes
    ids = answers.node_ids(routes, r.identity)
    try:
        return config_resources.list_config_resources_body(
            r.body, r.call.api_version, routes.view.topics, ids, routes.view.group_configs
        )
    except KafkaError as exc:
        return {"throttle_time": 0, "error_code": exc.code}


async def alter_partition_reassignments(r: ProxyRequest) -> Answer:
    """Checked against the broker ids the proxy's clients know (a reassignment changes
    nothing a broker holds: it completes when accepted, ``api/replicas.py``)."""
    if not r.may(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
        return error_bodies.alter_reassignments_error_body(
            r.body, ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        )
    routes = r.ctx.forwarder.routes
    counts = {name: info.partitions for name, info in routes.view.topics.items()}
    return replicas.alter_reassignments_body(r.body, counts, answers.node_ids(routes, r.identity))


async def find_coordinator(r: ProxyRequest) -> Answer:
    return answers.find_coordinator(
        r.body,
        r.call.api_version,
        r.identity,
        lambda group: r.may_describe(ResourceType.GROUP, group),
        lambda txn_id: r.may_describe(ResourceType.TRANSACTIONAL_ID, txn_id),
    )


async def describe_cluster(r: ProxyRequest) -> Answer:
    return answers.describe_cluster(r.body, r.ctx.forwarder.routes, r.identity, r.operations)


async def sasl_handshake_here(r: ProxyRequest) -> Answer:
    assert r.connection is not None
    return sasl_handshake(r.body, r.connection)


async def sasl_authenticate_here(r: ProxyRequest) -> Answer:
    assert r.connection is not None and r.ctx.credentials is not None
    return await sasl_authenticate(r.body, r.connection, r.ctx.credentials, r.ctx.tokens)


# --- delegation tokens: refused here, else to any broker (tokens live in etcd) ----------------

TOKEN_REFUSALS: dict[int, Body] = {
    38: {
        "error_code": ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED,
        "issue_timestamp": -1,
        "expiry_timestamp": -1,
        "max_timestamp": -1,
        "hmac": b"",
    },
    39: {"error_code": ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED, "expiry_timestamp": -1},
    40: {"error_code": ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED, "expiry_timestamp": -1},
    41: {"error_code": ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED, "tokens": []},
}


async def delegation_token_api(r: ProxyRequest) -> Answer:
    """A client that logged in with a token, or did not log in, may not ask for tokens: the
    proxy answers that itself (the brokers would too, from the forwarded principal; this
    also holds with ``forward_principals`` off, where they would see the proxy). With
    ``forward_principals`` off the proxy refuses every token request: the brokers would
    answer for the proxy's principal, not the client's."""
    connection = r.connection
    if not r.ctx.forwards_principals:
        # The brokers would make (or renew, or show) tokens of the proxy's own principal, which
        # may CLUSTER_ACTION: a client would leave with a login stronger than its own.
        return TOKEN_REFUSALS[r.call.api_key]
    if connection is not None and not token_requests_allowed(
        connection.principal, connection.token_authenticated
    ):
        return TOKEN_REFUSALS[r.call.api_key]
    return await to_any_broker(r)


# --- split by partition owner ---------------------------------------------------------------


async def produce(r: ProxyRequest) -> Answer:
    acks = int(r.body.acks)
    forwarder = r.ctx.forwarder
    deadline = forwarder.deadline(codec.millis(r.body.timeout))
    return await forwarder.partitioned(
        r.pool, r.call, r.body, split.PRODUCE, deadline, expect_response=acks != 0
    )


def partitioned(api: split.PartitionedApi) -> Handler:
    async def handle(r: ProxyRequest) -> Answer:
        timeout = getattr(r.body, "timeout", None)
        forwarder = r.ctx.forwarder
        deadline = forwarder.deadline(codec.millis(timeout) if timeout is not None else None)
        return await forwarder.partitioned(r.pool, r.call, r.body, api, deadline)

    return handle


async def write_txn_markers(r: ProxyRequest) -> Answer:
    """Each marker's partitions to their owners (``txn_markers``)."""
    forwarder = r.ctx.forwarder

    async def send(parts: list[tuple[int, Any]]) -> list[asyncio.Future[bytes]]:
        return await forwarder.send(r.pool, parts)

    return await forward_markers(
        send,
        lambda body: _frame(r.call, body),
        r.body,
        forwarder.routes.partition_owner,
        r.call.api_version,
    )


async def fetch(r: ProxyRequest) -> Answer:
    return await forward_fetch(r.ctx.forwarder, r.ctx.sessions, r.pool, r.call, r.body)


async def share_fetch(r: ProxyRequest) -> Answer:
    """Split by owner on the proxy's share session with each (``share``)."""
    c = ShareCall(r.ctx.forwarder, r.pool, r.call, r.body, r.identity)
    return await forward_share_fetch(c)


async def share_acknowledge(r: ProxyRequest) -> Answer:
    c = ShareCall(r.ctx.forwarder, r.pool, r.call, r.body, r.identity)
    return await forward_share_acknowledge(c)


# --- to the group's coordinator ---------------------------------------------------------------


async def to_coordinator(r: ProxyRequest) -> Answer:
    """A request for one group (``group_id``), forwarded as it came."""
    return await _to_group(r, str(r.body.group_id), r.frame)


async def _to_group(r: ProxyRequest, group_id: str, frame: bytes | memoryview) -> Raw:
    return await _to_coordinator(r, RouteKey("group", group_id), frame)


async def _to_coordinator(r: ProxyRequest, lease: RouteKey, frame: bytes | memoryview) -> Raw:
    """``frame`` to the coordinator of a group or a transactional id (``lease``), routed anew
    (and retried) when a broker answers that it is not the coordinator any more."""
    forwarder = r.ctx.forwarder
    routes = forwarder.routes
    coordinator = (
        routes.group_coordinator if lease.kind == "group" else routes.transaction_coordinator
    )
    body, _ = await forwarder.routed(
        r.pool,
        r.call,
        frame,
        lambda _refused: coordinator(lease.name),
        forwarder.deadline(),
        lease=lease,
    )
    return Raw(body)


@dataclass(frozen=True, slots=True)
class GroupList:
    """A request naming several groups, answered with one result per group."""

    field: str  # the request's list of groups
    group_of: Callable[[Any], str]
    response_field: str  # the response's list of per-group results


DESCRIBE_GROUPS = GroupList("groups", str, "groups")
DELETE_GROUPS = GroupList("groups_names", str, "results")
CONSUMER_GROUP_DESCRIBE = GroupList("group_ids", str, "groups")
OFFSET_FETCH_GROUPS = GroupList("groups", lambda g: str(g.group_id), "groups")


def by_coordinator(groups: GroupList) -> Handler:
    """Split by coordinator, one request each, results merged in the client's order."""

    async def handle(r: ProxyRequest) -> Answer:
        items = list(getattr(r.body, groups.field))
        routes = r.ctx.forwarder.routes
        by_broker: dict[int, list[Any]] = {}
        for item in items:
            by_broker.setdefault(routes.group_coordinator(groups.group_of(item)), []).append(item)
        if len(by_broker) <= 1:
            group = groups.group_of(items[0]) if items else ""
            return await _to_group(r, group, r.frame)
        parts = [
            dataclasses.replace(r.body, **{groups.field: tuple(part)})
            for part in by_broker.values()
        ]
        raws = await asyncio.gather(
            *(
                _to_group(r, groups.group_of(part[0]), _frame(r.call, sub))
                for part, sub in zip(by_broker.values(), parts, strict=True)
            )
        )
        results: dict[str, Any] = {}
        for raw in raws:
            response = codec.decode_response(raw.body, r.call.api_key, r.call.api_version)
            for result in getattr(response, groups.response_field):
                results[str(result.group_id)] = result
        return {
            "throttle_time": 0,
            groups.response_field: [results[groups.group_of(item)] for item in items],
        }

    return handle


async def offset_fetch(r: ProxyRequest) -> Answer:
    if hasattr(r.body, "groups"):  # v8+: several groups in one request
        return await _offset_fetch_groups(r)
    return await to_coordinator(r)


_offset_fetch_groups = by_coordinator(OFFSET_FETCH_GROUPS)


async def list_groups(r: ProxyRequest) -> Answer:
    """Every broker's groups, once each."""
    forwarder = r.ctx.forwarder
    brokers = sorted(forwarder.routes.view.brokers)
    outcomes = await asyncio.gather(
        *(forwarder.call_raw(r.pool, broker, r.frame) for broker in brokers),
        return_exceptions=True,
    )
    groups: dict[str, Any] = {}
    code = ErrorCode.COORDINATOR_NOT_AVAILABLE
    for outcome in outcomes:
        if isinstance(outcome, UpstreamError):
            continue
        if isinstance(outcome, BaseException):
            raise outcome
        response = codec.decode_response(outcome, r.call.api_key, r.call.api_version)
        if int(response.error_code) == ErrorCode.NONE:
            code = ErrorCode.NONE
        for group in response.groups:
            groups.setdefault(str(group.group_id), group)
    return {"throttle_time": 0, "error_code": code, "groups": list(groups.values())}


async def describe_log_dirs(r: ProxyRequest) -> Answer:
    """Every live broker's log dirs (each reports the partitions it owns), joined into the one
    broker the proxy stands for (``log_dirs``); a broker out of reach is left out."""
    forwarder = r.ctx.forwarder
    brokers = sorted(forwarder.routes.view.brokers)
    outcomes = await asyncio.gather(
        *(forwarder.call_raw(r.pool, broker, r.frame) for broker in brokers),
        return_exceptions=True,
    )
    responses = []
    for outcome in outcomes:
        if isinstance(outcome, UpstreamError):
            continue
        if isinstance(outcome, BaseException):
            raise outcome
        responses.append(codec.decode_response(outcome, r.call.api_key, r.call.api_version))
    if not responses:
        raise UpstreamError("no live broker answered DescribeLogDirs")
    return log_dirs.merge_log_dirs(responses)


async def alter_replica_log_dirs(r: ProxyRequest) -> Answer:
    """Each partition to its owner, which hosts it (``log_dirs``); the answers joined as the
    one broker's. Authorized here too, so that partitions no broker is alive for are refused
    alike."""
    if not r.may(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
        return error_bodies.alter_replica_log_dirs_error_body(
            r.body, ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        )
    forwarder = r.ctx.forwarder
    routes = forwarder.routes
    parts, orphans = log_dirs.split_moves(r.body, routes.partition_owner)

    async def ask(body: Any) -> Any:
        first = body.dirs[0].topics[0]
        tp = (str(first.name), int(first.partitions[0]))
        _, response = await forwarder.routed(
            r.pool,
            r.call,
            _frame(r.call, body),
            lambda _refused: routes.partition_owner(tp),
            forwarder.deadline(),
            frozenset(),
        )
        return response

    responses = await asyncio.gather(*(ask(body) for body in parts.values()))
    view = routes.view
    counts = {name: info.partitions for name, info in view.topics.items()}
    unhosted = log_dirs.orphan_codes(r.body, orphans, set(view.log_dirs.values()), counts)
    return log_dirs.merge_moves(r.body, responses, unhosted)


# --- to the transaction coordinator -----------------------------------------------------------


def transactional_id_of(api_key: int, body: Any) -> str | None:
    """The transactional id a transaction request is for (None: InitProducerId of an
    idempotent producer, which any broker answers)."""
    if api_key == 24 and hasattr(body, "v3_and_below_transactional_id"):
        return str(body.v3_and_below_transactional_id)
    if api_key == 24:  # v4+: batched, from brokers; the first transaction's coordinator
        transactions = list(body.transactions)
        return str(transactions[0].transactional_id) if transactions else ""
    txn_id = getattr(body, "transactional_id", None)
    return None if txn_id is None else str(txn_id)


async def to_transaction_coordinator(r: ProxyRequest) -> Answer:
    """InitProducerId (with a transactional id), AddPartitionsToTxn, AddOffsetsToTxn and
    EndTxn: to the broker holding the transactional id's lease, retried when it moves."""
    txn_id = transactional_id_of(r.call.api_key, r.body)
    if not txn_id:
        return await to_any_broker(r)
    forwarder = r.ctx.forwarder
    routes = forwarder.routes
    body, _ = await forwarder.routed(
        r.pool,
        r.call,
        r.frame,
        lambda _refused: routes.transaction_coordinator(txn_id),
        forwarder.deadline(),
        lease=RouteKey("transaction", txn_id),
    )
    return Raw(body)


async def describe_transactions(r: ProxyRequest) -> Answer:
    """Split by transaction coordinator, the answers' states joined (clients match them by
    transactional id). Joined as bytes: kio cannot read back the start time of -1 that
    Kafka (and the brokers) send for a transaction that has not begun."""
    routes = r.ctx.forwarder.routes
    ids = [str(t) for t in r.body.transactional_ids]
    by_broker: dict[int, list[str]] = {}
    for txn_id in ids:
        by_broker.setdefault(routes.transaction_coordinator(txn_id), []).append(txn_id)
    if len(by_broker) <= 1:
        return await _to_transaction(r, ids[0] if ids else "", r.frame)
    parts = list(by_broker.values())
    raws = await asyncio.gather(
        *(
            _to_transaction(
                r, part[0], _frame(r.call, dataclasses.replace(r.body, transactional_ids=part))
            )
            for part in parts
        )
    )
    return Raw(split.concat_flexible_lists([raw.body for raw in raws]))


async def _to_transaction(r: ProxyRequest, txn_id: str, frame: bytes | memoryview) -> Raw:
    return await _to_coordinator(r, RouteKey("transaction", txn_id), frame)


async def list_transactions(r: ProxyRequest) -> Answer:
    """Every broker's transactions (each lists the ones it coordinates), once each."""
    forwarder = r.ctx.forwarder
    brokers = sorted(forwarder.routes.view.brokers)
    outcomes = await asyncio.gather(
        *(forwarder.call_raw(r.pool, broker, r.frame) for broker in brokers),
        return_exceptions=True,
    )
    states: dict[str, Any] = {}
    unknown: list[str] = []
    code = ErrorCode.COORDINATOR_NOT_AVAILABLE
    for outcome in outcomes:
        if isinstance(outcome, UpstreamError):
            continue
        if isinstance(outcome, BaseException):
            raise outcome
        response = codec.decode_response(outcome, r.call.api_key, r.call.api_version)
        if int(response.error_code) == ErrorCode.NONE:
            code = ErrorCode.NONE
        unknown = [str(s) for s in response.unknown_state_filters]
        for state in response.transaction_states:
            states.setdefault(str(state.transactional_id), state)
    return {
        "throttle_time": 0,
        "error_code": code,
        "unknown_state_filters": unknown,
        "transaction_states": list(states.values()),
    }


# --- to any broker --------------------------------------------------------------------------


async def describe_configs(r: ProxyRequest) -> Answer:
    """Each resource to a broker that can answer it; the proxy's own broker resource from a
    live broker's description of itself (``configs``)."""
    me = r.identity
    resources = list(r.body.resources)
    targets = configs.plan(resources, me.node_id, r.ctx.forwarder.routes.view.brokers.keys())
    if all(target == configs.Target(configs.ANY) for target in targets):
        return await to_any_broker(r)
    by_broker: dict[int, list[int]] = {}
    for index, target in enumerate(targets):
        by_broker.setdefault(target.broker, []).append(index)
    answers = await asyncio.gather(
        *(
            _describe_at(r, broker, [(resources[i], targets[i].as_proxy) for i in indexes])
            for broker, indexes in by_broker.items()
        )
    )
    results: list[Any] = [None] * len(resources)
    throttle = 0
    for indexes, response in zip(by_broker.values(), answers, strict=True):
        throttle = max(throttle, codec.millis(response.throttle_time))
        for index, result in zip(indexes, response.results, strict=True):
            if targets[index].as_proxy:
                result = configs.as_proxy(result, me.node_id, r.ctx.listener_configs)
            results[index] = result
    return {"throttle_time": throttle, "results": results}


async def _describe_at(r: ProxyRequest, broker: int, items: list[tuple[Any, bool]]) -> Any:
    """DescribeConfigs of (resource, names the proxy) at ``broker`` (``configs.ANY``: any live
    broker, the next one if it cannot be reached); the parsed answer. Raises UpstreamError."""
    forwarder = r.ctx.forwarder
    routes = forwarder.routes
    refused: set[int] = set()
    while True:
        target = broker if broker != configs.ANY else routes.any_broker(frozenset(refused))
        if target < 0 or target in refused:
            raise UpstreamError("no live broker answers DescribeConfigs")
        asked = [configs.as_broker(res, target) if own else res for res, own in items]
        body = dataclasses.replace(r.body, resources=tuple(asked))
        try:
            raw = await forwarder.call_raw(r.pool, target, _frame(r.call, body))
        except UpstreamError:
            refused.add(target)
            continue
        return codec.decode_response(raw, r.call.api_key, r.call.api_version)


async def to_any_broker(r: ProxyRequest) -> Answer:
    forwarder = r.ctx.forwarder
    body, _ = await forwarder.routed(
        r.pool, r.call, r.frame, forwarder.routes.any_broker, forwarder.deadline(), frozenset()
    )
    return Raw(body)


def _frame(call: Call, body: Any) -> memoryview:
    encoded = codec.encode_request(call.api_key, call.api_version, 0, body, call.client_id)
    return memoryview(encoded)[4:]


HANDLERS: dict[int, Handler] = {
    0: produce,
    1: fetch,
    2: partitioned(split.LIST_OFFSETS),
    3: metadata,
    8: to_coordinator,  # OffsetCommit
    9: offset_fetch,
    10: find_coordinator,
    11: to_coordinator,  # JoinGroup
    12: to_coordinator,  # Heartbeat
    13: to_coordinator,  # LeaveGroup
    14: to_coordinator,  # SyncGroup
    15: by_coordinator(DESCRIBE_GROUPS),
    16: list_groups,
    17: sasl_handshake_here,
    18: api_versions,
    19: to_any_broker,  # CreateTopics
    20: to_any_broker,  # DeleteTopics
    21: partitioned(split.DELETE_RECORDS),
    22: to_transaction_coordinator,  # InitProducerId (any broker without transactional id)
    23: partitioned(split.OFFSET_FOR_LEADER_EPOCH),
    24: to_transaction_coordinator,  # AddPartitionsToTxn
    25: to_transaction_coordinator,  # AddOffsetsToTxn
    26: to_transaction_coordinator,  # EndTxn
    27: write_txn_markers,  # split by partition owner, marker by marker
    28: to_coordinator,  # TxnOffsetCommit: the group's coordinator
    29: to_any_broker,  # DescribeAcls
    30: to_any_broker,  # CreateAcls
    31: to_any_broker,  # DeleteAcls
    32: describe_configs,
    33: to_any_broker,  # AlterConfigs (topics: broker configs are static everywhere)
    34: alter_replica_log_dirs,  # split by partition owner
    35: describe_log_dirs,
    36: sasl_authenticate_here,
    37: to_any_broker,  # CreatePartitions
    38: delegation_token_api,  # CreateDelegationToken
    39: delegation_token_api,  # RenewDelegationToken
    40: delegation_token_api,  # ExpireDelegationToken
    41: delegation_token_api,  # DescribeDelegationToken
    42: by_coordinator(DELETE_GROUPS),
    43: to_any_broker,  # ElectLeaders: the answer names no broker
    44: to_any_broker,  # IncrementalAlterConfigs
    45: alter_partition_reassignments,
    46: to_any_broker,  # ListPartitionReassignments: always empty
    47: to_coordinator,  # OffsetDelete
    48: to_any_broker,  # DescribeClientQuotas (read from etcd by the broker)
    49: to_any_broker,  # AlterClientQuotas (every broker enforces them from its watch)
    50: to_any_broker,  # DescribeUserScramCredentials
    51: to_any_broker,  # AlterUserScramCredentials
    57: to_any_broker,  # UpdateFeatures: every broker finalizes the same levels
    60: describe_cluster,
    61: partitioned(split.DESCRIBE_PRODUCERS),  # split by partition owner too
    65: describe_transactions,
    66: list_transactions,
    68: to_coordinator,  # ConsumerGroupHeartbeat
    69: by_coordinator(CONSUMER_GROUP_DESCRIBE),
    76: to_coordinator,  # ShareGroupHeartbeat: its assignment names topic ids, valid anywhere
    77: by_coordinator(CONSUMER_GROUP_DESCRIBE),  # ShareGroupDescribe: the same fields
    78: share_fetch,  # split by owner, one upstream share session per owner (``share``)
    79: share_acknowledge,
    90: by_coordinator(OFFSET_FETCH_GROUPS),  # DescribeShareGroupOffsets
    91: to_coordinator,  # AlterShareGroupOffsets
    92: to_coordinator,  # DeleteShareGroupOffsets
    74: list_config_resources,
    75: describe_topic_partitions,
}
