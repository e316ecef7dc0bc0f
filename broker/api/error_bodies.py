"""What each API answers when a request fails as a whole, by API key: the error bodies, and the
failure shapes the handlers build them from (every partition with one code, a missing group...).

A request that decoded but failed (a KafkaError from its handler, an unexpected error, at the
proxy a broker it could not reach) is answered with its API's error body, never an empty
success. APIs whose response has a top-level error code and nothing else to echo get
``top_level_error``; those without one an empty result list (``no_results``), which clients
treat as every item failed. Pure functions, no handler and no I/O: the broker's dispatcher and
the proxy (``broker/proxy/dispatch.py``) both answer from here, so the proxy need not load the
broker's request handlers to fail a request as a broker would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kafscale.broker.groups.model import JoinResult, SyncResult
from kafscale.broker.protocol.errors import ErrorCode

Body = dict[str, Any]
ErrorBody = Callable[[Any, ErrorCode], Body]
TopicPartition = tuple[str, int]
NO_TIMESTAMP = -1
AUTHORIZED_OPERATIONS_OMITTED = -2147483648
"""Kafka's "not asked for" value of an ``authorized_operations`` field."""


def top_level_error(_request: Any, code: ErrorCode) -> Body:
    return {"error_code": code}


def no_results(field: str) -> ErrorBody:
    """The error body of an API whose response has no top-level error code: an empty result
    list, which clients treat as every item failed (the error itself is logged)."""

    def build(_request: Any, _code: ErrorCode) -> Body:
        return {"throttle_time": 0, field: []}

    return build


def metadata_error_body(_request: Any, _code: ErrorCode) -> Body:
    return {"brokers": [], "topics": []}


# --- produce -----------------------------------------------------------------------------------


def every_partition_failed(request: Any, code: ErrorCode) -> Body:
    return {
        "responses": [
            {
                "name": topic.name,
                "partition_responses": [
                    {
                        "index": p.index,
                        "error_code": code,
                        "base_offset": -1,
                        "log_append_time": NO_TIMESTAMP,
                    }
                    for p in topic.partition_data
                ],
            }
            for topic in request.topic_data
        ],
        "throttle_time": 0,
    }


def produce_error_body(request: Any, code: ErrorCode) -> Body:
    return every_partition_failed(request, code)


# --- fetch -------------------------------------------------------------------------------------


def fetch_error_body(request: Any, code: ErrorCode) -> Body:
    return {"throttle_time": 0, "error_code": code, "session_id": 0, "responses": []}


# --- group_offsets -----------------------------------------------------------------------------


def offset_commit_error_body(request: Any, code: ErrorCode) -> Body:
    topics = [
        {
            "name": t.name,
            "partitions": [
                {"partition_index": p.partition_index, "error_code": code} for p in t.partitions
            ],
        }
        for t in getattr(request, "topics", ())
    ]
    return {"throttle_time": 0, "topics": topics}


def offset_fetch_error_body(request: Any, code: ErrorCode) -> Body:
    groups = [
        {"group_id": g.group_id, "error_code": code, "topics": []}
        for g in getattr(request, "groups", ())
    ]
    return {"throttle_time": 0, "error_code": code, "topics": [], "groups": groups}


# --- coordinators ------------------------------------------------------------------------------


def find_coordinator_error_body(request: Any, code: ErrorCode) -> Body:
    keys = list(getattr(request, "coordinator_keys", ()) or ())
    coordinators = [
        {"key": k, "node_id": -1, "host": "", "port": -1, "error_code": code} for k in keys
    ]
    return {
        "throttle_time": 0,
        "error_code": code,
        "node_id": -1,
        "host": "",
        "port": -1,
        "coordinators": coordinators,
    }


# --- groups ------------------------------------------------------------------------------------


def join_group_body(result: JoinResult) -> Body:
    return {
        "throttle_time": 0,
        "error_code": result.error,
        "generation_id": result.generation_id,
        "protocol_type": result.protocol_type,
        "protocol_name": result.protocol_name,
        "leader": result.leader_id,
        "skip_assignment": result.skip_assignment,
        "member_id": result.member_id,
        "members": [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "metadata": m.metadata,
            }
            for m in result.members
        ],
    }


def join_group_error_body(request: Any, code: ErrorCode) -> Body:
    return join_group_body(JoinResult(code, str(getattr(request, "member_id", ""))))


def sync_group_body(result: SyncResult) -> Body:
    return {
        "throttle_time": 0,
        "error_code": result.error,
        "protocol_type": result.protocol_type,
        "protocol_name": result.protocol_name,
        "assignment": result.assignment,
    }


def sync_group_error_body(_request: Any, code: ErrorCode) -> Body:
    return sync_group_body(SyncResult(code))


def describe_groups_error_body(request: Any, code: ErrorCode) -> Body:
    groups = [
        {
            "error_code": code,
            "group_id": g,
            "group_state": "",
            "protocol_type": "",
            "protocol_data": "",
            "members": [],
            "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
        }
        for g in getattr(request, "groups", ())
    ]
    return {"throttle_time": 0, "groups": groups}


def delete_groups_error_body(request: Any, code: ErrorCode) -> Body:
    names = getattr(request, "groups_names", ())
    return {"throttle_time": 0, "results": [{"group_id": g, "error_code": code} for g in names]}


# --- transactions ------------------------------------------------------------------------------


def add_partitions_results(codes: dict[TopicPartition, ErrorCode]) -> list[Body]:
    by_topic: dict[str, list[Body]] = {}
    for (topic, partition), code in codes.items():
        by_topic.setdefault(topic, []).append(
            {"partition_index": partition, "partition_error_code": code}
        )
    return [{"name": name, "results_by_partition": parts} for name, parts in by_topic.items()]


def add_partitions_error_body(request: Any, code: ErrorCode) -> Body:
    topics = getattr(request, "v3_and_below_topics", None)
    if topics is None:  # v4+: the batched form has a top-level error code
        return {"throttle_time": 0, "error_code": code, "results_by_transaction": []}
    codes = {(str(t.name), int(p)): code for t in topics for p in t.partitions}
    return {"throttle_time": 0, "results_by_topic_v3_and_below": add_partitions_results(codes)}


def txn_offset_commit_error_body(request: Any, code: ErrorCode) -> Body:
    topics = [
        {
            "name": t.name,
            "partitions": [{"partition_index": p.partition_index, "error_code": code}
                           for p in t.partitions],
        }
        for t in request.topics
    ]  # fmt: skip
    return {"throttle_time": 0, "topics": topics}


def describe_transactions_error_body(request: Any, code: ErrorCode) -> Body:
    states = [
        {"error_code": code, "transactional_id": t, "transaction_state": "",
         "transaction_timeout": 0, "transaction_start_time": -1, "producer_id": -1,
         "producer_epoch": -1, "topics": []}
        for t in request.transactional_ids
    ]  # fmt: skip
    return {"throttle_time": 0, "transaction_states": states}


# --- acls --------------------------------------------------------------------------------------


def create_acls_error_body(request: Any, code: ErrorCode) -> Body:
    creations = getattr(request, "creations", ())
    return {"throttle_time": 0, "results": [{"error_code": code} for _ in creations]}


def describe_acls_error_body(_request: Any, code: ErrorCode) -> Body:
    return {"throttle_time": 0, "error_code": code, "error_message": code.name, "resources": []}


def delete_acls_error_body(request: Any, code: ErrorCode) -> Body:
    filters = getattr(request, "filters", ())
    return {
        "throttle_time": 0,
        "filter_results": [
            {"error_code": code, "error_message": code.name, "matching_acls": []} for _ in filters
        ],
    }


# --- log_dirs ----------------------------------------------------------------------------------


def describe_log_dirs_error_body(_request: Any, code: ErrorCode) -> Body:
    return {"throttle_time": 0, "error_code": code, "results": []}


def requested_moves(request: Any) -> dict[TopicPartition, str]:
    """Each named partition with its destination dir; a partition named under two dirs goes to
    the last, as Kafka reads the request into one map."""
    moves: dict[TopicPartition, str] = {}
    for log_dir in request.dirs:
        for topic in log_dir.topics:
            for index in topic.partitions:
                moves[(str(topic.name), int(index))] = str(log_dir.path)
    return moves


def alter_results_body(codes: Mapping[TopicPartition, ErrorCode]) -> Body:
    """The response: per topic (in the order first named), its partitions' codes."""
    by_topic: dict[str, list[Body]] = {}
    for (topic, index), code in codes.items():
        by_topic.setdefault(topic, []).append({"partition_index": index, "error_code": code})
    return {
        "throttle_time": 0,
        "results": [{"topic_name": name, "partitions": parts} for name, parts in by_topic.items()],
    }


def alter_replica_log_dirs_error_body(request: Any, code: ErrorCode) -> Body:
    """Every named partition with the error (Kafka's ``getErrorResponse``)."""
    return alter_results_body(dict.fromkeys(requested_moves(request), code))


# --- replicas ----------------------------------------------------------------------------------


def elect_leaders_error_body(request: Any, code: ErrorCode) -> Body:
    """Every named partition with the error, and the error at the top from v1 (Kafka's
    ``getErrorResponse``)."""
    results = [
        {
            "topic": str(t.topic),
            "partition_result": [
                {"partition_id": int(p), "error_code": code, "error_message": None}
                for p in t.partitions
            ],
        }
        for t in request.topic_partitions or ()
    ]
    return {"throttle_time": 0, "error_code": code, "replica_election_results": results}


def alter_reassignments_error_body(request: Any, code: ErrorCode) -> Body:
    """Every named partition with the error, and the error at the top."""
    return {
        "throttle_time": 0,
        "allow_replication_factor_change": bool(
            getattr(request, "allow_replication_factor_change", True)
        ),
        "error_code": code,
        "error_message": None,
        "responses": [
            {
                "name": str(t.name),
                "partitions": [
                    {
                        "partition_index": int(p.partition_index),
                        "error_code": code,
                        "error_message": None,
                    }
                    for p in t.partitions
                ],
            }
            for t in request.topics
        ],
    }


# --- offset_delete -----------------------------------------------------------------------------


def offset_delete_group_error(code: ErrorCode) -> Body:
    return {"error_code": code, "throttle_time": 0, "topics": []}


def offset_delete_error_body(_request: Any, code: ErrorCode) -> Body:
    return offset_delete_group_error(code)


# --- feature_updates ---------------------------------------------------------------------------


def update_features_failure(code: ErrorCode, message: str | None) -> Body:
    """A failed request: the top-level error alone, no per-feature results (Kafka's
    ``UpdateFeaturesResponse.createWithErrors``)."""
    return {"throttle_time": 0, "error_code": code, "error_message": message, "results": []}


def update_features_error_body(_request: Any, code: ErrorCode) -> Body:
    return update_features_failure(code, None)


# --- topic_partitions --------------------------------------------------------------------------


def describe_topic_partitions_error_body(request: Any, code: ErrorCode) -> Body:
    """Every named topic with the error (Kafka's ``getErrorResponse``)."""
    return {
        "throttle_time": 0,
        "topics": [
            {"error_code": code, "name": str(t.name), "partitions": []} for t in request.topics
        ],
    }


# --- txn_partitions ----------------------------------------------------------------------------


def write_txn_markers_error_body(request: Any, code: ErrorCode) -> Body:
    """Every partition of every marker failed with ``code``."""
    return {
        "markers": [
            {
                "producer_id": int(marker.producer_id),
                "topics": [
                    {
                        "name": topic.name,
                        "partitions": [
                            {"partition_index": int(i), "error_code": code}
                            for i in topic.partition_indexes
                        ],
                    }
                    for topic in marker.topics
                ],
            }
            for marker in request.markers
        ]
    }


# --- consumer_groups ---------------------------------------------------------------------------


def consumer_group_heartbeat_error_body(request: Any, code: ErrorCode) -> Body:
    return {
        "throttle_time": 0,
        "error_code": code,
        "member_id": None,
        "member_epoch": 0,
        "heartbeat_interval": 0,
    }


def missing_group(group_id: str, code: ErrorCode, message: str | None, operations: int) -> Body:
    return {
        "error_code": code,
        "error_message": message,
        "group_id": group_id,
        "group_state": "Dead" if code is ErrorCode.GROUP_ID_NOT_FOUND else "",
        "group_epoch": -1,
        "assignment_epoch": -1,
        "assignor_name": "",
        "members": [],
        "authorized_operations": operations,
    }


def consumer_group_describe_error_body(request: Any, code: ErrorCode) -> Body:
    groups = [missing_group(g, code, None, -2147483648) for g in getattr(request, "group_ids", ())]
    return {"throttle_time": 0, "groups": groups}


# --- share_groups ------------------------------------------------------------------------------


def share_group_describe_error_body(request: Any, code: ErrorCode) -> Body:
    groups = [missing_group(g, code, None, -2147483648) for g in getattr(request, "group_ids", ())]
    return {"throttle_time": 0, "groups": groups}


# --- share_fetch -------------------------------------------------------------------------------


def share_fetch_error_body(request: Any, code: ErrorCode, message: str | None = None) -> Body:
    return {
        "throttle_time": 0,
        "error_code": code,
        "error_message": message,
        "acquisition_lock_timeout": 0,
        "responses": [],
        "node_endpoints": [],
    }


# --- share_offsets -----------------------------------------------------------------------------


def share_offsets_group_error(group_id: str, code: ErrorCode, message: str | None) -> Body:
    return {"group_id": group_id, "topics": [], "error_code": code, "error_message": message}


def describe_share_group_offsets_error_body(request: Any, code: ErrorCode) -> Body:
    groups = [
        share_offsets_group_error(str(g.group_id), code, None)
        for g in getattr(request, "groups", ())
    ]
    return {"throttle_time": 0, "groups": groups}


def alter_share_group_offsets_error_body(
    request: Any, code: ErrorCode, message: str | None = None
) -> Body:
    return {"throttle_time": 0, "error_code": code, "error_message": message, "responses": []}


def delete_share_group_offsets_error_body(
    request: Any, code: ErrorCode, message: str | None = None
) -> Body:
    return {"throttle_time": 0, "error_code": code, "error_message": message, "responses": []}


# --- client_quotas -----------------------------------------------------------------------------


def describe_quotas_failed(code: ErrorCode, message: str) -> Body:
    return {"throttle_time": 0, "error_code": code, "error_message": message, "entries": None}


def describe_client_quotas_error_body(_request: Any, code: ErrorCode) -> Body:
    return describe_quotas_failed(code, code.name.replace("_", " ").capitalize())


def alter_client_quotas_error_body(request: Any, code: ErrorCode) -> Body:
    """Every entry of the request failed with ``code`` (an authorization failure)."""
    message = code.name.replace("_", " ").capitalize()
    return {
        "throttle_time": 0,
        "entries": [
            {"error_code": code, "error_message": message, "entity": raw_quota_entity(entry)}
            for entry in request.entries
        ],
    }


def raw_quota_entity(entry: Any) -> list[Body]:
    return [{"entity_type": e.entity_type, "entity_name": e.entity_name} for e in entry.entity]


# --- scram_users -------------------------------------------------------------------------------


def scram_user_result(user: str, code: ErrorCode, message: str | None) -> Body:
    return {"user": user, "error_code": code, "error_message": message, "credential_infos": []}


def scram_error_message(code: ErrorCode) -> str:
    return code.name.replace("_", " ").capitalize()


def describe_scram_error_body(request: Any, code: ErrorCode) -> Body:
    """The whole request failed with ``code``. Kafka sets it at the top and in one result per
    user named; here the users carry it and the top level stays NONE when users were named:
    confluent-kafka 2.16 raises the top-level error and then frees memory twice (the process
    aborts). Clients read a per-user error the same way (the Java client too)."""
    message = scram_error_message(code)
    if not request.users:
        return {"throttle_time": 0, "error_code": code, "error_message": message, "results": []}
    names = dict.fromkeys(u.name for u in request.users)
    results = [scram_user_result(n, code, message) for n in names]
    return {"throttle_time": 0, "error_code": ErrorCode.NONE, "results": results}


def alter_scram_error_body(request: Any, code: ErrorCode) -> Body:
    """Every user of the request failed with ``code`` (an authorization failure)."""
    users = [d.name for d in request.deletions] + [u.name for u in request.upsertions]
    message = scram_error_message(code)
    results = [
        {"user": u, "error_code": code, "error_message": message} for u in dict.fromkeys(users)
    ]
    return {"throttle_time": 0, "results": results}


# ShareGroupHeartbeat's error answer has ConsumerGroupHeartbeat's fields.
share_group_heartbeat_error_body = consumer_group_heartbeat_error_body
# ShareAcknowledge's response has ShareFetch's top-level fields: the same error body.
share_acknowledge_error_body = share_fetch_error_body


ERROR_BODIES: Mapping[int, ErrorBody] = {
    0: produce_error_body,
    1: fetch_error_body,
    2: no_results("topics"),
    3: metadata_error_body,
    8: offset_commit_error_body,
    9: offset_fetch_error_body,
    10: find_coordinator_error_body,
    11: join_group_error_body,
    14: sync_group_error_body,
    15: describe_groups_error_body,
    19: no_results("topics"),
    20: no_results("responses"),
    21: no_results("topics"),
    23: no_results("topics"),
    24: add_partitions_error_body,
    27: write_txn_markers_error_body,
    28: txn_offset_commit_error_body,
    29: describe_acls_error_body,
    30: create_acls_error_body,
    31: delete_acls_error_body,
    32: no_results("results"),
    33: no_results("responses"),
    34: alter_replica_log_dirs_error_body,
    35: describe_log_dirs_error_body,
    37: no_results("results"),
    42: delete_groups_error_body,
    43: elect_leaders_error_body,
    44: no_results("responses"),
    45: alter_reassignments_error_body,
    47: offset_delete_error_body,
    48: describe_client_quotas_error_body,
    49: alter_client_quotas_error_body,
    50: describe_scram_error_body,
    51: alter_scram_error_body,
    57: update_features_error_body,
    61: no_results("topics"),
    65: describe_transactions_error_body,
    68: consumer_group_heartbeat_error_body,
    69: consumer_group_describe_error_body,
    75: describe_topic_partitions_error_body,
    76: share_group_heartbeat_error_body,
    77: share_group_describe_error_body,
    78: share_fetch_error_body,
    79: share_acknowledge_error_body,
    90: describe_share_group_offsets_error_body,
    91: alter_share_group_offsets_error_body,
    92: delete_share_group_offsets_error_body,
}
"""Every API whose error body is not ``top_level_error``."""


def error_body_of(api_key: int) -> ErrorBody:
    return ERROR_BODIES.get(api_key, top_level_error)
