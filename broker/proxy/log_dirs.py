"""DescribeLogDirs through the proxy: the brokers' answers as the one broker clients see.

Each broker reports one log dir (its store) with the partitions it owns. Behind one proxy a
client sees one broker, which holds every partition: the proxy asks every live broker and joins
their answers per log dir name. Brokers of a cluster share one store, so that is one dir with
every owned partition in it; a partition that moved between two answers (a handoff) is given
once, from the first answer that has it. Pure: entities in, a response body out.

AlterReplicaLogDirs goes to the brokers too, each partition to its owner (the broker Metadata
names its leader, which answers it as a partition it hosts): ``split_moves`` cuts the request
into one per owner, keeping its dirs, and ``merge_moves`` gives the owners' answers back as one
broker's. A partition no broker is alive for (no broker is registered) gets what a broker
answers for a partition it does not host, in Kafka's order: LOG_DIR_NOT_FOUND for a path that
is no broker's dir name (the names brokers registered with, remembered by the proxy's view),
UNKNOWN_TOPIC_OR_PARTITION for a topic or partition etcd does not have, else
REPLICA_NOT_AVAILABLE (``orphan_codes``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from kafscale.broker.api.error_bodies import alter_results_body, requested_moves
from kafscale.broker.api.log_dirs import alter_result
from kafscale.broker.protocol.errors import ErrorCode

Body = dict[str, Any]


def merge_log_dirs(responses: Iterable[Any]) -> Body:
    """One DescribeLogDirs response body from the brokers' parsed responses (any version)."""
    dirs: dict[str, Body] = {}
    partitions: dict[str, dict[tuple[str, int], Body]] = {}
    errors: list[ErrorCode] = []
    answered = False
    for response in responses:
        code = ErrorCode(int(getattr(response, "error_code", ErrorCode.NONE)))
        if code is not ErrorCode.NONE:
            errors.append(code)
            continue
        answered = True
        for result in response.results:
            name = str(result.log_dir)
            merged = dirs.setdefault(name, _empty_dir(result))
            if merged["error_code"] == ErrorCode.NONE:
                merged["error_code"] = ErrorCode(int(result.error_code))
            kept = partitions.setdefault(name, {})
            for topic in result.topics:
                for p in topic.partitions:
                    kept.setdefault((str(topic.name), int(p.partition_index)), _partition(p))
    for name, merged in dirs.items():
        merged["topics"] = _topics(partitions[name])
    error = ErrorCode.NONE if answered or not errors else errors[0]
    return {"throttle_time": 0, "error_code": error, "results": list(dirs.values())}


def _empty_dir(result: Any) -> Body:
    return {
        "error_code": ErrorCode.NONE,
        "log_dir": str(result.log_dir),
        "topics": [],
        "total_bytes": int(getattr(result, "total_bytes", -1)),
        "usable_bytes": int(getattr(result, "usable_bytes", -1)),
    }


def _partition(p: Any) -> Body:
    return {
        "partition_index": int(p.partition_index),
        "partition_size": int(p.partition_size),
        "offset_lag": int(p.offset_lag),
        "is_future_key": bool(p.is_future_key),
    }


def _topics(partitions: dict[tuple[str, int], Body]) -> list[Body]:
    by_topic: dict[str, list[Body]] = {}
    for (topic, _), body in sorted(partitions.items()):
        by_topic.setdefault(topic, []).append(body)
    return [{"name": name, "partitions": parts} for name, parts in by_topic.items()]


# --- AlterReplicaLogDirs ------------------------------------------------------------------------

TopicPartition = tuple[str, int]
OwnerOf = Callable[[TopicPartition], int]


def split_moves(request: Any, owner_of: OwnerOf) -> tuple[dict[int, Any], list[TopicPartition]]:
    """Per owning broker, the request cut to the partitions it owns (dirs, topics and their
    order kept); and the partitions no broker is alive for (``owner_of`` gives -1)."""
    cut: dict[int, dict[int, dict[str, list[Any]]]] = {}
    orphans: list[TopicPartition] = []
    for d, log_dir in enumerate(request.dirs):
        for topic in log_dir.topics:
            name = str(topic.name)
            for index in topic.partitions:
                owner = owner_of((name, int(index)))
                if owner < 0:
                    orphans.append((name, int(index)))
                    continue
                cut.setdefault(owner, {}).setdefault(d, {}).setdefault(name, []).append(index)
    return {owner: _cut_request(request, dirs) for owner, dirs in cut.items()}, orphans


def _cut_request(request: Any, dirs: dict[int, dict[str, list[Any]]]) -> Any:
    kept = []
    for d, topics in dirs.items():
        log_dir = request.dirs[d]
        named = {str(t.name): t for t in log_dir.topics}
        kept.append(
            dataclasses.replace(
                log_dir,
                topics=tuple(
                    dataclasses.replace(named[name], partitions=tuple(parts))
                    for name, parts in topics.items()
                ),
            )
        )
    return dataclasses.replace(request, dirs=tuple(kept))


def orphan_codes(
    request: Any,
    orphans: Iterable[TopicPartition],
    dir_names: Collection[str],
    counts: Mapping[str, int],
) -> dict[TopicPartition, ErrorCode]:
    """The answers for partitions no broker is alive for, as a broker with one of
    ``dir_names`` answers for a partition it does not host (``counts``: the topics' partition
    counts). No name known (no broker ever seen): the path cannot be checked, only the topic."""
    paths = requested_moves(request)
    codes = {}
    for tp in orphans:
        path = paths[tp]
        if dir_names and path not in dir_names:
            codes[tp] = ErrorCode.LOG_DIR_NOT_FOUND
        else:
            codes[tp] = alter_result(path, path, counts, tp, hosted=False)
    return codes


def merge_moves(
    request: Any, responses: Iterable[Any], orphans: Mapping[TopicPartition, ErrorCode]
) -> Body:
    """The owners' answers as one broker's, in the order the client named the partitions;
    ``orphans``: the answers for partitions no broker is alive for (``orphan_codes``)."""
    codes: dict[TopicPartition, ErrorCode] = dict(orphans)
    for response in responses:
        for topic in response.results:
            for p in topic.partitions:
                codes[(str(topic.topic_name), int(p.partition_index))] = ErrorCode(
                    int(p.error_code)
                )
    return alter_results_body(
        {tp: codes.get(tp, ErrorCode.REPLICA_NOT_AVAILABLE) for tp in requested_moves(request)}
    )
